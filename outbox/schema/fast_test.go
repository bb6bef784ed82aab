package schema

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// fastSchemas exercise every keyword of the fast path's subset, and some
// outside it.
var fastSchemas = []string{
	`{"type": "object", "required": ["seq", "data"],
	  "properties": {"seq": {"type": "integer", "minimum": 1}, "data": {"type": "string", "maxLength": 65536}}}`,
	`{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "required": ["id", "lines"],
	  "properties": {
	    "id": {"type": "string", "minLength": 2, "maxLength": 4, "format": "uuid"},
	    "status": {"enum": ["new", "paid"]},
	    "kind": {"const": "order"},
	    "total": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]{2})?$"},
	    "n": {"type": ["integer", "null"], "exclusiveMinimum": -3, "maximum": 9007199254740993},
	    "x": {"type": "number", "minimum": 0.1, "exclusiveMaximum": 1e3},
	    "big": {"minimum": 1e400},
	    "lines": {"type": "array", "minItems": 1, "maxItems": 3,
	      "items": {"type": "object", "required": ["sku"], "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}}}},
	    "free": true,
	    "never": false,
	    "ref": {"$ref": "#/$defs/d"},
	    "nested": {"properties": {"deep": {"type": "boolean"}}, "required": ["deep"]}
	  },
	  "$defs": {"d": {"type": "string"}}}`,
	`{"type": ["array", "string"], "items": {"type": "number", "minimum": 0}, "minLength": 1}`,
	`{"$schema": "http://json-schema.org/draft-07/schema#", "type": "string", "format": "email"}`,
	`{"type": "object", "additionalProperties": false, "properties": {"a": {}}}`,
	`{"required": ["a", "b"], "properties": {"b": {"type": "integer", "minimum": 1.5}}}`,
	`true`,
	`{"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "required": ["v"],
	  "properties": {"v": {"type": "integer", "maximum": 9}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}}`,
	`{"properties": {"a": {"$ref": "#/$defs/x", "minimum": 1}, "b": {"$ref": "other.json"}, "c": {"$ref": "#/$defs/y"}}, "$defs": {"x": true, "y": {"$ref": "#/$defs/x"}}}`,
}

// fastPayloads are the seeds of FuzzFastPath and the cases of
// TestFastPathAgrees.
var fastPayloads = []string{
	`{"seq": 12345, "data": "0123456789abcdef"}`,
	`{"data": "x", "seq": 1, "seq": 2}`,
	`{"seq": 0, "data": "x"}`, `{"seq": 1.0, "data": "x"}`, `{"seq": 1e2, "data": "x"}`, `{"seq": "1", "data": "x"}`,
	`{"seq": 1}`, `{"se\u0071": 1, "data": "x"}`, `{"seq": 1, "data": "\u00e9\ud83d\ude00"}`, `{"seq": 1, "data": "é"}`,
	`{"id": "ab", "lines": [{"sku": "a"}]}`,
	`{"id": "abcd", "lines": [{"sku": "a", "qty": 2}, {"sku": "b"}], "status": "paid", "kind": "order", "total": "9.90", "n": null, "x": 0.5}`,
	`{"id": "a", "lines": [{"sku": "a"}]}`, `{"id": "abcde", "lines": [{"sku": "a"}]}`, `{"id": "日本語", "lines": [{"sku": "a"}]}`,
	`{"id": "\"\"", "lines": [{"sku": "a"}]}`, `{"id": "ab", "lines": []}`, `{"id": "ab", "lines": [{}, {}, {}, {}]}`,
	`{"id": "ab", "lines": [{"sku": "a"}], "status": "old"}`, `{"id": "ab", "lines": [{"sku": "a"}], "status": 1}`,
	`{"id": "ab", "lines": [{"sku": "a"}], "kind": "orde\u0072"}`, `{"id": "ab", "lines": [{"sku": "a"}], "total": "9.9"}`,
	`{"id": "ab", "lines": [{"sku": "a"}], "n": -3}`, `{"id": "ab", "lines": [{"sku": "a"}], "n": -2}`,
	`{"id": "ab", "lines": [{"sku": "a"}], "n": 9007199254740993}`, `{"id": "ab", "lines": [{"sku": "a"}], "n": 9007199254740994}`,
	`{"id": "ab", "lines": [{"sku": "a"}], "x": 0.1}`, `{"id": "ab", "lines": [{"sku": "a"}], "x": 0.10000000000000001}`,
	`{"id": "ab", "lines": [{"sku": "a"}], "x": 999.99}`, `{"id": "ab", "lines": [{"sku": "a"}], "x": 1000}`,
	`{"id": "ab", "lines": [{"sku": "a"}], "big": 1}`, `{"id": "ab", "lines": [{"sku": "a"}], "free": [1, {"a": null}]}`,
	`{"id": "ab", "lines": [{"sku": "a"}], "never": 1}`, `{"id": "ab", "lines": [{"sku": "a"}], "ref": "r"}`,
	`{"id": "ab", "lines": [{"sku": "a"}], "nested": {"deep": true}}`, `{"id": "ab", "lines": [{"sku": "a"}], "nested": {}}`,
	`{"id": "ab", "lines": [{"sku": "a"}], "nested": 3}`,
	`[0, 1.5, 2e3]`, `[-1]`, `"s"`, `""`, `{"a": 1, "b": 2}`, `{"b": 1}`, `{"a": 1, "b": 1.5}`, `{"a": 1, "b": 2.0}`,
	`{"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 9}]}]}`, `{"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 10}]}]}`,
	`{"v": 1, "kids": [{}]}`, `{"a": 1}`, `{"a": 0}`, `{"b": 1}`, `{"c": 1}`, `{"d": 1}`,
	`null`, `true`, `-0`, `"a@b.c"`, `"not an email"`, `{"seq": 1, "data": "x"} x`, `{"seq": 1, "data": "x"`, ``, ` `,
	`{"seq": 1, "data": "\x"}`, "{\"seq\": 1, \"data\": \"\x01\"}", "{\"seq\": 1, \"data\": \"\xff\"}", `[1,]`, `01`,
}

