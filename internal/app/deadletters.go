package app

import (
	"context"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/store"
	"github.com/outboxrelay/outboxrelay/relay"
)

// SinkError is a ReplayDeadLetters error that is the sink's failing to
// open: a configuration or broker problem, not a replay's. Its text is
// OpenSink's.
type SinkError struct{ Err error }

func (e *SinkError) Error() string { return e.Err.Error() }
func (e *SinkError) Unwrap() error { return e.Err }

// ReplayDeadLetters publishes the dead letters f selects again, with
// their parked chains, through a sink of its own opened from cfg
// (OpenSink), run and closed here; wrap, when set, wraps that sink (a
// progress counter). It is `dlq replay` and the management API's replay.
func ReplayDeadLetters(ctx context.Context, cfg config.Config, dead *store.DeadLetters, f store.DeadLetterFilter, wrap func(relay.Sink) relay.Sink, log *zap.Logger) (store.Replayed, error) {
	sink, err := OpenSink(ctx, cfg, log)
	if err != nil {
		return store.Replayed{}, &SinkError{Err: err}
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if r, ok := sink.(relay.Runner); ok {
			_ = r.Run(runCtx)
		}
	}()
	var publish = sink
	if wrap != nil {
		publish = wrap(sink)
	}
	n, err := dead.Replay(ctx, publish, f)
	cancel()
	<-done
	if cerr := sink.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return n, err
}

// DeadLetters is the App's slot's dead letters on its state pool, nil
// before the App has connected.
func (a *App) DeadLetters() *store.DeadLetters {
	r := a.wired.Load()
	if r == nil {
		return nil
	}
	return &store.DeadLetters{DB: r.dur.pool, Slot: r.cfg.Postgres.Slot}
}
