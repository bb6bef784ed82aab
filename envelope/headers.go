package envelope

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// maxDepth is the nesting limit of encoding/json, kept so that ParseHeaders
// accepts exactly the objects json.Valid accepts.
const maxDepth = 10000

// ParseHeaders parses the headers of an outbox row: the text of a jsonb
// object, or the headers value of a table-less message.
//
// Empty input, whitespace, null and {} yield nil and no error; {} does not
// allocate. Anything else must be a JSON object, or ParseHeaders returns an
// error saying what it got. The headers keep the object's key order; a key
// that occurs twice keeps its first position and its last value, as jsonb
// and encoding/json keep the last value. String values are the decoded
// strings; any other value is its compact JSON text (true, 42, {"a":[1,2]}).
// Invalid UTF-8 is replaced by U+FFFD and unpaired surrogate escapes by
// U+FFFD, as encoding/json does.
func ParseHeaders(raw []byte) ([]Header, error) {
	i := skipSpace(raw, 0)
	if i == len(raw) {
		return nil, nil
	}
	switch raw[i] {
	case '{':
		if j := skipSpace(raw, i+1); j < len(raw) && raw[j] == '}' && skipSpace(raw, j+1) == len(raw) {
			return nil, nil
		}
	case 'n':
		if bytes.HasPrefix(raw[i:], []byte("null")) && skipSpace(raw, i+4) == len(raw) {
			return nil, nil
		}
	}
	if raw[i] != '{' {
		if !json.Valid(raw) {
			return nil, fmt.Errorf("headers are not valid JSON: %w", firstError(raw))
		}
		return nil, fmt.Errorf("headers must be a JSON object, got %s", jsonKind(raw[i]))
	}
	p := headerParser{raw: raw, str: string(raw), validUTF8: utf8.Valid(raw)}
	hs, err := p.object(i)
	if err != nil {
		return nil, fmt.Errorf("headers are not valid JSON: %w", err)
	}
	return hs, nil
}

// firstError returns the error encoding/json reports for invalid JSON.
func firstError(raw []byte) error {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return err
	}
	return fmt.Errorf("invalid JSON")
}

