package schema

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// decode parses the JSON text b into the values the validator takes:
// map[string]any, []any, string, json.Number (no precision lost), bool and
// nil. It accepts exactly what encoding/json accepts from valid UTF-8 and
// yields the same values as a json.Decoder with UseNumber (lone surrogate
// escapes become U+FFFD, a repeated key keeps its last value); text that is
// not valid UTF-8 is refused.
//
// Strings without escapes share b's memory instead of being copied (a
// copy was a third of decode's time and most of its garbage at 1 KB
// payloads): the result is valid only while b is unchanged, and must not
// outlive the validation it is decoded for. Set.Validate keeps nothing of
// it: its errors are formatted into new strings.
//
// Why not encoding/json: at make bench's 1 KB rows, json.Decoder took 12 µs
// of the 17 µs a validation cost, more than the relay spends on the rest of
// a row; this single pass takes about a tenth of that. FuzzDecode holds it
// to encoding/json's results.
func decode(b []byte) (any, error) {
	d := decoder{b: b}
	d.space()
	v, err := d.value(0)
	if err != nil {
		return nil, err
	}
	d.space()
	if d.i < len(d.b) {
		return nil, d.errorf("invalid character %q after top-level value", d.b[d.i])
	}
	return v, nil
}

// maxDepth bounds nesting as encoding/json does.
const maxDepth = 10000

type decoder struct {
	b []byte
	i int
}

var errEnd = errors.New("unexpected end of JSON input")

func (d *decoder) errorf(format string, args ...any) error {
	return fmt.Errorf("offset %d: "+format, append([]any{d.i}, args...)...)
}

func (d *decoder) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *decoder) value(depth int) (any, error) {
	if d.i >= len(d.b) {
		return nil, errEnd
	}
	switch c := d.b[d.i]; {
	case c == '{':
		return d.object(depth + 1)
	case c == '[':
		return d.array(depth + 1)
	case c == '"':
		return d.string()
	case c == '-' || (c >= '0' && c <= '9'):
		return d.number()
	case c == 't':
		return true, d.literal("true")
	case c == 'f':
		return false, d.literal("false")
	case c == 'n':
		return nil, d.literal("null")
	default:
		return nil, d.errorf("invalid character %q looking for beginning of value", c)
	}
}

func (d *decoder) literal(lit string) error {
	if len(d.b)-d.i < len(lit) {
		if string(d.b[d.i:]) == lit[:len(d.b)-d.i] {
			return errEnd
		}
		return d.errorf("invalid literal, want %s", lit)
	}
	if string(d.b[d.i:d.i+len(lit)]) != lit {
		return d.errorf("invalid literal, want %s", lit)
	}
	d.i += len(lit)
	return nil
}

func (d *decoder) object(depth int) (any, error) {
	if depth > maxDepth {
		return nil, d.errorf("exceeded max depth")
	}
	d.i++ // {
	m := make(map[string]any)
	d.space()
	if d.i < len(d.b) && d.b[d.i] == '}' {
		d.i++
		return m, nil
	}
	for {
		if d.i >= len(d.b) {
			return nil, errEnd
		}
		if d.b[d.i] != '"' {
			return nil, d.errorf("invalid character %q looking for beginning of object key string", d.b[d.i])
		}
		k, err := d.string()
		if err != nil {
			return nil, err
		}
		d.space()
		if d.i >= len(d.b) {
			return nil, errEnd
		}
		if d.b[d.i] != ':' {
			return nil, d.errorf("invalid character %q after object key", d.b[d.i])
		}
		d.i++
		d.space()
		v, err := d.value(depth)
		if err != nil {
			return nil, err
		}
		m[k] = v
		d.space()
		if d.i >= len(d.b) {
			return nil, errEnd
		}
		switch d.b[d.i] {
		case ',':
			d.i++
			d.space()
		case '}':
			d.i++
			return m, nil
		default:
			return nil, d.errorf("invalid character %q after object key:value pair", d.b[d.i])
		}
	}
}

func (d *decoder) array(depth int) (any, error) {
	if depth > maxDepth {
		return nil, d.errorf("exceeded max depth")
	}
	d.i++ // [
	a := []any{}
	d.space()
	if d.i < len(d.b) && d.b[d.i] == ']' {
		d.i++
		return a, nil
	}
	for {
		v, err := d.value(depth)
		if err != nil {
			return nil, err
		}
		a = append(a, v)
		d.space()
		if d.i >= len(d.b) {
			return nil, errEnd
		}
		switch d.b[d.i] {
		case ',':
			d.i++
			d.space()
		case ']':
			d.i++
			return a, nil
		default:
			return nil, d.errorf("invalid character %q after array element", d.b[d.i])
		}
	}
}

