package sinks

import (
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/envelope"
)

func TestCheckDestination(t *testing.T) {
	for _, ok := range []string{"outbox.order", "zoë.日本", "_outboxrelay_x", "x__outboxrelay_"} {
		if err := CheckDestination("topic", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, c := range []struct{ dest, want string }{
		{"caf\xe9", `topic "caf\xe9" is not valid UTF-8 (byte 0xE9 at offset 3)`},
		{"zoë\xc3", `(byte 0xC3 at offset 4)`},
		{"__outboxrelay_positions", `topic "__outboxrelay_positions" is reserved for the relay's own use`},
	} {
		if err := CheckDestination("topic", c.dest); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error containing %s", c.dest, err, c.want)
		}
	}
}

func TestCheckHeaders(t *testing.T) {
	if err := CheckHeaders([]envelope.Header{{Key: "a", Value: "zoë"}, {Key: "ünï", Value: ""}}); err != nil {
		t.Error(err)
	}
	if err := CheckHeaders([]envelope.Header{{Key: "a", Value: "b"}, {Key: "t", Value: "\xff"}}); err == nil || !strings.Contains(err.Error(), `header "t" value "\xff" is not valid UTF-8`) {
		t.Errorf("bad value: %v", err)
	}
	if err := CheckHeaders([]envelope.Header{{Key: "t\xff", Value: "b"}}); err == nil || !strings.Contains(err.Error(), `header name "t\xff" is not valid UTF-8`) {
		t.Errorf("bad name: %v", err)
	}
}

func TestChar(t *testing.T) {
	for _, c := range []struct {
		s    string
		i    int
		want string
	}{{"café", 3, "'é'"}, {"a b", 1, "' '"}, {"caf\xe9", 3, "the byte 0xE9"}, {"日本", 0, "'日'"}} {
		if got := Char(c.s, c.i); got != c.want {
			t.Errorf("Char(%q, %d) = %s, want %s", c.s, c.i, got, c.want)
		}
	}
}
