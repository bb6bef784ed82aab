package sinks_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/nats"
	"github.com/outboxrelay/outboxrelay/sinks/rabbitmq"
	"github.com/outboxrelay/outboxrelay/sinks/redis"
)

func TestClosed(t *testing.T) {
	for _, own := range []error{nats.ErrClosed, redis.ErrClosed, rabbitmq.ErrClosed} {
		err := fmt.Errorf("publish to %q: %w", "orders", own)
		if !errors.Is(err, own) || !errors.Is(err, sinks.ErrClosed) || !relay.Retryable(err) {
			t.Errorf("%v: want it to match its own ErrClosed and sinks.ErrClosed, retryable", err)
		}
	}
	if errors.Is(nats.ErrClosed, redis.ErrClosed) {
		t.Error("one sink's ErrClosed matches another's")
	}
	if got := sinks.Closed("nats sink closed").Error(); got != "nats sink closed" {
		t.Errorf("Closed changed the text: %q", got)
	}
}
