package kafka

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outboxrelay/outboxrelay/relay"
)

// TestPipelinedLogsNoFlushes checks that a pipelined sink does not log
// franz-go's "flushing" line for each round, while its other info lines
// (the producer id) still reach the log.
func TestPipelinedLogsNoFlushes(t *testing.T) {
	c := newCluster(t)
	core, logs := observer.New(zapcore.InfoLevel)
	s, err := New(Config{Brokers: c.ListenAddrs()}, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if !s.Pipeline() {
		t.Fatal("the sink did not pipeline")
	}
	for i := range 20 {
		m := &relay.Message{ID: "m" + string(rune('a'+i)), AggregateType: "order", AggregateID: "1", EventType: "order.created", Envelope: []byte(`{}`)}
		if err := publishOne(t, s, m); err != nil {
			t.Fatalf("publish %s: %v", m.ID, err)
		}
	}
	if n := logs.FilterMessage("flushing").Len(); n > 0 {
		t.Errorf("%d \"flushing\" lines logged for 20 records, want none", n)
	}
	if logs.FilterMessageSnippet("producer id").Len() == 0 {
		t.Error("no producer id line logged: the client's other info lines are lost too")
	}
}
