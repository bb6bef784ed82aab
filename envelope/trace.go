package envelope

import "crypto/sha256"

// Trace returns the trace id and W3C traceparent for a message.
//
// When traceparent is a valid W3C traceparent (lowercase hex, version not
// ff, version 00 exactly 55 characters, a later version at least 55
// characters followed by '-' and printable ASCII, trace-id and parent-id not
// all zeros), Trace returns its trace-id and traceparent itself, without
// allocating.
//
// Otherwise Trace starts a new trace derived from messageID: the first 16
// bytes of SHA-256(messageID) are the trace-id, the next 8 the span id, and
// tp is "00-<trace-id>-<span-id>-00": not sampled, because no span with
// that id was ever recorded, and a consumer that continued a sampled trace
// from it would show a root that does not exist (the relay, when it records
// spans, sends its own span's context instead). The derivation is
// deterministic on purpose: delivery is at-least-once, so a row replayed
// after a crash must produce the same envelope, byte for byte, and join the
// same trace as its first delivery; a random id would split one message
// across two traces and make redeliveries look like new messages. The
// result is always a valid traceparent.
func Trace(traceparent, messageID string) (traceID, tp string) {
	if validTraceparent(traceparent) {
		return traceparent[3:35], traceparent
	}
	// Hash from a stack copy: converting a UUID-sized string to []byte
	// would otherwise allocate.
	var sum [sha256.Size]byte
	if len(messageID) <= 64 {
		var buf [64]byte
		n := copy(buf[:], messageID)
		sum = sha256.Sum256(buf[:n])
	} else {
		sum = sha256.Sum256([]byte(messageID))
	}
	// An all-zero id is invalid; with SHA-256 it takes a 2^-64 chance, but
	// the guarantee above should not rest on luck.
	nonZero(sum[:16])
	nonZero(sum[16:24])

	var b [55]byte
	b[0], b[1], b[2] = '0', '0', '-'
	hexEncode(b[3:35], sum[:16])
	b[35] = '-'
	hexEncode(b[36:52], sum[16:24])
	b[52], b[53], b[54] = '-', '0', '0'
	tp = string(b[:])
	return tp[3:35], tp
}

// nonZero sets the last byte of an all-zero id to 1.
func nonZero(id []byte) {
	for _, c := range id {
		if c != 0 {
			return
		}
	}
	id[len(id)-1] = 1
}

func hexEncode(dst, src []byte) {
	for i, c := range src {
		dst[2*i] = lowerHex[c>>4]
		dst[2*i+1] = lowerHex[c&0xF]
	}
}

// validTraceparent implements the parsing rules of W3C Trace Context,
// section "traceparent Header", including those for versions after 00.
func validTraceparent(s string) bool {
	if len(s) < 55 || !isLowerHex(s[0:2]) || s[0:2] == "ff" ||
		s[2] != '-' || s[35] != '-' || s[52] != '-' ||
		!isLowerHex(s[3:35]) || !isLowerHex(s[36:52]) || !isLowerHex(s[53:55]) ||
		allZeros(s[3:35]) || allZeros(s[36:52]) {
		return false
	}
	if s[0:2] == "00" {
		return len(s) == 55
	}
	if len(s) == 55 {
		return true
	}
	if s[55] != '-' {
		return false
	}
	// Later versions may append fields; we pass the value on as given, so
	// refuse anything that could break a broker or HTTP header.
	for i := 56; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7F {
			return false
		}
	}
	return true
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if !lowerHexDigit[s[i]] {
			return false
		}
	}
	return true
}

var lowerHexDigit = func() (t [256]bool) {
	for _, c := range lowerHex {
		t[c] = true
	}
	return t
}()

func allZeros(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '0' {
			return false
		}
	}
	return true
}
