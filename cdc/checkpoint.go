package cdc

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier is what the checkpoint store needs from a connection or pool.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Checkpoints records, in outboxrelay.checkpoint, the position the relay is
// about to confirm to PostgreSQL. Because the relay confirms only positions
// it recorded first, the slot's confirmed_flush_lsn can never be ahead of the
// record; if it is, the slot was replaced behind the relay's back.
type Checkpoints struct {
	DB   Querier
	Slot string
}

// Save records lsn as confirmed for the slot.
func (c Checkpoints) Save(ctx context.Context, lsn LSN) error {
	// GREATEST: a relay that just lost the slot to a standby may still
	// record its late acknowledgements; the record never moves back.
	_, err := c.DB.Exec(ctx, `INSERT INTO outboxrelay.checkpoint AS c (slot, confirmed_lsn, confirmed_at, updated_at) VALUES ($1, $2::pg_lsn, now(), now())
		ON CONFLICT (slot) DO UPDATE SET confirmed_lsn = GREATEST(c.confirmed_lsn, EXCLUDED.confirmed_lsn), confirmed_at = now(), updated_at = now()`, c.Slot, lsn.String())
	if err != nil {
		return fmt.Errorf("record checkpoint: %w", err)
	}
	return nil
}

// Verify fails with a *SetupError when the slot is ahead of the recorded
// position: messages between the two may never have been published.
func (c Checkpoints) Verify(ctx context.Context, slotConfirmed LSN) error {
	var recorded *string
	var restartedSince bool
	err := c.DB.QueryRow(ctx, `SELECT confirmed_lsn::text, coalesce(confirmed_at < pg_postmaster_start_time(), false)
		FROM outboxrelay.checkpoint WHERE slot = $1`, c.Slot).Scan(&recorded, &restartedSince)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && recorded == nil) {
		return nil // first run for this slot
	}
	if err != nil {
		return fmt.Errorf("read checkpoint: %w", err)
	}
	rec, err := pglogrepl.ParseLSN(*recorded)
	if err != nil {
		return fmt.Errorf("parse recorded checkpoint %q: %w", *recorded, err)
	}
	// Bounded: what is confirmed unrecorded during one shutdown is a small
	// stretch of WAL, while a slot re-created later starts wherever the
	// server is by then.
	const unrecordedTolerance = 64 << 20
	if slotConfirmed > rec && restartedSince && slotConfirmed-rec <= unrecordedTolerance {
		// While PostgreSQL shut down, the relay could not record what it
		// confirmed (it confirms unrecorded rather than hold the shutdown
		// up). A slot ahead of the record is then expected, not replaced.
		return c.Save(ctx, slotConfirmed)
	}
	if slotConfirmed > rec {
		return &SetupError{Msg: fmt.Sprintf(
			"replication slot %q is at %s but the relay last confirmed %s: the slot was dropped and re-created or advanced behind the relay's back, and messages in between may be lost; "+
				"stop the relay and run `outboxrelay recover --config FILE` to re-create the slot and republish them from the outbox table",
			c.Slot, slotConfirmed, rec)}
	}
	return nil
}
