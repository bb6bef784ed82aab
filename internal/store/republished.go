package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
)

// A writer's row holds its whole count for a reason: writing it again after
// a lost reply counts nothing twice (see migrations 008_republished.sql).
const upsertRepublished = `
INSERT INTO outboxrelay.republished (slot, writer, reason, total, updated_at) VALUES ($1, $2, $3, $4, now())
ON CONFLICT (slot, writer, reason) DO UPDATE SET total = EXCLUDED.total, updated_at = now()`

const readRepublished = `SELECT reason, sum(total)::bigint FROM outboxrelay.republished WHERE slot = $1 GROUP BY reason`

// newWriter returns an id for the rows one process writes.
func newWriter() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24)
	return hex.EncodeToString(b)
}

// undefinedTable reports PostgreSQL's undefined_table: a schema from before
// outboxrelay.republished.
func undefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

// insufficientPrivilege reports PostgreSQL's insufficient_privilege: a role
// made before outboxrelay.republished.
func insufficientPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// Republished counts m as published again for reason. It has the shape of
// relay.Hooks.Republished and never blocks on I/O; Run writes the counts
// with the progress. Safe for concurrent use.
func (w *Progress) Republished(_ *relay.Message, reason string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.republished == nil {
		w.republished = map[string]int64{}
	}
	w.republished[reason]++
	w.republishedChanged = true
}

// saveRepublished writes this process's republished counts when they
// changed. A schema from before outboxrelay.republished is logged once and
// the counts stay in the metrics only.
func (w *Progress) saveRepublished(ctx context.Context) error {
	w.mu.Lock()
	if !w.republishedChanged || w.republishedGone {
		w.mu.Unlock()
		return nil
	}
	counts := maps.Clone(w.republished)
	w.republishedChanged = false
	if w.writer == "" {
		w.writer = newWriter()
	}
	writer := w.writer
	w.mu.Unlock()
	var err error
	for _, reason := range slices.Sorted(maps.Keys(counts)) {
		if _, err = w.db.Exec(ctx, upsertRepublished, w.slot, writer, reason, counts[reason]); err != nil {
			break
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil:
		return nil
	case undefinedTable(err):
		w.republishedGone = true
		w.log.Warn("schema outboxrelay is from an older version without outboxrelay.republished, so status does not count republished messages (the metric does); run `outboxrelay migrate`")
		return nil
	case insufficientPrivilege(err):
		w.republishedGone = true
		w.log.Warn("the relay's role may not write outboxrelay.republished, so status does not count republished messages (the metric does); grant it as `outboxrelay role` prints", zap.Error(err))
		return nil
	default:
		w.republishedChanged = true
		return fmt.Errorf("write outboxrelay.republished: %w", err)
	}
}

// AddRepublished records that a command (`replay`, `recover`) published n
// messages of slot again for reason, as a writer of its own. Nothing is
// written for n = 0. A schema from before outboxrelay.republished records
// nothing and is no error.
func AddRepublished(ctx context.Context, db DB, slot, reason string, n int64, log *zap.Logger) error {
	if n == 0 {
		return nil
	}
	_, err := db.Exec(ctx, upsertRepublished, slot, newWriter(), reason, n)
	if undefinedTable(err) {
		if log != nil {
			log.Warn("schema outboxrelay is from an older version without outboxrelay.republished, so status does not count these republished messages; run `outboxrelay migrate`")
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("write outboxrelay.republished: %w", err)
	}
	return nil
}

// readRepublishedTotals fills s.Republished and s.RepublishedTotal.
func readRepublishedTotals(ctx context.Context, q Querier, s *Status) error {
	older := "schema outboxrelay is from an older version, so republished messages are not counted; run `outboxrelay migrate`"
	rows, err := q.Query(ctx, readRepublished, s.Slot)
	if undefinedTable(err) {
		s.Warnings = append(s.Warnings, older)
		return nil
	}
	if err != nil {
		return fmt.Errorf("read outboxrelay.republished: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var reason string
		var n int64
		if err := rows.Scan(&reason, &n); err != nil {
			return fmt.Errorf("read outboxrelay.republished: %w", err)
		}
		if s.Republished == nil {
			s.Republished = map[string]int64{}
		}
		s.Republished[reason] = n
		s.RepublishedTotal += n
	}
	err = rows.Err()
	if undefinedTable(err) {
		s.Warnings = append(s.Warnings, older)
		return nil
	}
	if err != nil {
		return fmt.Errorf("read outboxrelay.republished: %w", err)
	}
	return nil
}
