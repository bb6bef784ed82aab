package rules

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"cel.dev/cel-go/cel"
	celast "cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/types"
)

// payloadUse is what the expressions of a Set read of the payload.
type payloadUse struct {
	// whole: some expression reads the payload otherwise than through a
	// top-level field (payload.f, has(payload.f), payload["f"]).
	whole bool
	// fields are the top-level fields read, when not whole.
	fields map[string]bool
}

// add records what the checked expression ast reads of the payload.
func (u *payloadUse) add(ast *cel.Ast) {
	uses, byField := map[int64]bool{}, map[int64]bool{}
	celast.PreOrderVisit(ast.NativeRep().Expr(), celast.NewExprVisitor(func(e celast.Expr) {
		isPayload := func(e celast.Expr) bool {
			return e.Kind() == celast.IdentKind && e.AsIdent() == "payload"
		}
		switch e.Kind() {
		case celast.IdentKind:
			if isPayload(e) {
				uses[e.ID()] = true
			}
		case celast.SelectKind:
			if sel := e.AsSelect(); isPayload(sel.Operand()) {
				byField[sel.Operand().ID()] = true
				u.field(sel.FieldName())
			}
		case celast.CallKind:
			call := e.AsCall()
			if args := call.Args(); call.FunctionName() == operators.Index && len(args) == 2 && isPayload(args[0]) &&
				args[1].Kind() == celast.LiteralKind {
				if name, ok := args[1].AsLiteral().(types.String); ok {
					byField[args[0].ID()] = true
					u.field(string(name))
				}
			}
		}
	}))
	for id := range uses {
		if !byField[id] {
			u.whole = true
		}
	}
}

func (u *payloadUse) field(name string) {
	if u.fields == nil {
		u.fields = map[string]bool{}
	}
	u.fields[name] = true
}

// A field is one top-level payload field readFields decoded.
type field struct {
	name  string
	value any
}

// lookup is the value of name in fs, the last one when the payload
// repeats it (as json.Unmarshal keeps the last).
func lookup(fs []field, name string) (any, bool) {
	for i := len(fs) - 1; i >= 0; i-- {
		if fs[i].name == name {
			return fs[i].value, true
		}
	}
	return nil, false
}

// fieldMap is fs as json.Unmarshal decodes them into a map.
func fieldMap(fs []field) map[string]any {
	obj := make(map[string]any, len(fs))
	for _, f := range fs {
		obj[f.name] = f.value
	}
	return obj
}

// readFields appends to dst the top-level fields named in fields of the
// JSON object payload p, in the payload's order (a repeated name is there
// twice). ok is false when p is not a valid JSON object: the caller
// decodes it whole, for the value or the error. valid says p is known to
// be valid JSON (PostgreSQL checked it), which spares checking it again.
func readFields(dst []field, p []byte, fields map[string]bool, valid bool) ([]field, bool) {
	if !valid && !json.Valid(p) {
		return nil, false
	}
	i := skipSpace(p, 0)
	if i >= len(p) || p[i] != '{' {
		return nil, false
	}
	i = skipSpace(p, i+1)
	if i < len(p) && p[i] == '}' {
		return dst, skipSpace(p, i+1) == len(p)
	}
	// Anything unexpected gives up (ok false), should p not be valid after all.
	for i < len(p) && p[i] == '"' {
		end := skipValue(p, i)
		if end-i < 2 || p[end-1] != '"' {
			return nil, false
		}
		q := p[i:end]
		name, want := "", false
		if raw := q[1 : len(q)-1]; bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
			if want = fields[string(raw)]; want { // no copy of the name for the lookup
				name = string(raw)
			}
		} else {
			var err error
			if name, err = objectKey(q); err != nil {
				return nil, false
			}
			want = fields[name]
		}
		if i = skipSpace(p, end); i >= len(p) || p[i] != ':' {
			return nil, false
		}
		i = skipSpace(p, i+1)
		if end = skipValue(p, i); end <= i {
			return nil, false
		}
		if want {
			v, err := decodeValue(p[i:end])
			if err != nil {
				return nil, false
			}
			dst = append(dst, field{name, v})
		}
		switch i = skipSpace(p, end); {
		case i < len(p) && p[i] == ',':
			i = skipSpace(p, i+1)
		case i < len(p) && p[i] == '}':
			return dst, skipSpace(p, i+1) == len(p)
		default:
			return nil, false
		}
	}
	return nil, false
}

