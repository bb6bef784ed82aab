package nats

import (
	"testing"

	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// TestVerifyReader: what the sink published, the verify command's reader
// of the stream reads back, each id once.
func TestVerifyReader(t *testing.T) {
	needServer(t)
	f := newFixture(t, nil)
	cfg := f.config()
	sinktest.CheckVerifyReader(t, startSink(t, cfg), &cfg, sinks.VerifyOptions{}, 50)
}
