package nats

import (
	"bytes"
	"testing"

	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// The throughput figure comes from
//
//	go test -run '^$' -bench Sink -benchtime 100000x ./sinks/nats
//
// which publishes 100,000 messages with 1 KB envelopes over 100 aggregates
// into a file-backed stream and reports msgs/s: Publish in a loop, as the
// relay calls it, until every PubAck is in.

var benchBody = bytes.Repeat([]byte("x"), 1024)

func BenchmarkSink(b *testing.B) {
	needServer(b)
	f := newFixture(b, nil)
	s := startSink(b, f.config())
	msgs := sinktest.Messages("bench", b.N, 100)
	for _, m := range msgs {
		m.Envelope = benchBody
	}
	sinktest.BenchmarkPublish(b, s, msgs)
}
