package nats

import (
	"testing"

	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// TestMaxPendingRenamed: the deprecated MaxPending still bounds the
// messages in flight while MaxInFlight is unset or the default.
func TestMaxPendingRenamed(t *testing.T) {
	sinktest.RenamedInt(t, DefaultMaxInFlight, func(old, cur int) int {
		return Config{MaxPending: old, MaxInFlight: cur}.withDefaults().MaxInFlight
	})
}