// string parses the string starting at d.b[d.i] == '"'.
func (d *decoder) string() (string, error) {
	d.i++
	start := d.i
	var high byte // or of every byte: >= 0x80 means non-ASCII
	// Skip 8 plain bytes at a time (no quote, backslash or control
	// character): long strings are most of a payload's bytes.
	for len(d.b)-d.i >= 8 {
		w := binary.LittleEndian.Uint64(d.b[d.i:])
		if special(w) {
			break
		}
		high |= byte((w | w>>8 | w>>16 | w>>24 | w>>32 | w>>40 | w>>48 | w>>56) & 0x80)
		d.i += 8
	}
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			if high >= utf8.RuneSelf && !utf8.Valid(s) {
				return "", d.errorf("string is not valid UTF-8")
			}
			if len(s) == 0 {
				return "", nil
			}
			// No copy: see decode.
			return unsafe.String(&s[0], len(s)), nil
		case c == '\\':
			return d.unescape(start)
		case c < 0x20:
			return "", d.errorf("invalid character %q in string literal", c)
		}
		high |= c
		d.i++
	}
	return "", errEnd
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// special reports whether one of the 8 bytes in w is a quote, a backslash
// or below 0x20. Each test is exact: a borrow starts only at a byte that
// matches.
func special(w uint64) bool {
	hasZero := func(v uint64) uint64 { return (v - ones) & ^v & highs }
	return hasZero(w^(ones*'"'))|hasZero(w^(ones*'\\'))|((w-ones*0x20)&^w&highs) != 0
}

// unescape finishes a string that has escapes; d.i is at the first
// backslash, start after the opening quote.
func (d *decoder) unescape(start int) (string, error) {
	out := make([]byte, 0, d.i-start+16)
	out = append(out, d.b[start:d.i]...)
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			d.i++
			if !utf8.Valid(out) {
				return "", d.errorf("string is not valid UTF-8")
			}
			return string(out), nil
		case c < 0x20:
			return "", d.errorf("invalid character %q in string literal", c)
		case c != '\\':
			out = append(out, c)
			d.i++
			continue
		}
		d.i++ // backslash
		if d.i >= len(d.b) {
			return "", errEnd
		}
		e := d.b[d.i]
		d.i++
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, err := d.hex4()
			if err != nil {
				return "", err
			}
			if utf16.IsSurrogate(r) {
				// A high surrogate followed by a low one is one rune;
				// anything else is U+FFFD, as in encoding/json.
				if len(d.b)-d.i >= 6 && d.b[d.i] == '\\' && d.b[d.i+1] == 'u' {
					save := d.i
					d.i += 2
					r2, err := d.hex4()
					if err != nil {
						return "", err
					}
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						r = dec
					} else {
						d.i = save
						r = utf8.RuneError
					}
				} else {
					r = utf8.RuneError
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", d.errorf("invalid escape \\%c in string literal", e)
		}
	}
	return "", errEnd
}

func (d *decoder) hex4() (rune, error) {
	if len(d.b)-d.i < 4 {
		for _, c := range d.b[d.i:] {
			if !isHex(c) {
				return 0, d.errorf("invalid \\u escape")
			}
		}
		return 0, errEnd
	}
	var r rune
	for _, c := range d.b[d.i : d.i+4] {
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, d.errorf("invalid \\u escape")
		}
		r = r<<4 | rune(v)
	}
	d.i += 4
	return r, nil
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// number parses a number in JSON's grammar.
func (d *decoder) number() (any, error) {
	start := d.i
	end, _, _, msg := lexNumber(d.b, d.i)
	d.i = end
	switch {
	case msg == "":
		return json.Number(d.b[start:end]), nil
	case end >= len(d.b):
		return nil, errEnd
	}
	return nil, d.errorf(msg, d.b[end])
}

// lexNumber finds the end of the number at b[i], in JSON's grammar
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, the end of its integer
// part, and whether it has neither fraction nor exponent. When b[i:] does
// not start with a number, end is where it goes wrong and msg, a format
// for the byte there, says how (unless end is len(b)).
func lexNumber(b []byte, i int) (end, intEnd int, integer bool, msg string) {
	if b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i >= len(b) {
		return i, 0, false, "end"
	}
	switch c := b[i]; {
	case c == '0':
		i++
	case c >= '1' && c <= '9':
		digits()
	default:
		return i, 0, false, "invalid character %q in numeric literal"
	}
	intEnd, integer = i, true
	if i < len(b) && b[i] == '.' {
		i++
		integer = false
		if digits() == 0 {
			return i, 0, false, "invalid character %q after decimal point in numeric literal"
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		integer = false
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return i, 0, false, "invalid character %q in exponent of numeric literal"
		}
	}
	return i, intEnd, integer, ""
}
