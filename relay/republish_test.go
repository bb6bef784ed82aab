package relay

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// TestMayHold: a retryable failure may come after the broker stored the
// message, and its retry counts as republished; a refusal and a publish the
// relay cancelled itself (at a stop) do not.
func TestMayHold(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{errors.New("i/o timeout"), true},
		{fmt.Errorf("produce: %w", context.DeadlineExceeded), true},
		{fmt.Errorf("produce: %w", context.Canceled), false},
		{Permanent(errors.New("message too large")), false},
	} {
		if got := mayHold(c.err); got != c.want {
			t.Errorf("mayHold(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