// jsonKind names the kind of JSON value that starts with c.
func jsonKind(c byte) string {
	switch c {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	default:
		return "number"
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// headerParser is a validating JSON parser for one object of headers. Keys
// and values that need no rewriting are substrings of str, a single copy of
// the input, so a typical object costs two allocations: that copy and the
// result slice.
type headerParser struct {
	raw       []byte
	str       string
	validUTF8 bool
}

type syntaxError struct {
	msg    string
	offset int
}

func (e *syntaxError) Error() string {
	return fmt.Sprintf("%s at offset %d", e.msg, e.offset)
}

func (p *headerParser) errAt(i int, what string) error {
	if i >= len(p.raw) {
		return &syntaxError{msg: "unexpected end of input", offset: i}
	}
	return &syntaxError{msg: fmt.Sprintf("%s, found %q", what, p.raw[i]), offset: i}
}

// object parses the top-level object at p.raw[i] == '{' and checks that
// only whitespace follows it.
func (p *headerParser) object(i int) ([]Header, error) {
	raw := p.raw
	// Each pair has a colon; the cap keeps colons inside strings from
	// reserving a large slice for nothing.
	hs := make([]Header, 0, min(bytes.Count(raw, []byte{':'}), 32))
	var index map[string]int // key positions once hs is too long to scan
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		i++
	} else {
		for {
			if i >= len(raw) || raw[i] != '"' {
				return nil, p.errAt(i, "expected a string key")
			}
			key, j, err := p.stringValue(i)
			if err != nil {
				return nil, err
			}
			i = skipSpace(raw, j)
			if i >= len(raw) || raw[i] != ':' {
				return nil, p.errAt(i, "expected ':' after key")
			}
			i = skipSpace(raw, i+1)
			var value string
			if i < len(raw) && raw[i] == '"' {
				value, i, err = p.stringValue(i)
			} else {
				start := i
				var dirty bool
				i, dirty, err = p.value(i, 2)
				if err == nil {
					value = p.compact(start, i, dirty)
				}
			}
			if err != nil {
				return nil, err
			}
			hs, index = addHeader(hs, index, key, value)
			i = skipSpace(raw, i)
			if i < len(raw) && raw[i] == ',' {
				i = skipSpace(raw, i+1)
				continue
			}
			if i < len(raw) && raw[i] == '}' {
				i++
				break
			}
			return nil, p.errAt(i, "expected ',' or '}' after object value")
		}
	}
	if i = skipSpace(raw, i); i != len(raw) {
		return nil, p.errAt(i, "unexpected data after the object")
	}
	if len(hs) == 0 {
		return nil, nil
	}
	return hs, nil
}

// addHeader appends key=value, or replaces the value of an earlier key.
func addHeader(hs []Header, index map[string]int, key, value string) ([]Header, map[string]int) {
	const scanLimit = 16
	if index == nil && len(hs) < scanLimit {
		for k := range hs {
			if hs[k].Key == key {
				hs[k].Value = value
				return hs, nil
			}
		}
		return append(hs, Header{Key: key, Value: value}), nil
	}
	if index == nil {
		index = make(map[string]int, 2*len(hs))
		for k := range hs {
			index[hs[k].Key] = k
		}
	}
	if k, ok := index[key]; ok {
		hs[k].Value = value
		return hs, index
	}
	index[key] = len(hs)
	return append(hs, Header{Key: key, Value: value}), index
}

// scanString validates the string starting at p.raw[i] == '"' and returns
// the index after its closing quote, whether it contains escapes and
// whether it contains invalid UTF-8.
func (p *headerParser) scanString(i int) (end int, escaped, badUTF8 bool, err error) {
	raw := p.raw
	for j := i + 1; j < len(raw); j++ {
		c := raw[j]
		switch {
		case c == '"':
			return j + 1, escaped, badUTF8, nil
		case c == '\\':
			escaped = true
			j++
			if j >= len(raw) {
				return 0, false, false, p.errAt(j, "")
			}
			switch raw[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(raw) {
					return 0, false, false, p.errAt(len(raw), "")
				}
				for k := j + 1; k <= j+4; k++ {
					if unhex(raw[k]) < 0 {
						return 0, false, false, p.errAt(k, "invalid \\u escape")
					}
				}
				j += 4
			default:
				return 0, false, false, p.errAt(j, "invalid escape")
			}
		case c < 0x20:
			return 0, false, false, p.errAt(j, "control character in string")
		case c >= utf8.RuneSelf && !p.validUTF8:
			// Decoding runes only when the input as a whole is not valid
			// UTF-8 keeps the common case a plain byte loop.
			r, n := utf8.DecodeRune(raw[j:])
			if r == utf8.RuneError && n == 1 {
				badUTF8 = true
			}
			j += n - 1
		}
	}
	return 0, false, false, p.errAt(len(raw), "")
}

// stringValue parses the string at p.raw[i] == '"' and returns its value.
func (p *headerParser) stringValue(i int) (string, int, error) {
	end, escaped, badUTF8, err := p.scanString(i)
	if err != nil {
		return "", 0, err
	}
	if !escaped && !badUTF8 {
		return p.str[i+1 : end-1], end, nil
	}
	return unquote(p.raw[i+1 : end-1]), end, nil
}

// unquote decodes the body of a validated JSON string the way encoding/json
// does, including U+FFFD for invalid UTF-8 and unpaired surrogates.
func unquote(b []byte) string {
	var sb strings.Builder
	sb.Grow(len(b))
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c == '\\':
			switch b[i+1] {
			case 'b':
				sb.WriteByte('\b')
			case 'f':
				sb.WriteByte('\f')
			case 'n':
				sb.WriteByte('\n')
			case 'r':
				sb.WriteByte('\r')
			case 't':
				sb.WriteByte('\t')
			case 'u':
				r := hex4(b[i+2:])
				i += 6
				if isSurrogate(r) {
					if lo := rune(-1); i+6 <= len(b) && b[i] == '\\' && b[i+1] == 'u' {
						lo = hex4(b[i+2:])
						if r < 0xDC00 && lo >= 0xDC00 && lo <= 0xDFFF {
							sb.WriteRune((r-0xD800)<<10 | (lo - 0xDC00) + 0x10000)
							i += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				sb.WriteRune(r)
				continue
			default: // '"', '\\', '/'
				sb.WriteByte(b[i+1])
			}
			i += 2
		case c < utf8.RuneSelf:
			sb.WriteByte(c)
			i++
		default:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				sb.WriteString("\uFFFD")
			} else {
				sb.Write(b[i : i+n])
			}
			i += n
		}
	}
	return sb.String()
}

func isSurrogate(r rune) bool { return r >= 0xD800 && r <= 0xDFFF }

func hex4(b []byte) rune {
	return rune(unhex(b[0]))<<12 | rune(unhex(b[1]))<<8 | rune(unhex(b[2]))<<4 | rune(unhex(b[3]))
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c - 'a' + 10)
	case c >= 'A' && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}

