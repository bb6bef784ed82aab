package dispatch

import (
	"context"
	"log/slog"
	"time"

	"github.com/outboxrelay/outboxrelay/inbox"
)

// Receive runs raw through in until it has a durable outcome (true) or ctx
// ends (false: abandoned, do not acknowledge). An inbox error means the
// database failed; Receive is idempotent, so it is retried.
func Receive(ctx context.Context, in *inbox.Inbox, h inbox.Handler, log *slog.Logger, what string, raw inbox.Raw) (inbox.Result, bool) {
	var res inbox.Result
	ok := Retry(ctx, log, what, func() (err error) {
		res, err = in.Receive(ctx, raw, h)
		return err
	})
	if ok && res.Outcome == inbox.DeadLettered {
		log.Warn(what+": message dead-lettered", "message_id", res.Message.ID, "error", res.Err)
	}
	return res, ok
}

// ReceiveBatch runs ms, as raw maps them, through in.ReceiveBatch, in one
// transaction, until each has a durable outcome or ctx ends. The Results
// are aligned with ms; a zero Outcome means abandoned (do not acknowledge). The
// undecided messages of a failed call go again, in order, so a message
// whose handler fails falls back to Process (retries, then a dead letter)
// inside ReceiveBatch and never holds the batch back for good.
func ReceiveBatch[T any](ctx context.Context, in *inbox.Inbox, h inbox.Handler, log *slog.Logger, what string, ms []T, raw func(T) inbox.Raw) []inbox.Result {
	raws := make([]inbox.Raw, len(ms))
	for i, m := range ms {
		raws[i] = raw(m)
	}
	results := make([]inbox.Result, len(raws))
	todo := make([]int, len(raws))
	for i := range todo {
		todo[i] = i
	}
	Retry(ctx, log, what, func() error {
		batch := make([]inbox.Raw, len(todo))
		for j, i := range todo {
			batch[j] = raws[i]
		}
		rs, err := in.ReceiveBatch(ctx, batch, h)
		left := todo[:0]
		for j, i := range todo {
			if rs[j].Outcome == 0 {
				left = append(left, i)
				continue
			}
			results[i] = rs[j]
			if rs[j].Outcome == inbox.DeadLettered {
				log.Warn(what+": message dead-lettered", "message_id", rs[j].Message.ID, "error", rs[j].Err)
			}
		}
		todo = left
		return err
	})
	return results
}

// ServeReplays runs the replays an operator requested for in's consumer
// (inbox.Inbox.ReplayRequested) every in.ReplayInterval() until ctx ends,
// logging what each ran and why one failed. It runs beside the runner's
// deliveries: a message of an aggregate being replayed is parked and
// replayed too, or processed after the release (inbox.Inbox.Replay).
func ServeReplays(ctx context.Context, in *inbox.Inbox, h inbox.Handler, log *slog.Logger, what string) {
	t := time.NewTicker(in.ReplayInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		res, err := in.ReplayRequested(ctx, h)
		if res.Processed+res.Duplicates > 0 {
			log.Info(what+": ran requested replays", "processed", res.Processed, "duplicates", res.Duplicates)
		}
		if err != nil && ctx.Err() == nil {
			log.Warn(what+": requested replay failed", "error", err)
		}
	}
}

// StartReplays runs ServeReplays in a goroutine until ctx ends or stop is
// called; stop returns once it has returned. A runner's Run calls it
// first and defers stop.
func StartReplays(ctx context.Context, in *inbox.Inbox, h inbox.Handler, log *slog.Logger, what string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); ServeReplays(ctx, in, h, log, what) }()
	return func() { cancel(); <-done }
}
