package envelope

import "unicode/utf8"

const lowerHex = "0123456789abcdef"

// plainASCII marks the bytes encoding/json copies unescaped with its
// default HTML escaping: printable ASCII except '"', '\\', '<', '>' and
// '&'. DEL (0x7F) is copied as is, as encoding/json does. Bytes from 0x80
// are not plain: they need UTF-8 checks.
var plainASCII = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = true
	}
	for _, c := range `"\<>&` {
		t[c] = false
	}
	return t
}()

// appendString appends s as a JSON string, escaped byte-for-byte as
// encoding/json.Marshal escapes a string: short escapes for \b \f \n \r \t
// \" \\, \u00XX for other control characters and for < > &, \u2028 and
// \u2029 for the line and paragraph separators, and \ufffd for each byte
// that is not part of valid UTF-8.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; ; {
		i += plainPrefix(s[i:])
		if i >= len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', lowerHex[c>>4], lowerHex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', lowerHex[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// plainPrefix returns the length of the longest prefix of s that is all
// plainASCII. Most strings are, so it checks eight bytes at a time; it is a
// separate function so that this loop gets the registers to itself.
func plainPrefix(s string) int {
	i := 0
	for ; i+8 <= len(s); i += 8 {
		if !plainWord(load64(s[i:])) {
			break
		}
	}
	for ; i < len(s) && plainASCII[s[i]]; i++ {
	}
	return i
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// plainWord reports whether the eight bytes of w are all plainASCII: none
// is below 0x20, has its high bit set or equals one of the five escaped
// characters. The bit tricks can flag a byte next to one that really needs
// attention, but never flag a word that needs none, so the answer is exact.
func plainWord(w uint64) bool {
	flagged := (w-0x20*ones)&^w | // bytes below 0x20
		w | // bytes from 0x80
		zeroByte((w^'"'*ones)&^(4*ones)) | // '"' (0x22) and '&' (0x26)
		zeroByte((w^'<'*ones)&^(2*ones)) | // '<' (0x3C) and '>' (0x3E)
		zeroByte(w^'\\'*ones)
	return flagged&highs == 0
}

// zeroByte sets the high bit of a byte in the result if w has a zero byte
// (exact as a whole: no false positives when no byte is zero).
func zeroByte(w uint64) uint64 {
	return (w - ones) &^ w
}

// load64 reads the first eight bytes of s little-endian; the compiler turns
// it into a single load.
func load64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}
