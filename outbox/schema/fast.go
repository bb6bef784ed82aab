package schema

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// A fastNode is a schema, or a subschema, compiled to the subset of JSON
// Schema that one pass over a payload's bytes can check without building
// the payload's values: type, properties, required, items, the length,
// size and numeric bounds, string enum and const, and pattern; the
// annotations (title, format, default, ...) are ignored as draft 2020-12
// ignores them.
//
// The pass only ever proves a payload valid. Anything it cannot decide on
// its own (a keyword outside the subset, a key with escapes, a number at
// the exact bound) or that looks invalid makes it give up, and the
// library validates the payload from scratch: it stays the one authority
// for which payloads are refused and for what the error says, and the
// pass is just a way not to ask it about the common case. FuzzFastPath
// holds the pass to that: whatever it accepts, the library accepts.
//
// Why: at make bench's 1 KB rows, the library took 8 of the 10 µs a
// validation cost (big.Rat for every number, a rune count of every string,
// a map per object), which halved the relay's throughput; the pass takes
// a small fraction of that and allocates nothing.
type fastNode struct {
	// opaque is a keyword outside the subset, or the false schema: only
	// the library can say.
	opaque bool
	types  typeSet // 0: any type
	props  map[string]fastProp
	// required is the bits of fastProp.bit every required name sets.
	required uint64
	items    *fastNode // nil: any

	minItems, maxItems int
	minLen, maxLen     int // in runes, as the library counts
	bounds             []bound
	enum               []string // with hasEnum: the string values allowed
	hasEnum            bool
	pattern            *regexp.Regexp
}

type fastProp struct {
	n   *fastNode // nil: any
	bit uint64    // 0 unless the name is required
}

type typeSet uint8

const (
	tNull typeSet = 1 << iota
	tBoolean
	tObject
	tArray
	tNumber
	tInteger
	tString
)

var typeNames = map[string]typeSet{
	"null": tNull, "boolean": tBoolean, "object": tObject, "array": tArray,
	"number": tNumber, "integer": tInteger, "string": tString,
}

// bound is one of minimum, exclusiveMinimum, maximum, exclusiveMaximum.
type bound struct {
	lower, exclusive bool
	f                float64
	i                int64
	exact            bool // i holds the bound exactly
}

// anyNode is the schema of a value nothing constrains.
var anyNode = newFastNode()

func newFastNode() *fastNode { return &fastNode{maxItems: math.MaxInt, maxLen: math.MaxInt} }

// draft2020 is the only dialect the pass knows; a schema in another one
// (draft-07 asserts format, draft-04 has boolean exclusiveMinimum) is
// left to the library.
func isDraft2020(v any) bool {
	s, _ := v.(string)
	return s == "https://json-schema.org/draft/2020-12/schema" || s == "https://json-schema.org/draft/2020-12/schema#"
}

// compileFast compiles the schema document doc of the file path (absolute;
// "" for a schema with no file), as fastDoc decodes it. It returns nil
// when the pass could never prove a payload valid against it.
func compileFast(doc any, path string) *fastNode {
	fc := &fastCompiler{docs: map[string]any{}, refs: map[string]*fastNode{}}
	fc.docs[path] = refable(doc)
	n := fc.schema(doc, path)
	if n.opaque {
		return nil
	}
	return n
}

// fastCompiler compiles one schema file and the files it refers to.
type fastCompiler struct {
	docs map[string]any       // by absolute path; nil: $ref into it is left to the library
	refs map[string]*fastNode // by absolute path#fragment, so that recursive schemas end
}

// opaqueNode is a schema only the library can apply.
var opaqueNode = &fastNode{opaque: true}

// schema compiles one (sub)schema of file; a keyword it does not know
// makes it opaque rather than ignored, so that nothing the library checks
// is skipped.
func (fc *fastCompiler) schema(doc any, file string) *fastNode {
	if d, ok := doc.(map[string]any); ok {
		if ref, ok := d["$ref"]; ok {
			return fc.ref(d, ref, file)
		}
	}
	n := newFastNode()
	fc.fill(n, doc, file)
	return n
}

func (fc *fastCompiler) fill(n *fastNode, doc any, file string) {
	switch d := doc.(type) {
	case bool:
		n.opaque = !d
	case map[string]any:
		for k, v := range d {
			if !fc.keyword(n, k, v, file) {
				n.opaque = true
				return
			}
		}
	default:
		n.opaque = true
	}
}

