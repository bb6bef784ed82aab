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
	err = sch.Validate(doc)
	var verr *jsonschema.ValidationError
	if err != nil && !errors.As(err, &verr) {
		t.Fatalf("validate %q: %v", payload, err)
	}
	return err == nil
}

type fastCase struct {
	text string
	sch  *jsonschema.Schema
	fast *fastNode
}

func compileBoth(t testing.TB) []fastCase {
	var out []fastCase
	for i, text := range fastSchemas {
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
	cases := compileBoth(f)
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
		"e.abs/v1.json":          `{"properties": {"a": {"$ref": "` + abs + `"}}}`,
		"e.abs" + abs:            `{"type": "string"}`,
		"e.query/x/int.json":     `{"type": "integer"}`,
		"e.query/x/int.json?v=1": `{"type": "string"}`,
		"e.query/v1.json":        `{"properties": {"a": {"$ref": "x/int.json?v=1"}}}`,
		"e.dots/v1.json":         `{"properties": {"a": {"$ref": "./../_shared/./int.json"}}}`,
		"e.ref/v1.json":          `{"properties": {"a": {"$ref": "../_shared/int.json#"}}}`,
		"e.ref/v2.json":          `{"properties": {"a": {"$ref": "../_shared/str.json"}}}`,
	}
	for name, text := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
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
