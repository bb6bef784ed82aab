package nats

import "testing"

// TestMaxPendingRenamed: the deprecated MaxPending still bounds the
// messages in flight when MaxInFlight is unset or the default.
func TestMaxPendingRenamed(t *testing.T) {
	for _, c := range []Config{{MaxPending: 7}, {MaxPending: 7, MaxInFlight: DefaultMaxInFlight}} {
		if got := c.withDefaults().MaxInFlight; got != 7 {
			t.Errorf("%+v: MaxInFlight %d, want 7", c, got)
		}
	}
	if got := (Config{MaxPending: 7, MaxInFlight: 9}).withDefaults().MaxInFlight; got != 9 {
		t.Errorf("MaxInFlight %d, want 9: the new key wins", got)
	}
}