// ref compiles a schema that is a $ref, to a file of the folder or into
// its own document by JSON pointer, with nothing but annotations beside
// it: it is the schema it refers to. Anything else ($ref beside other
// keywords, anchors, $id) is left to the library.
func (fc *fastCompiler) ref(d map[string]any, ref any, file string) *fastNode {
	for k, v := range d {
		switch k {
		case "$ref", "$defs", "$comment", "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly":
		case "$schema":
			if !isDraft2020(v) {
				return opaqueNode
			}
		default:
			return opaqueNode
		}
	}
	r, ok := ref.(string)
	// Only a relative path and a fragment: the library resolves a
	// reference with a scheme, a query, an absolute path or escapes in
	// ways filepath.Join does not.
	if !ok || strings.ContainsAny(r, "%:?\\") || strings.HasPrefix(r, "/") {
		return opaqueNode
	}
	if doc, ok := fc.docs[file]; ok && doc == nil {
		return opaqueNode // an $id in file: the reference resolves against it, not the file
	}
	uri, frag, _ := strings.Cut(r, "#")
	if uri != "" {
		if file == "" {
			return opaqueNode // no file to resolve it against
		}
		file = filepath.Join(filepath.Dir(file), filepath.FromSlash(uri))
	}
	key := file + "#" + frag
	if n, ok := fc.refs[key]; ok {
		return n
	}
	n := newFastNode()
	fc.refs[key] = n
	doc, ok := fc.docs[file]
	if !ok {
		doc = nil
		if b, err := os.ReadFile(file); err == nil {
			if d, err := fastDoc(b); err == nil {
				if m, ok := d.(map[string]any); !ok || m["$schema"] == nil || isDraft2020(m["$schema"]) {
					doc = refable(d)
				}
			}
		}
		fc.docs[file] = doc
	}
	target, ok := pointer(doc, frag)
	if t, isMap := target.(map[string]any); !ok || doc == nil || (isMap && t["$ref"] != nil) {
		n.opaque = true // a $ref to a $ref is rare enough to leave to the library
		return n
	}
	fc.fill(n, target, file)
	return n
}

// refable returns doc, or nil when it has an $id anywhere: an $id changes
// what the $refs under it resolve against, and names a subschema that a
// $ref anywhere in the document can reach as if it were a file.
func refable(doc any) any {
	var hasID func(v any) bool
	hasID = func(v any) bool {
		switch v := v.(type) {
		case map[string]any:
			if _, ok := v["$id"]; ok {
				return true
			}
			for _, e := range v {
				if hasID(e) {
					return true
				}
			}
		case []any:
			for _, e := range v {
				if hasID(e) {
					return true
				}
			}
		}
		return false
	}
	if hasID(doc) {
		return nil
	}
	return doc
}

