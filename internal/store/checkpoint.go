package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// Checkpoint is the checkpoint of one slot: its row of
// outboxrelay.checkpoint. Its methods each read or write one group of
// columns (see the package documentation) and are safe for concurrent use
// if DB is.
type Checkpoint struct {
	DB   DB
	Slot string
}

var _ cdc.Record = Checkpoint{}

// Confirm records lsn as confirmed: the relay calls it before it reports
// lsn to PostgreSQL as flushed (relay.Config.Checkpoint). Because the relay
// confirms only positions it recorded first, the slot's confirmed_flush_lsn
// can never be ahead of the record; if it is, the slot was replaced behind
// the relay's back (CheckSlot).
func (c Checkpoint) Confirm(ctx context.Context, lsn cdc.LSN) error {
	// GREATEST: a relay that just lost the slot to a standby may still
	// record its late acknowledgements; the record never moves back.
	_, err := c.DB.Exec(ctx, `INSERT INTO outboxrelay.checkpoint AS c (slot, confirmed_lsn, confirmed_at, updated_at) VALUES ($1, $2::pg_lsn, now(), now())
		ON CONFLICT (slot) DO UPDATE SET confirmed_lsn = GREATEST(c.confirmed_lsn, EXCLUDED.confirmed_lsn), confirmed_at = now(), updated_at = now()`, c.Slot, lsn.String())
	if err != nil {
		return fmt.Errorf("record checkpoint: %w", err)
	}
	return nil
}

// CheckSlot fails with a *cdc.SetupError when the slot's confirmed_flush_lsn,
// slotConfirmed, is ahead of the recorded confirmed position: messages
// between the two may never have been published (relay.Checkpoint.CheckSlot).
func (c Checkpoint) CheckSlot(ctx context.Context, slotConfirmed cdc.LSN) error {
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
		return c.Confirm(ctx, slotConfirmed)
	}
	if slotConfirmed > rec {
		return &cdc.SetupError{Msg: fmt.Sprintf(
			"replication slot %q is at %s but the relay last confirmed %s: the slot was dropped and re-created or advanced behind the relay's back, and messages in between may be lost; "+
				"stop the relay and run `outboxrelay recover --config FILE` to re-create the slot and republish them from the outbox table",
			c.Slot, slotConfirmed, rec)}
	}
	return nil
}

// Confirmed returns the position last recorded as confirmed; ok is false
// when none is (cdc.Record).
func (c Checkpoint) Confirmed(ctx context.Context) (lsn cdc.LSN, ok bool, err error) {
	lsn, ok, _, err = c.Recorded(ctx)
	return lsn, ok, err
}

// Recorded returns the position last recorded as confirmed (ok is false when
// none is) and since when the checkpoint has not moved: the older of the
// last confirmation and the last publish, zero when neither is recorded.
// Recovery reads it to find where the relay stopped.
func (c Checkpoint) Recorded(ctx context.Context) (lsn cdc.LSN, ok bool, since time.Time, err error) {
	var text *string
	var at *time.Time
	err = c.DB.QueryRow(ctx, `SELECT confirmed_lsn::text,
			CASE WHEN confirmed_at IS NULL THEN last_published_at
			     WHEN last_published_at IS NULL THEN confirmed_at
			     ELSE LEAST(confirmed_at, last_published_at) END
		FROM outboxrelay.checkpoint WHERE slot = $1`, c.Slot).Scan(&text, &at)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, false, time.Time{}, nil
	case err != nil:
		return 0, false, time.Time{}, fmt.Errorf("read outboxrelay.checkpoint of slot %s: %w", c.Slot, err)
	}
	if at != nil {
		since = *at
	}
	if text == nil {
		return 0, false, since, nil
	}
	if lsn, err = pglogrepl.ParseLSN(*text); err != nil {
		return 0, false, since, fmt.Errorf("parse recorded checkpoint %q: %w", *text, err)
	}
	return lsn, true, since, nil
}

// Reset moves the confirmed position to lsn, back or forward, and clears
// the recorded error: recovery calls it once it has republished from a new
// slot whose consistent point is lsn. A slot without a checkpoint is left
// without one (recovery holds one first, see Hold).
func (c Checkpoint) Reset(ctx context.Context, lsn cdc.LSN) error {
	_, err := c.DB.Exec(ctx, `UPDATE outboxrelay.checkpoint SET confirmed_lsn = $2::pg_lsn, confirmed_at = now(), updated_at = now(), error = NULL, error_at = NULL
		WHERE slot = $1`, c.Slot, lsn.String())
	if err != nil {
		return fmt.Errorf("reset the checkpoint record: %w", err)
	}
	return nil
}

// Hold makes sure the checkpoint records a confirmed position, 0/0 when it
// had none, without touching one it has or the times recovery reads
// (Recorded): recovery calls it before it drops or creates the slot, so
// that from then until Reset a relay refuses the new slot (CheckSlot) or its
// absence (cdc's missing-slot check) and a rerun of recovery starts over.
func (c Checkpoint) Hold(ctx context.Context) error {
	_, err := c.DB.Exec(ctx, `INSERT INTO outboxrelay.checkpoint AS c (slot, confirmed_lsn, updated_at) VALUES ($1, '0/0', now())
		ON CONFLICT (slot) DO UPDATE SET confirmed_lsn = coalesce(c.confirmed_lsn, '0/0'), updated_at = now()`, c.Slot)
	if err != nil {
		return fmt.Errorf("hold the checkpoint record: %w", err)
	}
	return nil
}

