package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
)

// published_total ($5) is written whole: what the row held before this
// Progress first wrote (the earlier runs' total) plus what it has
// acknowledged since. A write is then right whether or not an earlier one
// committed: a write whose reply was lost (a partition, a terminated
// session) may have committed, and adding its count again would count it
// twice.
const upsertProgress = `
INSERT INTO outboxrelay.checkpoint AS c (slot, last_lsn, last_message_id, last_published_at, published_total, lag_since, updated_at)
VALUES ($1, $2::text::pg_lsn, $3, $4, $5, $6, now())
ON CONFLICT (slot) DO UPDATE SET
    last_lsn          = EXCLUDED.last_lsn,
    last_message_id   = EXCLUDED.last_message_id,
    last_published_at = EXCLUDED.last_published_at,
    published_total   = EXCLUDED.published_total,
    lag_since         = coalesce(EXCLUDED.lag_since, c.lag_since),
    updated_at        = now()`

const readPublishedTotal = `SELECT published_total FROM outboxrelay.checkpoint WHERE slot = $1`

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
	db       DB
	slot     string
	log      *zap.Logger
	interval time.Duration
	// LagSince, when set before Run, returns the commit time lag counts
	// from (relay.Relay.LagSince; zero while unknown). Each write records
	// it in lag_since, from which the view computes lag_seconds: since the
	// record stops moving when the relay stops or is stuck, lag_seconds
	// goes on growing in PostgreSQL.
	LagSince func() time.Time
	// LagEvery is how often, at most, a lag_since that moved is recorded
	// while nothing is acknowledged (default 10s; the relay sets its
	// heartbeat interval): an idle relay's moves with every keepalive, and
	// recording each would write to the database every second. The
	// database's lag_seconds of an idle relay may be this much older than
	// the relay's own figure. Set before Run.
	LagEvery time.Duration

	mu      sync.Mutex
	changed bool
	// base is published_total as this Progress found it, read before its
	// first write (baseKnown); total counts what it acknowledged since.
	base      int64
	baseKnown bool
	total     int64
	lsn       LSN
	id        string
	at        time.Time
	failing   bool      // the last write failed; log recovery once
	since     time.Time // lag_since recorded by the last successful write
	sinceAt   time.Time // when it was recorded
	// republished counts the messages published again by reason
	// (republished.go), written under writer, this process's id.
	republished        map[string]int64
	republishedChanged bool
	republishedGone    bool // the schema has no outboxrelay.republished
	writer             string
}

// NewProgress returns a Progress for slot that writes through db. It starts nothing.
func NewProgress(db DB, slot string, log *zap.Logger) *Progress {
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
	w.total++
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
	return errors.Join(w.saveProgress(ctx), w.saveRepublished(ctx))
}

// saveProgress writes the checkpoint row's progress columns (Save).
func (w *Progress) saveProgress(ctx context.Context) error {
	var since time.Time
	if w.LagSince != nil {
		since = w.LagSince()
	}
	w.mu.Lock()
	sinceChanged := !since.IsZero() && !since.Equal(w.since)
	// A lag_since that moved forward alone can wait; one that moved back
	// (a new backlog) cannot.
	sinceDue := sinceChanged && (since.Before(w.since) || time.Since(w.sinceAt) >= cmp.Or(w.LagEvery, 10*time.Second))
	if !w.changed && !sinceDue {
		w.mu.Unlock()
		return nil
	}
	changed, total, lsn, id, at := w.changed, w.total, w.lsn, w.id, w.at
	w.changed = false
	w.mu.Unlock()

	base, err := w.readBase(ctx, changed)

	var sinceArg *time.Time
	if !since.IsZero() {
		sinceArg = &since
	}
	if err == nil && changed {
		var lsnText *string
		if lsn != 0 {
			s := lsn.String()
			lsnText = &s
		}
		_, err = w.db.Exec(ctx, upsertProgress, w.slot, lsnText, id, at, base+total, sinceArg)
	} else if err == nil {
		_, err = w.db.Exec(ctx, upsertLagSince, w.slot, sinceArg)
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil && sinceArg != nil {
		w.since, w.sinceAt = since, time.Now()
	}
	if err != nil && changed {
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

// readBase returns published_total as stored before this Progress's first
// write, reading it once: runs of the relay one after another add up. A
// relay that takes over a slot while its predecessor's last write is still
// in flight may read the total without that write, and overwrite it.
func (w *Progress) readBase(ctx context.Context, changed bool) (int64, error) {
	w.mu.Lock()
	base, known := w.base, w.baseKnown
	w.mu.Unlock()
	if known || !changed {
		return base, nil
	}
	err := w.db.QueryRow(ctx, readPublishedTotal, w.slot).Scan(&base)
	if errors.Is(err, pgx.ErrNoRows) {
		base, err = 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read published_total: %w", err)
	}
	w.mu.Lock()
	w.base, w.baseKnown = base, true
	w.mu.Unlock()
	return base, nil
}
