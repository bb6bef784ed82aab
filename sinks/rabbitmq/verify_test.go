package rabbitmq

import (
	"testing"

	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// TestVerifyReader: what the sink published, the verify command's reader
// of a verification queue bound with "#" reads back, each id once.
func TestVerifyReader(t *testing.T) {
	needBroker(t)
	f := newFixture(t, "#")
	cfg := Config{URL: brokerURL, Exchange: f.exchange}
	sinktest.CheckVerifyReader(t, startSink(t, cfg), &cfg, sinks.VerifyOptions{Queue: f.queue}, 50)
}
