package status

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
)

// Execer runs a statement: *pgx.Conn and *pgxpool.Pool satisfy it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// published_total grows by the count since the previous write, so that
// several runs of the relay (one after another) add up.
const upsertCheckpoint = `
INSERT INTO outboxrelay.checkpoint AS c (slot, last_lsn, last_message_id, last_published_at, published_total, updated_at)
VALUES ($1, $2::text::pg_lsn, $3, $4, $5, now())
ON CONFLICT (slot) DO UPDATE SET
    last_lsn          = EXCLUDED.last_lsn,
    last_message_id   = EXCLUDED.last_message_id,
    last_published_at = EXCLUDED.last_published_at,
    published_total   = c.published_total + EXCLUDED.published_total,
    updated_at        = now()`

// Writer keeps the relay's progress in outboxrelay.checkpoint: the furthest
// message the broker acknowledged and the number acknowledged. Published
// only records in memory; Run writes at most once per interval, and only
// when something changed, so publishing never waits for PostgreSQL.
type Writer struct {
	db       Execer
	slot     string
	log      *zap.Logger
	interval time.Duration

	mu      sync.Mutex
	changed bool
	pending int64 // acknowledged since the last successful write
	lsn     LSN
	id      string
	at      time.Time
	failing bool // the last write failed; log recovery once
}

// NewWriter returns a Writer for slot that writes through db. It starts nothing.
func NewWriter(db Execer, slot string, log *zap.Logger) *Writer {
	if log == nil {
		log = zap.NewNop()
	}
	return &Writer{db: db, slot: slot, log: log.Named("checkpoint"), interval: time.Second}
}

// Published records that the broker acknowledged m at ackedAt. It has the
// shape of relay.Hooks.Published, takes a mutex for a few assignments and
// never blocks on I/O. Safe for concurrent use. Acknowledgements may arrive
// out of WAL order (several partitions or channels); the message with the
// highest LSN is the one recorded as last published.
func (w *Writer) Published(m *relay.Message, ackedAt time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending++
	w.changed = true
	if lsn := LSN(m.LSN); lsn >= w.lsn {
		w.lsn, w.id, w.at = lsn, m.ID, ackedAt
	}
}

// Run writes the checkpoint every second while something changed, until
// ctx is cancelled; then it writes once more (bounded by 5s, and not
// cancelled by ctx) and returns nil. Cancel ctx only after the relay has
// drained, so that the last write includes every acknowledgement. A failed
// write is logged and retried at the next tick; it never stops the relay.
func (w *Writer) Run(ctx context.Context) error {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = w.Flush(final)
			return nil
		case <-t.C:
			tickCtx, cancel := context.WithTimeout(ctx, 5*w.interval)
			_ = w.Flush(tickCtx)
			cancel()
		}
	}
}

// Flush writes the checkpoint now if something changed since the last
// write. On failure the changes are kept for the next Flush. Run calls it;
// it is safe for concurrent use, but concurrent Flushes may write out of order.
func (w *Writer) Flush(ctx context.Context) error {
	w.mu.Lock()
	if !w.changed {
		w.mu.Unlock()
		return nil
	}
	n, lsn, id, at := w.pending, w.lsn, w.id, w.at
	w.pending, w.changed = 0, false
	w.mu.Unlock()

	var lsnText *string
	if lsn != 0 {
		s := lsn.String()
		lsnText = &s
	}
	_, err := w.db.Exec(ctx, upsertCheckpoint, w.slot, lsnText, id, at, n)

	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.pending += n
		w.changed = true
		if !w.failing {
			w.failing = true
			w.log.Warn("write outboxrelay.checkpoint failed; retrying every second", zap.Error(err))
		}
		return fmt.Errorf("write checkpoint: %w", err)
	}
	if w.failing {
		w.failing = false
		w.log.Info("writing outboxrelay.checkpoint again")
	}
	return nil
}
