package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// confirmTimeout bounds the wait for the slot to confirm the last commit.
// The relay reports its position every status_interval (200ms here).
const confirmTimeout = 15 * time.Second

// waitConfirmed waits until the slot's confirmed_flush_lsn is past commit,
// the commit record of the newest message consumed: from then on PostgreSQL
// may recycle the WAL of every demo transaction.
func waitConfirmed(ctx context.Context, db *pgx.Conn, commit pglogrepl.LSN, rel *runningRelay) error {
	deadline := time.Now().Add(confirmTimeout)
	for {
		var confirmed *string
		err := db.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&confirmed)
		if err != nil {
			return fmt.Errorf("read slot %s: %w", slot, err)
		}
		if confirmed != nil {
			lsn, err := pglogrepl.ParseLSN(*confirmed)
			if err != nil {
				return fmt.Errorf("slot %s: confirmed_flush_lsn: %w", slot, err)
			}
			if lsn > commit {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("slot %s did not confirm past %s within %s", slot, commit, confirmTimeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the checkpoint: %w", ctx.Err())
		case <-rel.failed():
			return rel.exitErr()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// status is one row of the outboxrelay.status view that `outboxrelay
// migrate` creates (the same data as `outboxrelay status --json`).
type status struct {
	Slot              string
	Active            bool
	WALStatus         *string
	ConfirmedFlushLSN *string
	RestartLSN        *string
	CurrentWALLSN     string
	LagBytes          *int64
	DeadLetters       int64
}

func readStatus(ctx context.Context, db *pgx.Conn) (status, error) {
	var st status
	err := db.QueryRow(ctx, `SELECT slot, active, wal_status, confirmed_flush_lsn::text, restart_lsn::text,
			current_wal_lsn::text, lag_bytes, dead_letters
		FROM outboxrelay.status WHERE slot = $1`, slot).Scan(
		&st.Slot, &st.Active, &st.WALStatus, &st.ConfirmedFlushLSN, &st.RestartLSN,
		&st.CurrentWALLSN, &st.LagBytes, &st.DeadLetters)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, fmt.Errorf("slot %s is missing from outboxrelay.status", slot)
	}
	if err != nil {
		return st, fmt.Errorf("read outboxrelay.status: %w", err)
	}
	return st, nil
}

func printStatus(p printer, st status) {
	p.line("slot                 %s", st.Slot)
	p.line("active               %t", st.Active)
	p.line("wal_status           %s", orNull(st.WALStatus))
	p.line("confirmed_flush_lsn  %s", orNull(st.ConfirmedFlushLSN))
	p.line("restart_lsn          %s", orNull(st.RestartLSN))
	p.line("current_wal_lsn      %s", st.CurrentWALLSN)
	if st.LagBytes != nil {
		p.line("lag_bytes            %d", *st.LagBytes)
	} else {
		p.line("lag_bytes            null")
	}
	p.line("dead_letters         %d", st.DeadLetters)
}

func orNull(s *string) string {
	if s == nil {
		return "null"
	}
	return *s
}
