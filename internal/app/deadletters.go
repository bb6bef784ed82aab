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
// progress counter). It is `dlq replay` and the management API's replay
// (and so the console's). A letter that is not a valid outbox message is
// refused (store.RefusedError) unless forcedBy names who forces it; each
// forced letter is logged with forcedBy, and recorded in the letter.
func ReplayDeadLetters(ctx context.Context, cfg config.Config, dead *store.DeadLetters, f store.DeadLetterFilter, forcedBy string, wrap func(relay.Sink) relay.Sink, log *zap.Logger) (store.Replayed, error) {
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
	n, err := dead.Replay(ctx, publish, f, store.ReplayOptions{Columns: cfg.Postgres.Columns, ForcedBy: forcedBy})
	for _, id := range n.Forced {
		log.Warn("dead letter published by force, though it is not a valid outbox message", zap.Int64("dead_letter", id), zap.String("forced_by", forcedBy))
	}
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