// validByLibrary is what Set.Validate answers without the fast path.
func validByLibrary(t *testing.T, sch *jsonschema.Schema, payload []byte) bool {
	doc, err := decode(payload)
	if err != nil {
		return false
	}
	err = validateDoc(sch, doc)
	var verr *jsonschema.ValidationError
	if err != nil && !errors.As(err, &verr) && !errors.Is(err, errValidatorPanic) {
		t.Fatalf("validate %q: %v", payload, err)
	}
	return err == nil
}

type fastCase struct {
	text string
	sch  *jsonschema.Schema
	fast *fastNode
}

func compileBoth(t testing.TB) []fastCase { return compileTexts(t, fastSchemas) }

// compileTexts compiles each schema text for the library and the fast
// path, with no file: a $ref to mem:///other.json reaches the library
// only.
func compileTexts(t testing.TB, texts []string) []fastCase {
	var out []fastCase
	for i, text := range texts {
		doc, err := fastDoc([]byte(text))
		if err != nil {
			t.Fatalf("schema %d: %v", i, err)
		}
		c := jsonschema.NewCompiler()
		if err := c.AddResource("mem:///s.json", doc); err != nil {
			t.Fatalf("schema %d: %v", i, err)
		}
		if err := c.AddResource("mem:///other.json", map[string]any{"type": "integer"}); err != nil {
			t.Fatal(err)
		}
		sch, err := c.Compile("mem:///s.json")
		if err != nil {
			t.Fatalf("schema %d: %v", i, err)
		}
		out = append(out, fastCase{text, sch, compileFast(doc, "")})
	}
	return out
}

// FuzzFastPath holds the fast path to the library: a payload it accepts,
// the library accepts.
func FuzzFastPath(f *testing.F) {
	for _, p := range fastPayloads {
		f.Add([]byte(p))
	}
	texts := append([]string(nil), fastSchemas...)
	for _, e := range fastEdges {
		texts = append(texts, e.schema)
		for p := range e.payloads {
			f.Add([]byte(p))
		}
	}
	cases := compileTexts(f, texts)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, c := range cases {
			if c.fast != nil && c.fast.valid(b) && !validByLibrary(t, c.sch, b) {
				t.Fatalf("fast path accepts %q, the library refuses it, schema %s", b, c.text)
			}
		}
	})
}