// objectKey is the quoted JSON string q as a Go string.
func objectKey(q []byte) (string, error) {
	s := q[1 : len(q)-1]
	if bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
		return string(s), nil
	}
	var name string
	err := json.Unmarshal(q, &name)
	return name, err
}

func skipSpace(p []byte, i int) int {
	for i < len(p) && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r') {
		i++
	}
	return i
}

// skipValue is the index just past the JSON value starting at p[i], at
// most len(p); p is valid JSON. It is -1 for a value that is valid JSON
// (PostgreSQL takes it) but that json.Unmarshal refuses in an any: a
// number out of float64's range, or nesting deeper than json's limit.
// The values readFields skips are checked too, so that a payload whose
// whole decode fails does not pass for the fields a rule reads of it.
func skipValue(p []byte, i int) int {
	return min(skipTo(p, i), len(p))
}

// maxDepth is how deep encoding/json nests, the payload's object counted:
// a value in the payload may open maxDepth-1 objects and arrays.
const maxDepth = 10000

func skipTo(p []byte, i int) int {
	depth := 0
	for ; i < len(p); i++ {
		switch c := p[i]; c {
		case '"':
			i = stringEnd(p, i+1)
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			if depth++; depth >= maxDepth {
				return -1
			}
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
			if depth < 0 { // the end of the enclosing object: a scalar ended
				return i
			}
		case ',', ' ', '\t', '\n', '\r', ':':
			if depth == 0 {
				return i
			}
		case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			end, exp := numberEnd(p, i)
			// At most 308 characters without an exponent is below 1e308.
			if exp || end-i > 308 {
				if _, err := strconv.ParseFloat(string(p[i:end]), 64); err != nil {
					return -1
				}
			}
			i = end - 1
		}
	}
	return i
}

// numberEnd is the index just past the JSON number starting at p[i], and
// whether it has an exponent.
func numberEnd(p []byte, i int) (end int, exp bool) {
	for ; i < len(p); i++ {
		if c := p[i]; c == 'e' || c == 'E' {
			exp = true
		} else if (c < '0' || c > '9') && c != '.' && c != '-' && c != '+' {
			break
		}
	}
	return i, exp
}

// stringEnd is the index of the quote that ends the JSON string whose
// text starts at p[i], or len(p): the quote found with IndexByte, not
// preceded by an odd number of backslashes.
func stringEnd(p []byte, i int) int {
	for {
		j := bytes.IndexByte(p[i:], '"')
		if j < 0 {
			return len(p)
		}
		q := i + j
		n := 0
		for k := q - 1; k >= i && p[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return q
		}
		i = q + 1
	}
}

// decodeValue is the JSON value v as json.Unmarshal decodes it into an
// any, without its reflection for the scalars a rule mostly reads: a
// number, a string without escapes, true, false and null.
func decodeValue(v []byte) (any, error) {
	switch {
	case len(v) == 0:
	case v[0] == '"' && len(v) >= 2 && v[len(v)-1] == '"':
		if s := v[1 : len(v)-1]; bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) && !hasControl(s) {
			return string(s), nil
		}
	case v[0] == '-' || '0' <= v[0] && v[0] <= '9':
		if json.Valid(v) {
			return strconv.ParseFloat(string(v), 64)
		}
	case string(v) == "true":
		return true, nil
	case string(v) == "false":
		return false, nil
	case string(v) == "null":
		return nil, nil
	}
	var out any
	err := json.Unmarshal(v, &out)
	return out, err
}

// hasControl says s holds a byte JSON forbids unescaped in a string.
func hasControl(s []byte) bool {
	for _, c := range s {
		if c < 0x20 {
			return true
		}
	}
	return false
}
