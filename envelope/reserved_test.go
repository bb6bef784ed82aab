package envelope

import "testing"

// TestReservedSinkInternal: a row header cannot take the name of a header a
// sink sets for itself (RabbitMQ matches returns by x-outboxrelay-publish-tag).
func TestReservedSinkInternal(t *testing.T) {
	for name, want := range map[string]string{
		"x-outboxrelay-publish-tag": "x-outboxrelay-*",
		"X-OutboxRelay-Anything":    "x-outboxrelay-*",
		"x-outbox":                  "",
		"tenant":                    "",
	} {
		if got := ReservedAs(name); got != want {
			t.Errorf("ReservedAs(%q) = %q, want %q", name, got, want)
		}
	}
}