// pointer resolves the URI fragment frag, "" or a JSON pointer, in doc.
func pointer(doc any, frag string) (any, bool) {
	if frag == "" {
		return doc, true
	}
	if frag[0] != '/' {
		return nil, false // an anchor
	}
	for _, tok := range strings.Split(frag[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch d := doc.(type) {
		case map[string]any:
			var ok bool
			if doc, ok = d[tok]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(d) {
				return nil, false
			}
			doc = d[i]
		default:
			return nil, false
		}
	}
	return doc, true
}

// keyword compiles one keyword of file into n and reports whether it is
// in the subset.
func (fc *fastCompiler) keyword(n *fastNode, k string, v any, file string) bool {
	switch k {
	case "$schema":
		return isDraft2020(v)
	case "$id", "$anchor", "$dynamicAnchor", "$comment", "$defs", "title", "description",
		"default", "examples", "deprecated", "readOnly", "writeOnly", "format":
		// Annotations, or definitions reached only through $ref.
		return true
	case "type":
		switch t := v.(type) {
		case string:
			n.types = typeNames[t]
			return n.types != 0
		case []any:
			for _, e := range t {
				s, _ := e.(string)
				if typeNames[s] == 0 {
					return false
				}
				n.types |= typeNames[s]
			}
			return n.types != 0
		}
		return false
	case "properties":
		props, ok := v.(map[string]any)
		if !ok {
			return false
		}
		if n.props == nil {
			n.props = make(map[string]fastProp, len(props))
		}
		for name, sub := range props {
			p := n.props[name]
			p.n = fc.schema(sub, file)
			n.props[name] = p
		}
		return true
	case "required":
		names, ok := v.([]any)
		if !ok {
			return false
		}
		if n.props == nil {
			n.props = make(map[string]fastProp, len(names))
		}
		for _, e := range names {
			name, ok := e.(string)
			if !ok {
				return false
			}
			p := n.props[name]
			if p.bit == 0 {
				next := n.required + 1 // the lowest unused bit, bits being taken in order
				if next == 0 {
					return false // more than 64 required names
				}
				p.bit = next &^ n.required
				n.required |= p.bit
			}
			n.props[name] = p
		}
		return true
	case "items":
		n.items = fc.schema(v, file)
		return true
	case "additionalProperties":
		b, ok := v.(bool)
		return ok && b
	case "uniqueItems":
		b, ok := v.(bool)
		return ok && !b
	case "minItems":
		return count(v, &n.minItems)
	case "maxItems":
		return count(v, &n.maxItems)
	case "minLength":
		return count(v, &n.minLen)
	case "maxLength":
		return count(v, &n.maxLen)
	case "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum":
		num, ok := v.(json.Number)
		if !ok {
			return false
		}
		f, err := strconv.ParseFloat(string(num), 64)
		if err != nil {
			return false
		}
		b := bound{lower: k == "minimum" || k == "exclusiveMinimum", exclusive: k[0] == 'e', f: f}
		if i, err := strconv.ParseInt(string(num), 10, 64); err == nil {
			b.i, b.exact = i, true
		}
		n.bounds = append(n.bounds, b)
		return true
	case "enum", "const":
		vals := []any{v}
		if k == "enum" {
			var ok bool
			if vals, ok = v.([]any); !ok {
				return false
			}
		}
		if n.hasEnum {
			return false // enum and const together
		}
		n.hasEnum = true
		for _, e := range vals {
			s, ok := e.(string)
			if !ok {
				return false
			}
			n.enum = append(n.enum, s)
		}
		return true
	case "pattern":
		s, ok := v.(string)
		if !ok {
			return false
		}
		re, err := regexp.Compile(s) // the library's default engine
		if err != nil {
			return false
		}
		n.pattern = re
		return true
	}
	return false
}

// count reads a non-negative integer keyword value.
func count(v any, dst *int) bool {
	num, ok := v.(json.Number)
	if !ok {
		return false
	}
	i, err := strconv.Atoi(string(num))
	if err != nil || i < 0 {
		return false
	}
	*dst = i
	return true
}

// valid reports whether payload is JSON that n accepts; false means the
// library must decide.
func (n *fastNode) valid(payload []byte) bool {
	s := scanner{b: payload}
	s.space()
	if !s.value(n, 0) {
		return false
	}
	s.space()
	return s.i == len(s.b)
}

// scanner walks JSON text as decode parses it, checking each value against
// its schema as it goes.
type scanner struct {
	b []byte
	i int
}

// maxFastDepth is deeper than any real payload and far inside decode's
// limit: deeper payloads are left to the library.
const maxFastDepth = 1000

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) value(n *fastNode, depth int) bool {
	if n == nil {
		n = anyNode
	}
	if n.opaque || s.i >= len(s.b) || depth > maxFastDepth {
		return false
	}
	c := s.b[s.i]
	if n.hasEnum && c != '"' {
		return false // the enum holds strings only
	}
	switch {
	case c == '{':
		return n.allows(tObject) && s.object(n, depth+1)
	case c == '[':
		return n.allows(tArray) && s.array(n, depth+1)
	case c == '"':
		return n.allows(tString) && s.string(n)
	case c == '-' || (c >= '0' && c <= '9'):
		return s.number(n)
	case c == 't':
		return n.allows(tBoolean) && s.literal("true")
	case c == 'f':
		return n.allows(tBoolean) && s.literal("false")
	case c == 'n':
		return n.allows(tNull) && s.literal("null")
	}
	return false
}

func (n *fastNode) allows(t typeSet) bool { return n.types == 0 || n.types&t != 0 }

func (s *scanner) literal(lit string) bool {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.i += len(lit)
	return true
}