// TestFastPathAgrees checks that the fast path accepts the payloads the
// library accepts, except the ones it must leave to the library, and
// nothing the library refuses.
func TestFastPathAgrees(t *testing.T) {
	// Valid payloads the fast path cannot prove valid, by schema index.
	leftToLibrary := map[int][]string{
		0: {`{"seq": 1.0, "data": "x"}`, `{"seq": 1e2, "data": "x"}`, `{"se\u0071": 1, "data": "x"}`},
		1: {
			`{"id": "\"\"", "lines": [{"sku": "a"}]}`,                         // escapes and minLength: only a bound on the length
			`{"id": "ab", "lines": [{"sku": "a"}], "kind": "orde\u0072"}`,     // escapes and const
			`{"id": "ab", "lines": [{"sku": "a"}], "x": 0.1}`,                 // at the bound, which float64 cannot compare exactly
			`{"id": "ab", "lines": [{"sku": "a"}], "x": 0.10000000000000001}`, // rounds to the bound
			`{"id": "ab", "lines": [{"sku": "a"}], "big": 1}`,                 // a bound beyond float64
		},
		5: {`{"a": 1, "b": 2.0}`},
		// $ref beside a constraint, to a file a schema with no file cannot
		// resolve, or to a $ref
		8: {`{"a": 1}`, `{"b": 1}`, `{"b": 1.5}`, `{"a": 1, "b": 1.5}`, `{"a": 1, "b": 2}`, `{"a": 1, "b": 2.0}`, `{"a": 0}`, `{"c": 1}`, `{"se\u0071": 1, "data": "x"}`},
	}
	cases := compileBoth(t)
	for _, i := range []int{3, 4} {
		if cases[i].fast != nil {
			t.Errorf("schema %d is outside the subset, but has a fast path", i)
		}
	}
	accepted := 0
	for i, c := range cases {
		if c.fast == nil {
			continue
		}
		for _, p := range fastPayloads {
			lib, fast := validByLibrary(t, c.sch, []byte(p)), c.fast.valid([]byte(p))
			switch {
			case fast && !lib:
				t.Errorf("schema %d: fast path accepts %q, the library refuses it", i, p)
			case lib && !fast && !contains(leftToLibrary[i], p):
				t.Errorf("schema %d: the library accepts %q, the fast path leaves it to the library", i, p)
			case lib && fast && contains(leftToLibrary[i], p):
				t.Errorf("schema %d: fast path accepts %q, which it cannot decide", i, p)
			case fast:
				accepted++
			}
		}
	}
	if accepted < 20 {
		t.Errorf("fast path accepted only %d payloads", accepted)
	}
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// TestLoadCompilesFastPath checks that Load gives the schemas of the
// subset a fast path, and that Validate still reports a refused payload
// with the library's error.
func TestLoadCompilesFastPath(t *testing.T) {
	s, err := Load("testdata/schemas")
	if err != nil {
		t.Fatal(err)
	}
	c := s.schemas[Key{"order.created", 2}]
	if c.fast == nil {
		t.Fatal("order.created v2 has no fast path")
	}
	// total is a $ref to _shared/money.json, a pattern.
	if !c.fast.valid([]byte(`{"order_id": 42, "total": "99.90", "lines": [{"sku": "a", "qty": 1}]}`)) {
		t.Fatal("fast path left a valid order to the library")
	}
	if c.fast.valid([]byte(`{"order_id": 42, "total": "99.9.0"}`)) {
		t.Fatal("fast path accepted a total that breaks _shared/money.json")
	}
	err = s.Validate("order.created", 2, []byte(`{"order_id": 42, "total": "1", "lines": [{"sku": "", "qty": 1}]}`))
	if err == nil || !strings.Contains(err.Error(), `at "/lines/0/sku", rule order.created/v2.json#/properties/lines/items/properties/sku/minLength`) {
		t.Fatalf("error %v", err)
	}
}

// TestFastPathRefFiles holds the fast path to the library for schemas
// whose $ref names another file: where the library resolves it (against
// an $id, an absolute path, a query) must be where the fast path looks,
// or the fast path must leave the payload to the library.
func TestFastPathRefFiles(t *testing.T) {
	dir := t.TempDir()
	abs := filepath.ToSlash(filepath.Join(dir, "_shared", "int.json"))
	files := map[string]string{
		// Of the files each $ref below could be taken to name, the one
		// the library resolves it to is "integer", the others "string".
		"_shared/int.json":       `{"type": "integer"}`,
		"_shared/str.json":       `{"type": "string"}`,
		"e.id/sub/x/int.json":    `{"type": "integer"}`,
		"e.id/x/int.json":        `{"type": "string"}`,
		"e.id/v1.json":           `{"$id": "sub/v1.json", "properties": {"a": {"$ref": "x/int.json"}}}`,
		"e.id/v2.json":           `{"properties": {"a": {"$id": "sub/", "properties": {"b": {"$ref": "x/int.json"}}}}}`,
		"e.id/v3.json":           `{"$defs": {"d": {"$id": "x/int.json", "type": "integer"}}, "properties": {"a": {"$ref": "x/int.json"}}}`,
		"e.abs/v1.json":          `{"properties": {"a": {"$ref": "` + abs + `"}}}`,
		"e.abs" + abs:            `{"type": "string"}`,
		"e.query/x/int.json":     `{"type": "integer"}`,
		"e.query/x/int.json?v=1": `{"type": "string"}`,
		"e.query/v1.json":        `{"properties": {"a": {"$ref": "x/int.json?v=1"}}}`,
		"e.dots/v1.json":         `{"properties": {"a": {"$ref": "./../_shared/./int.json"}}}`,
		"e.ref/v1.json":          `{"properties": {"a": {"$ref": "../_shared/int.json#"}}}`,
		"e.ref/v2.json":          `{"properties": {"a": {"$ref": "../_shared/str.json"}}}`,
	}
	writeFiles(t, dir, files)
	set, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for k, c := range set.schemas {
		if c.fast == nil {
			continue
		}
		for _, p := range []string{`{"a": 1}`, `{"a": "s"}`, `{"a": {"b": 1}}`, `{"a": {"b": "s"}}`} {
			if c.fast.valid([]byte(p)) && !validByLibrary(t, c.sch, []byte(p)) {
				t.Errorf("%s: fast path accepts %s, the library refuses it", k, p)
			}
		}
	}
	// The references filepath.Join does resolve as the library does keep
	// their fast path.
	for k, p := range map[Key]string{{"e.dots", 1}: `{"a": 1}`, {"e.ref", 1}: `{"a": 1}`, {"e.ref", 2}: `{"a": "s"}`} {
		if c := set.schemas[k]; c.fast == nil || !c.fast.valid([]byte(p)) {
			t.Errorf("%s: fast path leaves %s to the library", k, p)
		}
	}
}

// Outcomes of a payload in fastEdges.
const (
	fastOK  = iota // the fast path proves it valid
	libOK          // valid, but left to the library
	invalid        // the library refuses it (so the fast path must not accept it)
)

type fastEdge struct {
	schema   string
	payloads map[string]int
}

// fastEdges are JSON and JSON Schema corner cases, each schema with what
// becomes of its payloads; their schemas and payloads also feed
// FuzzFastPath. A schema outside the subset has only libOK and invalid
// payloads.
var fastEdges = []fastEdge{
	// Keys: repeated (the library keeps the last value), escaped, required.
	{`{"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}, "é": {"type": "string"}}}`, map[string]int{
		`{"a": 1}`: fastOK, `{"a": "x", "a": 1}`: libOK, `{"a": 1, "a": "x"}`: invalid, `{"a": 1, "a": 2}`: fastOK,
		`{"\u0061": 1}`: libOK, `{"\u0061": "x"}`: invalid, `{"a": 1, "\u0061": "x"}`: invalid, `{"b": 1}`: invalid,
		`{"a": 1, "é": "x"}`: fastOK, `{"a": 1, "é": 1}`: invalid, `{"a": 1, "\u00e9": 1}`: invalid, `{"a": 1, "e\u0301": 1}`: libOK,
		`{"a": 1, "e` + "\u0301" + `": 1}`: fastOK, `{}`: invalid, `[]`: invalid, `{"a": 1,}`: invalid, `{"a" 1}`: invalid,
		`{"a": 1} {}`: invalid, "\ufeff{\"a\": 1}": invalid, "{\"a\":\f1}": invalid, "\t{\r\n\"a\" :\n1 }\n": fastOK,
		`{a: 1}`: invalid, `{'a': 1}`: invalid, `{"a": 01}`: invalid, `{"a": 1e}`: invalid,
	}},
	// String lengths count code points of the unescaped text.
	{`{"type": "string", "minLength": 2, "maxLength": 3}`, map[string]int{
		`"ab"`: fastOK, `"日本"`: fastOK, `"日本語x"`: invalid, `"😀😀😀"`: fastOK, `"😀"`: invalid,
		`"\ud83d\ude00\ud83d\ude00"`: libOK, `"\ud83d\ude00"`: invalid, `"\ud83d"`: invalid, `"\ud83d\ud83d"`: libOK,
		`"\ud83dx"`: libOK, `"\n\n"`: libOK, `"\n\n\n\n"`: invalid, `"a\u00e9"`: libOK, `"\u0000\u0000"`: libOK,
		"\"a\xff\"": invalid, "\"a\xed\xa0\x80\"": invalid, "\"a\xc3\"": invalid, "\"a\x7f\"": fastOK, "\"a\tb\"": invalid,
		`"\u00"`: invalid, `"\U00e9"`: invalid, `"\'a"`: invalid, `"ab`: invalid, `ab`: invalid,
	}},
	{`{"maxLength": 1}`, map[string]int{`"\ud83d\ude00"`: libOK, `"\ud83d\ude01x"`: invalid, `"é"`: fastOK, `"\u00e9"`: libOK, `"\n"`: libOK, `1234`: fastOK}},
	{`{"maxLength": 0, "minLength": 0}`, map[string]int{`""`: fastOK, `"\u0000"`: invalid, `" "`: invalid}},
	// enum and const compare the unescaped text, byte for byte.
	{`{"enum": ["a\"b", "é", "", "\u0000"]}`, map[string]int{
		`"a\"b"`: libOK, `"é"`: fastOK, `"\u00e9"`: libOK, `"e` + "\u0301" + `"`: invalid, `""`: fastOK, `"\u0000"`: libOK,
		`"a"`: invalid, `null`: invalid, `["é"]`: invalid,
	}},
	{`{"const": "x"}`, map[string]int{`"x"`: fastOK, `"\u0078"`: libOK, `"\x"`: invalid, `"X"`: invalid, `1`: invalid}},
	{`{"enum": []}`, map[string]int{`""`: invalid, `1`: invalid}},
	{`{"enum": ["a", 1]}`, map[string]int{`"a"`: libOK, `1`: libOK, `1.0`: libOK, `2`: invalid}},
	{`{"const": null}`, map[string]int{`null`: libOK, `0`: invalid}},
	// pattern: Go's regexp on the unescaped text, unanchored.
	{`{"pattern": "^\\p{L}.$"}`, map[string]int{
		`"éx"`: fastOK, `"日😀"`: fastOK, `"1x"`: invalid, `"é"`: invalid, `"\u00e9x"`: libOK, `"é\n"`: invalid, `3`: fastOK,
	}},
	{`{"pattern": "b"}`, map[string]int{`"abc"`: fastOK, `"ac"`: invalid, `"a\u0062"`: libOK}},
	// Numbers: integer type, bounds at and around the edge, big ones.
	{`{"type": "integer", "minimum": -5, "exclusiveMaximum": 100}`, map[string]int{
		`99`: fastOK, `100`: invalid, `1e2`: invalid, `99.0`: libOK, `9.9e1`: libOK, `-5`: fastOK, `-6`: invalid, `-0`: fastOK,
		`-5.0`: libOK, `-5.5`: invalid, `0.5`: invalid, `1E1`: libOK, `99.99999999999999999999`: invalid, `"1"`: invalid,
		`-`: invalid, `+1`: invalid, `.5`: invalid, `1.`: invalid, `0x10`: invalid, `NaN`: invalid, `Infinity`: invalid,
		`100000000000000000000000000000`: invalid, `-100000000000000000000000000000`: invalid, `-000`: invalid,
	}},
	{`{"type": "number", "exclusiveMinimum": 0, "maximum": 1e2}`, map[string]int{
		`0`: invalid, `-0`: invalid, `0.0`: invalid, `1e-400`: libOK, `5e-324`: fastOK, `1e2`: libOK, `100`: libOK, `100.0`: libOK,
		`99.99999999999999`: fastOK, `99.999999999999999999999`: libOK, `100.00000000000000000001`: invalid, `1e400`: invalid,
		`0.1e3`: libOK, `1000e-1`: libOK, `true`: invalid,
	}},
	{`{"maximum": 9223372036854775807, "minimum": -9223372036854775808}`, map[string]int{
		`9223372036854775807`: libOK, `9223372036854775808`: invalid, `-9223372036854775808`: libOK, `-9223372036854775809`: invalid,
		`999999999999999999`: fastOK, `-999999999999999999`: fastOK, `1000000000000000000`: fastOK, `9.2e18`: fastOK,
		`18446744073709551616`: invalid, `"x"`: fastOK,
	}},
	// The library compares numbers as big.Rat, which takes no exponent
	// (less the fraction's digits) beyond a million.
	{`{"minimum": -1, "maximum": 9007199254740993}`, map[string]int{
		`1e1000001`: invalid, `0e10000000000000000000`: invalid, `0.0e-1000001`: libOK, `1e999999`: invalid, `0e999999`: libOK,
		`1e-999999`: libOK, `0e99999`: fastOK, `1e-99999`: fastOK, `0e+00000`: fastOK, `0.` + strings.Repeat("0", 1000) + `1`: libOK, `1.5e2`: fastOK, `0e0`: fastOK, `"1e1000001"`: fastOK,
	}},
	{`{"type": "number"}`, map[string]int{`1e1000001`: fastOK, `0e10000000000000000000`: fastOK}},
	{`{"uniqueItems": true}`, map[string]int{`[1e1000001, 1]`: libOK, `[1e2, 100]`: invalid}},
	{`{"minimum": 0.1}`, map[string]int{`0.1`: libOK, `0.09999999999999999999`: invalid, `0.1000000000000001`: fastOK, `1`: fastOK}},
	{`{"minimum": 1e308, "maximum": 1.7976931348623157e308}`, map[string]int{`1e308`: libOK, `1.5e308`: fastOK, `1.8e308`: invalid, `2e308`: invalid}},
	// Type sets, null, booleans, literals.
	{`{"type": ["string", "null"]}`, map[string]int{`null`: fastOK, `"x"`: fastOK, `0`: invalid, `nul`: invalid, `nulll`: invalid, `NULL`: invalid, `false`: invalid}},
	{`{"type": ["integer", "boolean"]}`, map[string]int{`true`: fastOK, `false`: fastOK, `1`: fastOK, `1.0`: libOK, `1.5`: invalid, `tru`: invalid, `truefalse`: invalid}},
	// Arrays.
	{`{"items": {"type": "integer"}, "minItems": 1, "maxItems": 2}`, map[string]int{
		`[1]`: fastOK, `[1, 2]`: fastOK, `[]`: invalid, `[1, 2, 3]`: invalid, `[1.0]`: libOK, `["1"]`: invalid, `[1,]`: invalid,
		`[,1]`: invalid, `[1 2]`: invalid, `{"0": "x"}`: fastOK, `[1]]`: invalid,
	}},
	{`{"items": false}`, map[string]int{`[]`: fastOK, `[1]`: invalid, `1`: fastOK}},
	{`{"uniqueItems": false, "items": true}`, map[string]int{`[1, 1]`: fastOK}},
	{`{"uniqueItems": true}`, map[string]int{`[1, 1]`: invalid, `[1, 1.0]`: invalid, `[1, 2]`: libOK}},
	{`{"prefixItems": [{"type": "string"}], "items": {"type": "integer"}}`, map[string]int{`["a", 1]`: libOK, `[1, 1]`: invalid, `["a", "b"]`: invalid}},
	{`{"contains": {"type": "string"}}`, map[string]int{`[1]`: invalid, `[1, "a"]`: libOK}},
	// Objects: keywords outside the subset leave every payload to the library.
	{`{"properties": {"a": true}, "additionalProperties": false}`, map[string]int{`{"a": 1}`: libOK, `{"b": 1}`: invalid}},
	{`{"additionalProperties": {"type": "string"}}`, map[string]int{`{"a": "x"}`: libOK, `{"a": 1}`: invalid}},
	{`{"additionalProperties": true, "properties": {"a": {"type": "string"}}}`, map[string]int{`{"a": "x", "b": 1}`: fastOK, `{"a": 1}`: invalid}},
	{`{"patternProperties": {"^x": {"type": "string"}}}`, map[string]int{`{"xa": 1}`: invalid, `{"a": 1}`: libOK}},
	{`{"propertyNames": {"maxLength": 1}}`, map[string]int{`{"ab": 1}`: invalid, `{"a": 1}`: libOK}},
	{`{"minProperties": 1}`, map[string]int{`{}`: invalid, `{"a": 1}`: libOK}},
	{`{"maxProperties": 1}`, map[string]int{`{"a": 1, "b": 2}`: invalid, `{"a": 1, "a": 2}`: libOK}},
	{`{"dependentRequired": {"a": ["b"]}}`, map[string]int{`{"a": 1}`: invalid, `{"a": 1, "b": 1}`: libOK}},
	{`{"dependentSchemas": {"a": {"required": ["b"]}}}`, map[string]int{`{"a": 1}`: invalid, `{}`: libOK}},
	{`{"if": {"required": ["a"]}, "then": {"required": ["b"]}, "else": false}`, map[string]int{`{"a": 1}`: invalid, `{"a": 1, "b": 1}`: libOK, `{}`: invalid}},
	{`{"properties": {"a": true}, "unevaluatedProperties": false}`, map[string]int{`{"b": 1}`: invalid, `{"a": 1}`: libOK}},
	{`{"unevaluatedItems": false}`, map[string]int{`[1]`: invalid, `[]`: libOK}},
	{`{"allOf": [{"type": "string"}]}`, map[string]int{`1`: invalid, `"a"`: libOK}},
	{`{"not": {"type": "string"}}`, map[string]int{`"a"`: invalid, `1`: libOK}},
	{`{"multipleOf": 0.1}`, map[string]int{`0.3`: libOK, `0.35`: invalid}},
	{`{"required": ["a"]}`, map[string]int{`{}`: invalid, `{"a": null}`: fastOK, `{"\u0061": null}`: libOK, `{"b": 1}`: invalid, `1`: fastOK}},
	{`{"required": []}`, map[string]int{`{}`: fastOK}},
	// An opaque subschema leaves only the payloads that reach it.
	{`{"properties": {"a": {"multipleOf": 2}, "b": {"minProperties": 1}}}`, map[string]int{
		`{}`: fastOK, `{"c": 1}`: fastOK, `{"a": 4}`: libOK, `{"a": 3}`: invalid, `{"b": {}}`: invalid, `{"b": {"x": 1}}`: libOK,
	}},
	// format is an annotation in 2020-12, an assertion in draft-07.
	{`{"type": "string", "format": "email"}`, map[string]int{`"x"`: fastOK, `"a@b.c"`: fastOK}},
	{`{"$schema": "https://json-schema.org/draft/2020-12/schema", "format": "date", "minLength": 1}`, map[string]int{`"x"`: fastOK, `""`: invalid}},
	{`{"$schema": "http://json-schema.org/draft-07/schema#", "format": "date"}`, map[string]int{`"x"`: invalid, `"2020-01-01"`: libOK}},
	{`{"$schema": "https://json-schema.org/draft/2019-09/schema", "type": "string"}`, map[string]int{`"x"`: libOK, `1`: invalid}},
	{`{"$schema": "http://json-schema.org/draft-04/schema#", "minimum": 1, "exclusiveMinimum": true}`, map[string]int{`1`: invalid, `2`: libOK}},
	{`{"properties": {"a": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "string"}}}`, map[string]int{`{"a": "x"}`: libOK, `{"a": 1}`: invalid, `{}`: fastOK}},
	// Boolean schemas, $ref and $defs.
	{`false`, map[string]int{`1`: invalid, `{}`: invalid}},
	{`{}`, map[string]int{`1`: fastOK, `{"a": [1, {"b": null}]}`: fastOK, ``: invalid, ` `: invalid, `[`: invalid, `]`: invalid,
		// Nesting: the fast path goes 1000 deep, decode 10000.
		nested(500): fastOK, nested(5000): libOK, nested(10001): invalid, nested(500)[1:]: invalid,
	}},
	{`{"$defs": {"s": {"type": "string", "maxLength": 1}}, "properties": {"a": {"$ref": "#/$defs/s"}, "b": {"$ref": "#/$defs/s", "minLength": 1}}}`, map[string]int{
		`{"a": "x"}`: fastOK, `{"a": "xy"}`: invalid, `{"b": "x"}`: libOK, `{"b": ""}`: invalid,
	}},
	{`{"$defs": {"a/b": {"type": "string"}, "c~d": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/a~1b"}, "y": {"$ref": "#/$defs/c~0d"}}}`, map[string]int{
		`{"x": "s"}`: fastOK, `{"x": 1}`: invalid, `{"y": 1}`: fastOK, `{"y": "s"}`: invalid,
	}},
	{`{"$defs": {"s": {"$anchor": "s", "type": "string"}}, "properties": {"a": {"$ref": "#s"}}}`, map[string]int{`{"a": "x"}`: libOK, `{"a": 1}`: invalid}},
	{`{"$id": "mem:///x/", "$defs": {"s": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/s"}}}`, map[string]int{`{"a": "x"}`: libOK, `{"a": 1}`: invalid}},
	{`{"$dynamicAnchor": "n", "properties": {"a": {"$dynamicRef": "#n"}}, "type": "object"}`, map[string]int{`{"a": {}}`: libOK, `{"a": 1}`: invalid}},
}

// TestFastPathEdges checks what becomes of each payload of fastEdges.
func TestFastPathEdges(t *testing.T) {
	names := map[int]string{fastOK: "fast path accepts", libOK: "library alone accepts", invalid: "library refuses"}
	for i, e := range fastEdges {
		c := compileTexts(t, []string{e.schema})[0]
		for p, want := range e.payloads {
			lib := validByLibrary(t, c.sch, []byte(p))
			fast := c.fast != nil && c.fast.valid([]byte(p))
			got := invalid
			switch {
			case fast && !lib:
				t.Errorf("schema %d %s: fast path accepts %q, the library refuses it", i, e.schema, p)
				continue
			case fast:
				got = fastOK
			case lib:
				got = libOK
			}
			if got != want {
				t.Errorf("schema %d %s: %q: %s, want %s", i, e.schema, p, names[got], names[want])
			}
		}
	}
}

// nested is depth arrays, one in the other, around an object.
func nested(depth int) string {
	return strings.Repeat("[", depth) + `{"a": 1}` + strings.Repeat("]", depth)
}

// FuzzCompileFast varies the schema as well as the payload: for any
// schema the library compiles, a payload the fast path accepts, the
// library accepts.
func FuzzCompileFast(f *testing.F) {
	for _, s := range fastSchemas {
		f.Add([]byte(s), []byte(`{"a": 1, "seq": 1, "data": "x", "id": "ab", "lines": [{"sku": "a"}]}`))
	}
	for _, e := range fastEdges {
		for p := range e.payloads {
			if len(p) < 200 {
				f.Add([]byte(e.schema), []byte(p))
			}
		}
	}
	f.Fuzz(func(t *testing.T, text, payload []byte) {
		doc, err := fastDoc(text)
		if err != nil {
			return
		}
		c := jsonschema.NewCompiler()
		if err := c.AddResource("mem:///s.json", doc); err != nil {
			return
		}
		sch, err := c.Compile("mem:///s.json")
		if err != nil {
			return
		}
		if fast := compileFast(doc, ""); fast != nil && fast.valid(payload) && !validByLibrary(t, sch, payload) {
			t.Fatalf("fast path accepts %q, the library refuses it, schema %s", payload, text)
		}
	})
}

// writeFiles writes files (slash-separated name relative to dir -> text).
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
