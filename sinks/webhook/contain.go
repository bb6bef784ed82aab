package webhook

import (
	"fmt"
	"strings"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/sinks"
)

// owned are the header names a row cannot set on a webhook request: those
// the signing sets, the ones HTTP frames the message with and the
// credentials the sink sends. A row header named so is refused rather than
// dropped, so that the operator sees it.
var owned = []string{
	"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer",
	"upgrade", "expect", "authorization", "proxy-authorization", "proxy-connection",
}

var ownedPrefixes = []string{"webhook-"}

// contained checks the headers hs, whose first own entries are the relay's:
// the rule of every sink (sinks.CheckHeaders: valid UTF-8), then what HTTP
// can carry (a token name; a value without control characters but tab),
// and that a row header does not use a name the sink or HTTP owns. The
// error names the header and the reason; it is meant as a permanent
// failure of the message.
func contained(hs []envelope.Header, own int) error {
	if err := sinks.CheckHeaders(hs); err != nil {
		return err
	}
	for i, h := range hs {
		if !validName(h.Key) {
			return fmt.Errorf("header %q is not a valid HTTP header name (letters, digits and !#$%%&'*+-.^_`|~ only)", h.Key)
		}
		for j := 0; j < len(h.Value); j++ {
			if c := h.Value[j]; (c < 0x20 && c != '\t') || c == 0x7f {
				return fmt.Errorf("header %q has a control character in its value, which HTTP cannot carry", h.Key)
			}
		}
		if i < own {
			continue
		}
		for _, o := range owned {
			if strings.EqualFold(h.Key, o) {
				return fmt.Errorf("row header %q cannot be sent to a webhook: HTTP or the sink sets it; rename it in the row", h.Key)
			}
		}
		for _, p := range ownedPrefixes {
			if len(h.Key) >= len(p) && strings.EqualFold(h.Key[:len(p)], p) {
				return fmt.Errorf("row header %q cannot be sent to a webhook: the Standard Webhooks signing owns the %s headers; rename it in the row", h.Key, p)
			}
		}
	}
	return nil
}

// validName reports whether s is an HTTP token (RFC 9110 field-name).
func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