func (s *scanner) object(n *fastNode, depth int) bool {
	s.i++ // {
	var seen uint64
	s.space()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return n.required == 0
	}
	for {
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return false
		}
		key, escaped, _, ok := s.str()
		if !ok {
			return false
		}
		var p fastProp
		if len(n.props) > 0 {
			if escaped {
				return false // the key it stands for is not key
			}
			p = n.props[unsafe.String(unsafe.SliceData(key), len(key))]
		}
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false
		}
		s.i++
		s.space()
		if !s.value(p.n, depth) {
			return false
		}
		seen |= p.bit
		if more, ok := s.next('}'); !ok || !more {
			return ok && seen == n.required
		}
	}
}

func (s *scanner) array(n *fastNode, depth int) bool {
	s.i++ // [
	s.space()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return n.minItems == 0
	}
	for items := 1; ; items++ {
		if items > n.maxItems || !s.value(n.items, depth) {
			return false
		}
		if more, ok := s.next(']'); !ok || !more {
			return ok && items >= n.minItems
		}
	}
}

// next moves past the comma or the closing bracket after a member or an
// element: more is a comma.
func (s *scanner) next(closing byte) (more, ok bool) {
	s.space()
	if s.i >= len(s.b) {
		return false, false
	}
	switch s.b[s.i] {
	case ',':
		s.i++
		s.space()
		return true, true
	case closing:
		s.i++
		return false, true
	}
	return false, false
}

// string checks a string value against n.
func (s *scanner) string(n *fastNode) bool {
	raw, escaped, ascii, ok := s.str()
	if !ok {
		return false
	}
	if n.minLen > 0 || n.maxLen < len(raw) {
		if escaped {
			// Each escape stands for at least one rune and at most one
			// per byte of its text; a surrogate pair is 12 bytes.
			if len(raw) > n.maxLen || (len(raw)+11)/12 < n.minLen {
				return false
			}
		} else {
			runes := len(raw)
			if !ascii {
				runes = utf8.RuneCount(raw)
			}
			if runes < n.minLen || runes > n.maxLen {
				return false
			}
		}
	}
	if n.hasEnum || n.pattern != nil {
		if escaped {
			return false
		}
		if n.hasEnum && !n.inEnum(raw) {
			return false
		}
		if n.pattern != nil && !n.pattern.Match(raw) {
			return false
		}
	}
	return true
}

func (n *fastNode) inEnum(raw []byte) bool {
	for _, e := range n.enum {
		if string(raw) == e {
			return true
		}
	}
	return false
}

// str scans the string at s.b[s.i] == '"' and returns its text between
// the quotes, whether it has escapes and whether it is all ASCII. It
// accepts what decode accepts: no control characters, valid escapes,
// valid UTF-8 (escapes are ASCII, so the raw text is valid exactly when
// the unescaped one is).
func (s *scanner) str() (raw []byte, escaped, ascii, ok bool) {
	start := s.i + 1
	// Most strings have no escapes: find the closing quote and check the
	// bytes before it, with the vectorised bytes.IndexByte doing most of
	// the work.
	q := bytes.IndexByte(s.b[start:], '"')
	if q < 0 {
		return nil, false, false, false
	}
	raw = s.b[start : start+q]
	if bytes.IndexByte(raw, '\\') >= 0 {
		return s.strEscaped()
	}
	s.i = start + q + 1
	if printableASCII(raw) {
		return raw, false, true, true
	}
	for _, c := range raw {
		if c < 0x20 {
			return nil, false, false, false
		}
	}
	return raw, false, false, utf8.Valid(raw)
}

// printableASCII reports whether every byte of b is in 0x20-0x7f.
func printableASCII(b []byte) bool {
	// Adding 0x60 to a byte's low 7 bits sets its high bit exactly when
	// they are 0x20 or more, and carries into no other byte.
	const low7 = ^uint64(highs)
	var bad uint64
	for len(b) >= 32 {
		w1, w2 := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:])
		w3, w4 := binary.LittleEndian.Uint64(b[16:]), binary.LittleEndian.Uint64(b[24:])
		bad |= ^((w1 & low7) + ones*0x60) | w1 | ^((w2 & low7) + ones*0x60) | w2 |
			^((w3 & low7) + ones*0x60) | w3 | ^((w4 & low7) + ones*0x60) | w4
		b = b[32:]
	}
	for len(b) >= 8 {
		w := binary.LittleEndian.Uint64(b)
		bad |= ^((w & low7) + ones*0x60) | w
		b = b[8:]
	}
	for _, c := range b {
		if c < 0x20 || c >= 0x80 {
			return false
		}
	}
	return bad&highs == 0
}

