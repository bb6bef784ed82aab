package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Slot is one logical replication slot of the server, as `outboxrelay
// status --all` lists it.
type Slot struct {
	Slot     string `json:"slot"`
	Database string `json:"database"`
	Plugin   string `json:"plugin"`
	Active   bool   `json:"active"`
	// InactiveSince is when the slot was last released (PostgreSQL 17 and
	// later report it); nil when active or not known.
	InactiveSince *time.Time `json:"inactive_since"`
	// RetainedWALBytes is current_wal_lsn - restart_lsn: the WAL the slot
	// keeps on the server's disk.
	RetainedWALBytes int64  `json:"retained_wal_bytes"`
	WALStatus        string `json:"wal_status"`
	RestartLSN       string `json:"restart_lsn"`
	ConfirmedLSN     string `json:"confirmed_flush_lsn"`
	// Checkpoint reports whether outboxrelay.checkpoint has a row for the
	// slot: a relay has consumed it. Nil for slots of other databases,
	// whose checkpoint table this connection cannot see.
	Checkpoint *bool `json:"relay_checkpoint"`
	// Flag is why the slot needs attention, empty when it does not: an
	// inactive slot that retains WAL keeps it until the disk fills.
	Flag string `json:"flag,omitempty"`
}

// ReadSlots returns every logical replication slot of the server, in name
// order. It is safe for concurrent use if q is.
func ReadSlots(ctx context.Context, q Querier) ([]Slot, error) {
	var haveCheckpoint bool
	if err := q.QueryRow(ctx, "SELECT to_regclass('outboxrelay.checkpoint') IS NOT NULL").Scan(&haveCheckpoint); err != nil {
		return nil, fmt.Errorf("look for outboxrelay.checkpoint: %w", err)
	}
	checkpoint := "NULL::boolean"
	if haveCheckpoint {
		checkpoint = "EXISTS (SELECT FROM outboxrelay.checkpoint c WHERE c.slot = s.slot_name)"
	}
	// to_jsonb reads inactive_since where the server has it (17+).
	rows, err := q.Query(ctx, fmt.Sprintf(`
		SELECT s.slot_name::text, coalesce(s.database::text, ''), coalesce(s.plugin::text, ''), s.active,
		       (to_jsonb(s) ->> 'inactive_since')::timestamptz,
		       coalesce(pg_wal_lsn_diff(w.lsn, s.restart_lsn), 0)::bigint, coalesce(s.wal_status, ''),
		       coalesce(s.restart_lsn::text, ''), coalesce(s.confirmed_flush_lsn::text, ''),
		       CASE WHEN s.database = current_database() THEN %s END
		FROM pg_replication_slots s,
		     (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn) w
		WHERE s.slot_type = 'logical'
		ORDER BY s.slot_name`, checkpoint))
	if err != nil {
		return nil, fmt.Errorf("read replication slots: %w", err)
	}
	slots, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Slot, error) {
		var s Slot
		err := r.Scan(&s.Slot, &s.Database, &s.Plugin, &s.Active, &s.InactiveSince, &s.RetainedWALBytes, &s.WALStatus,
			&s.RestartLSN, &s.ConfirmedLSN, &s.Checkpoint)
		if s.InactiveSince != nil {
			t := s.InactiveSince.UTC()
			s.InactiveSince = &t
		}
		switch {
		case s.WALStatus == "lost":
			s.Flag = "WAL lost: drop the slot or recover (wal_status=lost)"
		case !s.Active && s.RetainedWALBytes > 0:
			s.Flag = fmt.Sprintf("inactive and retains %s of WAL: start its relay, or drop it with SELECT pg_drop_replication_slot('%s')", byteSize(s.RetainedWALBytes), s.Slot)
		}
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("read replication slots: %w", err)
	}
	return slots, nil
}
