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
	// Failover creates the new slot as a failover slot
	// (postgres.failover_slot).
	Failover bool
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
// resumes from the new slot. The slot must not be in use. Rows whose
// messages already wait in the slot's dead letters are left there
// (Result.Held); with PublisherConfig.DeadLetter set, rows the broker
// refuses now are dead-lettered and do not stop the recovery.
//
// Nothing falls between the two: the slot is created with an exported
// snapshot, and the rows are read in that snapshot, which sees exactly the
// transactions that committed before the slot's consistent point; the slot
// streams exactly the ones after it. A recovery that fails part way can be
// run again: before it drops the slot it makes sure the checkpoint records
// a position (store.Checkpoint.Hold), and until the last step that record
// stays behind the new slot, so the relay keeps refusing it.
func Recover(ctx context.Context, db *pgx.Conn, pub *Publisher, cfg RecoverConfig) (RecoverResult, error) {
	var res RecoverResult
	st, err := ReadSlot(ctx, db, cfg.Slot)
	if err != nil {
		return res, err
	}
	if st.Active {
		return res, &cdc.SetupError{Msg: fmt.Sprintf("replication slot %s is in use; stop the relay (and any standby) before running recover", cfg.Slot)}
	}
	cp := store.Checkpoint{DB: db, Slot: cfg.Slot}
	if err := cp.Hold(ctx); err != nil {
		return res, err
	}
	if st.Exists {
		if _, err := db.Exec(ctx, "SELECT pg_drop_replication_slot($1)", cfg.Slot); err != nil {
			return res, fmt.Errorf("drop replication slot %s: %w", cfg.Slot, err)
		}
	}
	snap, err := CreateSlotWithSnapshot(ctx, cfg.URL, cfg.Slot, "outboxrelay recover", cfg.Failover)
	if err != nil {
		return res, err
	}
	defer snap.Close(context.WithoutCancel(ctx))
	res.ConsistentPoint = snap.ConsistentPoint
	tx, err := snap.Import(ctx, db)
	if err != nil {
		return res, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	res.Result, err = Republish(ctx, tx, pub, cfg.Source, Filter{Since: cfg.Since, DeadLettered: cfg.Slot}, cfg.Row)
	if err != nil {
		return res, err
	}
	if len(res.Failed) > 0 {
		return res, fmt.Errorf("%d messages were refused by the broker and could not be dead-lettered (see the log); the checkpoint was not reset, run recover again once they can be published: %w", len(res.Failed), ErrFailed)
	}
	_ = tx.Rollback(ctx)
	if err := cp.Reset(ctx, res.ConsistentPoint); err != nil {
		return res, err
	}
	return res, nil
}

// Republish publishes through pub every row f selects, read with db (in the
// snapshot of a new slot), and waits until the broker has settled them all.
func Republish(ctx context.Context, db Querier, pub *Publisher, src Source, f Filter, row func()) (Result, error) {
	err := src.Scan(ctx, db, f, func(m *relay.Message, invalid error) error {
		if row != nil {
			row()
		}
		if invalid != nil { // a row the rules drop too: Invalid counts it
			pub.Invalid(ctx, m, invalid)
			return nil
		}
		return pub.Publish(ctx, m)
	})
	r, werr := pub.Wait(ctx)
	if err = errors.Join(err, werr, r.DeadLetterErr); err != nil {
		return r, err
	}
	return r, nil
}

// Snapshot is a replication slot just created with an exported snapshot:
// the snapshot sees exactly the transactions that committed before the
// slot's consistent point. It lives as long as the replication connection
// that created it, until Import took it over.
type Snapshot struct {
	ConsistentPoint cdc.LSN
	Name            string
	repl            *pgconn.PgConn
}

// CreateSlotWithSnapshot creates the pgoutput slot on a replication
// connection to url (replication=database is added) and exports its
// snapshot. The CREATE_REPLICATION_SLOT ... EXPORT_SNAPSHOT form works on
// every supported version (14-18; the parenthesised options came in 15).
func CreateSlotWithSnapshot(ctx context.Context, url, slot, application string, failover bool) (*Snapshot, error) {
	pc, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("invalid PostgreSQL URL: %w", err)
	}
	pc.RuntimeParams["replication"] = "database"
	pc.RuntimeParams["application_name"] = application
	repl, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect for replication: %w", err)
	}
	sql := fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput EXPORT_SNAPSHOT", pgx.Identifier{slot}.Sanitize())
	if failover {
		// Only PostgreSQL 17 and later have failover slots, and with them
		// the option list.
		sql = fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)", pgx.Identifier{slot}.Sanitize())
	}
	created, err := pglogrepl.ParseCreateReplicationSlot(repl.Exec(ctx, sql))
	if err != nil {
		_ = repl.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("create replication slot %s: %w", slot, err)
	}
	s := &Snapshot{Name: created.SnapshotName, repl: repl}
	if s.ConsistentPoint, err = pglogrepl.ParseLSN(created.ConsistentPoint); err != nil {
		_ = repl.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("parse consistent point %q: %w", created.ConsistentPoint, err)
	}
	return s, nil
}

// Import starts a read-only repeatable-read transaction on db in the
// snapshot, and then closes the replication connection, which the
// snapshot no longer needs.
func (s *Snapshot) Import(ctx context.Context, db *pgx.Conn) (pgx.Tx, error) {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+s.Name+"'"); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("import the new slot's snapshot: %w", err)
	}
	s.Close(ctx)
	return tx, nil
}

// Close closes the replication connection (the snapshot ends with it).
func (s *Snapshot) Close(ctx context.Context) {
	if s.repl != nil {
		_ = s.repl.Close(ctx)
		s.repl = nil
	}
}