// value validates the JSON value at p.raw[i], nested depth levels deep, and
// returns the index after it and whether its text must be rewritten to be
// compact UTF-8 (it contains whitespace or invalid UTF-8).
func (p *headerParser) value(i, depth int) (end int, dirty bool, err error) {
	raw := p.raw
	if i >= len(raw) {
		return 0, false, p.errAt(i, "")
	}
	switch c := raw[i]; c {
	case '"':
		end, _, bad, err := p.scanString(i)
		return end, bad, err
	case '{', '[':
		if depth > maxDepth {
			return 0, false, &syntaxError{msg: "nesting too deep", offset: i}
		}
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		i++
		j := skipSpace(raw, i)
		dirty = j != i
		i = j
		if i < len(raw) && raw[i] == closer {
			return i + 1, dirty, nil
		}
		for {
			if c == '{' {
				if i >= len(raw) || raw[i] != '"' {
					return 0, false, p.errAt(i, "expected a string key")
				}
				end, _, bad, err := p.scanString(i)
				if err != nil {
					return 0, false, err
				}
				j = skipSpace(raw, end)
				dirty = dirty || bad || j != end
				if j >= len(raw) || raw[j] != ':' {
					return 0, false, p.errAt(j, "expected ':' after key")
				}
				i = skipSpace(raw, j+1)
				dirty = dirty || i != j+1
			}
			end, d, err := p.value(i, depth+1)
			if err != nil {
				return 0, false, err
			}
			i = skipSpace(raw, end)
			dirty = dirty || d || i != end
			if i < len(raw) && raw[i] == ',' {
				j = skipSpace(raw, i+1)
				dirty = dirty || j != i+1
				i = j
				continue
			}
			if i < len(raw) && raw[i] == closer {
				return i + 1, dirty, nil
			}
			return 0, false, p.errAt(i, "expected ',' or '"+string(closer)+"'")
		}
	case 't':
		return p.literal(i, "true")
	case 'f':
		return p.literal(i, "false")
	case 'n':
		return p.literal(i, "null")
	default:
		end, err := p.number(i)
		return end, false, err
	}
}

func (p *headerParser) literal(i int, lit string) (int, bool, error) {
	for k := 0; k < len(lit); k++ {
		if i+k >= len(p.raw) || p.raw[i+k] != lit[k] {
			return 0, false, p.errAt(i+k, "invalid literal")
		}
	}
	return i + len(lit), false, nil
}

func (p *headerParser) number(i int) (int, error) {
	raw := p.raw
	digits := func(i int) (int, error) {
		if i >= len(raw) || raw[i] < '0' || raw[i] > '9' {
			return 0, p.errAt(i, "expected a digit")
		}
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
			i++
		}
		return i, nil
	}
	if i < len(raw) && raw[i] == '-' {
		i++
	}
	var err error
	if i < len(raw) && raw[i] == '0' {
		i++
	} else if i, err = digits(i); err != nil {
		return 0, err
	}
	if i < len(raw) && raw[i] == '.' {
		if i, err = digits(i + 1); err != nil {
			return 0, err
		}
	}
	if i < len(raw) && (raw[i] == 'e' || raw[i] == 'E') {
		i++
		if i < len(raw) && (raw[i] == '+' || raw[i] == '-') {
			i++
		}
		if i, err = digits(i); err != nil {
			return 0, err
		}
	}
	return i, nil
}

// compact returns the text of the validated value p.raw[start:end] without
// insignificant whitespace and with invalid UTF-8 replaced by U+FFFD.
func (p *headerParser) compact(start, end int, dirty bool) string {
	if !dirty {
		return p.str[start:end]
	}
	b := p.raw[start:end]
	var sb strings.Builder
	sb.Grow(len(b))
	inString := false
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case inString && c == '\\':
			sb.WriteByte(c)
			sb.WriteByte(b[i+1])
			i += 2
			continue
		case c == '"':
			inString = !inString
		case !inString && isSpace(c):
			i++
			continue
		case c >= utf8.RuneSelf:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				sb.WriteString("\uFFFD")
			} else {
				sb.Write(b[i : i+n])
			}
			i += n
			continue
		}
		sb.WriteByte(c)
		i++
	}
	return sb.String()
}
