package sinks

import (
	"context"
	"errors"
	"testing"

	"github.com/outboxrelay/outboxrelay/relay"
)

// unreachableSink fails to connect and records that it was closed.
type unreachableSink struct{ closed bool }

func (s *unreachableSink) Publish(context.Context, *relay.Message, func(*relay.Message, error)) {}
func (s *unreachableSink) Ready() bool                                                          { return false }
func (s *unreachableSink) Close() error                                                         { s.closed = true; return nil }
func (s *unreachableSink) Connect(context.Context) error                                        { return errors.New("refused") }

func TestOpen(t *testing.T) {
	unreachable := Unreachable("X")
	_, err := Open(t.Context(), "x", (*unreachableSink)(nil), errors.New("bad port"), unreachable)
	if err == nil || err.Error() != "sink.x: bad port" {
		t.Errorf("New failed: got %v, want sink.x: bad port", err)
	}
	s := &unreachableSink{}
	_, err = Open(t.Context(), "x", s, nil, unreachable)
	if err == nil || err.Error() != "cannot reach X: refused" {
		t.Errorf("Connect failed: got %v, want cannot reach X: refused", err)
	}
	if !s.closed {
		t.Error("the sink that could not connect was not closed")
	}
}