// SlotCreated records that the slot was created just now, for an operator
// who reads outboxrelay.checkpoint. Whoever creates the slot calls it right
// after. A first start does not read it: the slot itself says which rows
// it holds (one made with SQL has no record).
func (c Checkpoint) SlotCreated(ctx context.Context) error {
	_, err := c.DB.Exec(ctx, `INSERT INTO outboxrelay.checkpoint AS c (slot, slot_created_at, updated_at) VALUES ($1, now(), now())
		ON CONFLICT (slot) DO UPDATE SET slot_created_at = now(), updated_at = now()`, c.Slot)
	if err != nil {
		return fmt.Errorf("record when slot %s was created: %w", c.Slot, err)
	}
	return nil
}

// Consumer returns how the slot was last consumed; ok is false when nothing
// is recorded (cdc.Record).
func (c Checkpoint) Consumer(ctx context.Context) (rec cdc.Consumer, ok bool, err error) {
	var pub *string
	var rels []byte
	err = c.DB.QueryRow(ctx, `SELECT publication, coalesce(tables, '{}'), relations FROM outboxrelay.checkpoint WHERE slot = $1`, c.Slot).
		Scan(&pub, &rec.Tables, &rels)
	if errors.Is(err, pgx.ErrNoRows) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, fmt.Errorf("read checkpoint: %w", err)
	}
	if pub == nil {
		return rec, false, nil
	}
	rec.Publication = *pub
	if len(rels) > 0 {
		if err := json.Unmarshal(rels, &rec.Relations); err != nil {
			return rec, false, fmt.Errorf("read checkpoint relations: %w", err)
		}
	}
	return rec, true, nil
}

// RecordConsumer records how the slot is consumed from now on, and clears
// the recorded error: a relay that records its consumer has started.
func (c Checkpoint) RecordConsumer(ctx context.Context, cur cdc.Consumer) error {
	rels, err := json.Marshal(cur.Relations)
	if err != nil {
		return err
	}
	_, err = c.DB.Exec(ctx, `INSERT INTO outboxrelay.checkpoint AS c (slot, publication, tables, relations, updated_at) VALUES ($1, $2, $3, $4, now())
		ON CONFLICT (slot) DO UPDATE SET publication = EXCLUDED.publication, tables = EXCLUDED.tables, relations = EXCLUDED.relations,
			error = NULL, error_at = NULL`,
		c.Slot, cur.Publication, cur.Tables, rels)
	if err != nil {
		return fmt.Errorf("record how slot %s is consumed: %w", c.Slot, err)
	}
	return nil
}

// RecordError records why the relay stopped, with passwords hidden, for
// status to report.
func (c Checkpoint) RecordError(ctx context.Context, stopErr error) error {
	_, err := c.DB.Exec(ctx, `INSERT INTO outboxrelay.checkpoint AS c (slot, error, error_at, updated_at) VALUES ($1, $2, now(), now())
		ON CONFLICT (slot) DO UPDATE SET error = EXCLUDED.error, error_at = EXCLUDED.error_at`, c.Slot, redact.Text(stopErr.Error()))
	if err != nil {
		return fmt.Errorf("record error: %w", err)
	}
	return nil
}

// Ready fails with a *cdc.SetupError naming the fix when the checkpoint
// cannot be kept: the outboxrelay schema is missing, or from a version
// without the consumer columns (cdc.Record) or the dead letters' invalid
// column, which every dead letter writes: without it the first one would
// stop the relay.
func (c Checkpoint) Ready(ctx context.Context) error {
	var schema bool
	if err := c.DB.QueryRow(ctx, "SELECT to_regclass('outboxrelay.checkpoint') IS NOT NULL").Scan(&schema); err != nil {
		return fmt.Errorf("look for the outboxrelay schema: %w", err)
	}
	if !schema {
		return &cdc.SetupError{Msg: "schema outboxrelay is missing; run `outboxrelay migrate --database-url URL` first"}
	}
	var haveColumns bool
	if err := c.DB.QueryRow(ctx, `SELECT count(*) = 2 FROM pg_attribute WHERE NOT attisdropped AND
		(attrelid = 'outboxrelay.checkpoint'::regclass AND attname = 'relations' OR attrelid = 'outboxrelay.dead_letters'::regclass AND attname = 'invalid')`).Scan(&haveColumns); err != nil {
		return fmt.Errorf("inspect the outboxrelay schema: %w", err)
	}
	if !haveColumns {
		return &cdc.SetupError{Msg: "schema outboxrelay is from an older version; run `outboxrelay migrate` to update it"}
	}
	return nil
}

// LastPublished returns the position of the furthest message the broker
// acknowledged, as Progress last wrote it (at most a second late, and not
// at all past a kill); ok is false when none is recorded.
func (c Checkpoint) LastPublished(ctx context.Context) (lsn cdc.LSN, ok bool, err error) {
	var text *string
	err = c.DB.QueryRow(ctx, `SELECT last_lsn::text FROM outboxrelay.checkpoint WHERE slot = $1`, c.Slot).Scan(&text)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && text == nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read checkpoint: %w", err)
	}
	v, err := pglogrepl.ParseLSN(*text)
	if err != nil {
		return 0, false, fmt.Errorf("parse last published position %q: %w", *text, err)
	}
	return cdc.LSN(v), true, nil
}