// strEscaped is str for a string with escapes.
func (s *scanner) strEscaped() (raw []byte, escaped, ascii, ok bool) {
	s.i++
	start := s.i
	var high uint64 // or of every byte: a high bit set means non-ASCII
	for {
		for len(s.b)-s.i >= 8 {
			w := binary.LittleEndian.Uint64(s.b[s.i:])
			if special(w) {
				break
			}
			high |= w
			s.i += 8
		}
		if s.i >= len(s.b) {
			return nil, false, false, false
		}
		c := s.b[s.i]
		switch {
		case c == '"':
			raw = s.b[start:s.i]
			s.i++
			ascii = high&highs == 0
			if !ascii && !utf8.Valid(raw) {
				return nil, false, false, false
			}
			return raw, escaped, ascii, true
		case c == '\\':
			escaped = true
			if !s.escape() {
				return nil, false, false, false
			}
			continue
		case c < 0x20:
			return nil, false, false, false
		}
		high |= uint64(c)
		s.i++
	}
}

// escape skips one escape sequence at s.b[s.i] == '\\'.
func (s *scanner) escape() bool {
	if len(s.b)-s.i < 2 {
		return false
	}
	switch s.b[s.i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		s.i += 2
		return true
	case 'u':
		if len(s.b)-s.i < 6 {
			return false
		}
		for _, c := range s.b[s.i+2 : s.i+6] {
			if !isHex(c) {
				return false
			}
		}
		s.i += 6
		return true
	}
	return false
}

// number checks a number value against n, in JSON's grammar.
func (s *scanner) number(n *fastNode) bool {
	start := s.i
	end, intEnd, integer, msg := lexNumber(s.b, s.i)
	if msg != "" {
		return false
	}
	s.i = end
	neg := s.b[start] == '-'
	switch {
	case n.types == 0 || n.types&tNumber != 0:
	case n.types&tInteger != 0 && integer:
		// 1.0 and 1e2 are integers too, but only the library says so.
	default:
		return false
	}
	if len(n.bounds) == 0 {
		return true
	}
	text := s.b[start:s.i]
	if !ratSafe(text) {
		return false
	}
	// An integer of up to 18 digits is exact in an int64.
	var v int64
	exact := integer && intEnd-start-btoi(neg) <= 18
	if exact {
		for _, c := range s.b[start+btoi(neg) : intEnd] {
			v = v*10 + int64(c-'0')
		}
		if neg {
			v = -v
		}
	}
	var f float64
	haveF := false
	for _, b := range n.bounds {
		if exact && b.exact {
			if !b.holds(cmp.Compare(v, b.i)) {
				return false
			}
			continue
		}
		if !haveF {
			var err error
			if f, err = strconv.ParseFloat(unsafe.String(unsafe.SliceData(text), len(text)), 64); err != nil {
				return false
			}
			haveF = true
		}
		// Rounding to float64 is monotonic, so a strict inequality between
		// the rounded values holds between the exact ones; equal rounded
		// values say nothing.
		if (b.lower && !(f > b.f)) || (!b.lower && !(f < b.f)) {
			return false
		}
	}
	return true
}

// ratSafe reports whether the library can compare the number text with
// a bound: it takes numbers as big.Rat, which refuses an exponent, less
// the fraction's digits, beyond ±1000000, and validateDoc refuses the
// payload. This allows up to 1000 bytes and a 5-digit exponent.
func ratSafe(text []byte) bool {
	if len(text) > 1000 {
		return false
	}
	e := bytes.IndexAny(text, "eE")
	if e < 0 {
		return true
	}
	exp := text[e+1:]
	if exp[0] == '+' || exp[0] == '-' {
		exp = exp[1:]
	}
	return len(exp) <= 5
}

// holds reports whether a value that compares c to the bound (-1, 0, 1) meets it.
func (b bound) holds(c int) bool {
	switch {
	case b.lower && b.exclusive:
		return c > 0
	case b.lower:
		return c >= 0
	case b.exclusive:
		return c < 0
	}
	return c <= 0
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// fastDoc decodes a schema file's text for compileFast.
func fastDoc(b []byte) (any, error) {
	var doc any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	err := dec.Decode(&doc)
	return doc, err
}
