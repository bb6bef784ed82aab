package redis

import (
	"bytes"
	"testing"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// The throughput figure comes from
//
//	go test -run '^$' -bench Sink -benchtime 100000x ./sinks/redis
//
// which appends 100,000 messages with 1 KB envelopes over 100 aggregates
// (10 streams) and reports msgs/s: Publish in a loop, as the relay calls
// it, until every batch has been executed.

var benchBody = bytes.Repeat([]byte("x"), 1024)

func BenchmarkSink(b *testing.B) {
	needServer(b)
	f := newFixture(b)
	cfg := f.config()
	cfg.Stream = f.prefix + "{aggregate_type}"
	s := startSink(b, cfg)
	msgs := make([]*relay.Message, 0, b.N)
	for i := range 10 {
		msgs = append(msgs, sinktest.Messages("bench"+string(rune('a'+i)), b.N/10+1, 10)...)
	}
	msgs = msgs[:b.N]
	for _, m := range msgs {
		m.Envelope = benchBody
	}
	sinktest.BenchmarkPublish(b, s, msgs)
}
