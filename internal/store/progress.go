package store

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
)

// published_total grows by the count since the previous write, so that
// several runs of the relay (one after another) add up.
const upsertProgress = `
INSERT INTO outboxrelay.checkpoint AS c (slot, last_lsn, last_message_id, last_published_at, published_total, lag_since, updated_at)
VALUES ($1, $2::text::pg_lsn, $3, $4, $5, $6, now())
ON CONFLICT (slot) DO UPDATE SET
    last_lsn          = EXCLUDED.last_lsn,
    last_message_id   = EXCLUDED.last_message_id,
    last_published_at = EXCLUDED.last_published_at,
    published_total   = c.published_total + EXCLUDED.published_total,
    lag_since         = coalesce(EXCLUDED.lag_since, c.lag_since),
    updated_at        = now()`

// Only lag_since: a relay that acknowledged nothing yet must not clear the
// figures an earlier run recorded.
const upsertLagSince = `
INSERT INTO outboxrelay.checkpoint AS c (slot, lag_since, updated_at) VALUES ($1, $2, now())
ON CONFLICT (slot) DO UPDATE SET lag_since = EXCLUDED.lag_since, updated_at = now()`

// Progress keeps the relay's progress in outboxrelay.checkpoint: the furthest
// message the broker acknowledged, the number acknowledged and the commit
// time lag_seconds counts from. Published only records in memory; Run
// writes at most once per interval, and only when something changed, so
// publishing never waits for PostgreSQL.
type Progress struct {
	db       Execer
	slot     string
	log      *zap.Logger
	interval time.Duration
	// LagSince, when set before Run, returns the commit time lag counts
	// from (relay.Relay.LagSince; zero while unknown). Each write records
	// it in lag_since, from which the view computes lag_seconds: since the
	// record stops moving when the relay stops or is stuck, lag_seconds
	// goes on growing in PostgreSQL.
	LagSince func() time.Time

	mu      sync.Mutex
	changed bool
	pending int64 // acknowledged since the last successful write
	lsn     LSN
	id      string
	at      time.Time
	failing bool      // the last write failed; log recovery once
	since   time.Time // lag_since recorded by the last successful write
}

// NewProgress returns a Progress for slot that writes through db. It starts nothing.
func NewProgress(db Execer, slot string, log *zap.Logger) *Progress {
	if log == nil {
		log = zap.NewNop()
	}
	return &Progress{db: db, slot: slot, log: log.Named("checkpoint"), interval: time.Second}
}

// Published records that the broker acknowledged m at ackedAt. It has the
// shape of relay.Hooks.Published, takes a mutex for a few assignments and
// never blocks on I/O. Safe for concurrent use. Acknowledgements may arrive
// out of WAL order (several partitions or channels); the message with the
// highest LSN is the one recorded as last published.
func (w *Progress) Published(m *relay.Message, ackedAt time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending++
	w.changed = true
	if lsn := LSN(m.LSN); lsn >= w.lsn {
		w.lsn, w.id, w.at = lsn, m.ID, ackedAt
	}
}

// Run writes the progress every second while something changed, until
// ctx is cancelled; then it writes once more (bounded by 5s, and not
// cancelled by ctx) and returns nil. Cancel ctx only after the relay has
// drained, so that the last write includes every acknowledgement. A failed
// write is logged and retried at the next tick; it never stops the relay.
func (w *Progress) Run(ctx context.Context) error {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = w.Save(final)
			return nil
		case <-t.C:
			tickCtx, cancel := context.WithTimeout(ctx, 5*w.interval)
			_ = w.Save(tickCtx)
			cancel()
		}
	}
}

// Save writes the progress now if something changed since the last
// write. On failure the changes are kept for the next Save. Run calls it;
// it is safe for concurrent use, but concurrent Saves may write out of order.
func (w *Progress) Save(ctx context.Context) error {
	var since time.Time
	if w.LagSince != nil {
		since = w.LagSince()
	}
	w.mu.Lock()
	sinceChanged := !since.IsZero() && !since.Equal(w.since)
	if !w.changed && !sinceChanged {
		w.mu.Unlock()
		return nil
	}
	changed, n, lsn, id, at := w.changed, w.pending, w.lsn, w.id, w.at
	w.pending, w.changed = 0, false
	w.mu.Unlock()

	var sinceArg *time.Time
	if !since.IsZero() {
		sinceArg = &since
	}
	var err error
	if changed {
		var lsnText *string
		if lsn != 0 {
			s := lsn.String()
			lsnText = &s
		}
		_, err = w.db.Exec(ctx, upsertProgress, w.slot, lsnText, id, at, n, sinceArg)
	} else {
		_, err = w.db.Exec(ctx, upsertLagSince, w.slot, sinceArg)
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil && sinceArg != nil {
		w.since = since
	}
	if err != nil && changed {
		w.pending += n
		w.changed = true
	}
	if err != nil {
		if !w.failing {
			w.failing = true
			w.log.Warn("write outboxrelay.checkpoint failed; retrying every second", zap.Error(err))
		}
		return fmt.Errorf("write progress to the checkpoint: %w", err)
	}
	if w.failing {
		w.failing = false
		w.log.Info("writing outboxrelay.checkpoint again")
	}
	return nil
}
