package replay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/internal/store"
	"github.com/outboxrelay/outboxrelay/relay"
)

// SlotState is what recovery needs to know about the slot and the relay's
// record of it.
type SlotState struct {
	Exists, Active, Lost bool
	// Confirmed is the slot's confirmed_flush_lsn.
	Confirmed cdc.LSN
	// Recorded says whether outboxrelay.checkpoint has a confirmed position
	// for the slot; RecordedLSN is it and RecordedAt when the relay last
	// recorded a position or a publish, whichever is older.
	Recorded    bool
	RecordedLSN cdc.LSN
	RecordedAt  time.Time
}

// Healthy reports whether the relay can resume from the slot as it is: it
// exists, has its WAL and is not ahead of the relay's record.
func (s SlotState) Healthy() bool {
	return s.Exists && !s.Lost && (!s.Recorded || s.Confirmed <= s.RecordedLSN)
}

// ReadSlot reads the slot and the relay's checkpoint record.
func ReadSlot(ctx context.Context, db store.DB, slot string) (SlotState, error) {
	var st SlotState
	var confirmed *string
	var walStatus string
	err := db.QueryRow(ctx, `SELECT active, coalesce(wal_status, ''), confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot).
		Scan(&st.Active, &walStatus, &confirmed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return st, fmt.Errorf("read replication slot %s: %w", slot, err)
	default:
		st.Exists = true
		st.Lost = walStatus == "lost" || confirmed == nil
		if confirmed != nil {
			if st.Confirmed, err = pglogrepl.ParseLSN(*confirmed); err != nil {
				return st, err
			}
		}
	}
	st.RecordedLSN, st.Recorded, st.RecordedAt, err = store.Checkpoint{DB: db, Slot: slot}.Recorded(ctx)
	if err != nil {
		return st, err
	}
	return st, nil
}

// RecoverConfig configures Recover.
type RecoverConfig struct {
	// URL is the PostgreSQL URL; Recover adds replication=database for the
	// connection that creates the slot.
	URL  string
	Slot string
	// Since: rows created at or after it are republished.
	Since  time.Time
	Source Source
	// Row, when set, is called for every row before it is published
	// (progress).
	Row func()
}

// RecoverResult is what Recover did.
type RecoverResult struct {
	// ConsistentPoint is where the new slot starts: every transaction that
	// committed before it was republished from the table, every later one
	// is streamed from the slot.
	ConsistentPoint cdc.LSN
	Result
}

// Recover re-creates the slot and republishes, through pub, every row
// created since cfg.Since and committed before the new slot's start, then
// records the slot's start as the relay's checkpoint so that the relay
// resumes from the new slot. The slot must not be in use.
//
// Nothing falls between the two: the slot is created with an exported
// snapshot, and the rows are read in that snapshot, which sees exactly the
// transactions that committed before the slot's consistent point; the slot
// streams exactly the ones after it. A recovery that fails part way can be
// run again: until the last step the record stays behind the new slot, so
// the relay keeps refusing it.
func Recover(ctx context.Context, db *pgx.Conn, pub *Publisher, cfg RecoverConfig) (RecoverResult, error) {
	var res RecoverResult
	st, err := ReadSlot(ctx, db, cfg.Slot)
	if err != nil {
		return res, err
	}
	if st.Active {
		return res, &cdc.SetupError{Msg: fmt.Sprintf("replication slot %s is in use; stop the relay (and any standby) before running recover", cfg.Slot)}
	}
	if st.Exists {
		if _, err := db.Exec(ctx, "SELECT pg_drop_replication_slot($1)", cfg.Slot); err != nil {
			return res, fmt.Errorf("drop replication slot %s: %w", cfg.Slot, err)
		}
	}
	pc, err := pgconn.ParseConfig(cfg.URL)
	if err != nil {
		return res, fmt.Errorf("invalid PostgreSQL URL: %w", err)
	}
	pc.RuntimeParams["replication"] = "database"
	pc.RuntimeParams["application_name"] = "outboxrelay recover"
	repl, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return res, fmt.Errorf("connect for replication: %w", err)
	}
	defer func() { _ = repl.Close(context.WithoutCancel(ctx)) }()
	created, err := pglogrepl.CreateReplicationSlot(ctx, repl, cfg.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{SnapshotAction: "EXPORT_SNAPSHOT"})
	if err != nil {
		return res, fmt.Errorf("create replication slot %s: %w", cfg.Slot, err)
	}
	if res.ConsistentPoint, err = pglogrepl.ParseLSN(created.ConsistentPoint); err != nil {
		return res, fmt.Errorf("parse consistent point %q: %w", created.ConsistentPoint, err)
	}
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return res, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+created.SnapshotName+"'"); err != nil {
		return res, fmt.Errorf("import the new slot's snapshot: %w", err)
	}
	// The snapshot is ours now; the exporting connection may go.
	_ = repl.Close(ctx)

	err = cfg.Source.Scan(ctx, tx, Filter{Since: cfg.Since}, func(m *relay.Message, invalid error) error {
		if cfg.Row != nil {
			cfg.Row()
		}
		if invalid != nil {
			pub.Invalid(m, invalid)
			return nil
		}
		return pub.Publish(ctx, m)
	})
	r, werr := pub.Wait(ctx)
	res.Result = r
	if err = errors.Join(err, werr); err != nil {
		return res, err
	}
	if len(r.Failed) > 0 {
		return res, fmt.Errorf("%d messages were refused by the broker (see the log); the checkpoint was not reset, run recover again once they can be published: %w", len(r.Failed), ErrFailed)
	}
	_ = tx.Rollback(ctx)
	if err := (store.Checkpoint{DB: db, Slot: cfg.Slot}).Reset(ctx, res.ConsistentPoint); err != nil {
		return res, err
	}
	return res, nil
}
