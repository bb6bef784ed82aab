package app

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/store"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/replay"
)

// ensureSlot creates the slot when it is missing and, on the relay's first
// start (no position recorded for the slot), first publishes the outbox
// rows that were committed before the slot could keep them, as
// postgres.backfill says (see backfillTables). created reports whether it
// created the slot.
//
// A slot it creates comes with an exported snapshot, and the rows are read
// in that snapshot: it sees exactly the transactions that committed before
// the slot's consistent point, and the slot streams exactly the later ones,
// so each row is published once. A slot that already exists without a
// record (`migrate --slot` made it, or an earlier first start stopped part
// way) has no snapshot: the rows are read as they are now, and those
// committed since the slot's creation come again from the slot, as
// duplicates. The position is recorded only once the broker has taken
// every row, so a first start that fails is a first start again.
// Concurrent first starts of one slot are serialised with an advisory lock.
func (a *App) ensureSlot(ctx context.Context, conn *pgx.Conn, db store.TxDB, database string) (created bool, err error) {
	cfg, log := a.cfg, a.log
	pg := cfg.Postgres
	cp := store.Checkpoint{DB: conn, Slot: pg.Slot}
	if _, recorded, err := cp.Confirmed(ctx); err != nil || recorded || pg.Backfill == config.BackfillNone {
		if err != nil {
			return false, err
		}
		return a.createSlot(ctx, conn)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext('outboxrelay.first-start'), hashtext($1))", pg.Slot); err != nil {
		return false, fmt.Errorf("lock the first start of slot %s: %w", pg.Slot, err)
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(hashtext('outboxrelay.first-start'), hashtext($1))", pg.Slot)
	}()
	if _, recorded, err := cp.Confirmed(ctx); err != nil || recorded {
		// Another relay's first start finished while this one waited.
		if err != nil {
			return false, err
		}
		return a.createSlot(ctx, conn)
	}
	tables, err := a.backfillTables(ctx, conn)
	if err != nil {
		return false, err
	}
	if len(tables) == 0 {
		return a.createSlot(ctx, conn)
	}
	exists, err := cdc.CheckSlot(ctx, conn, pg.Slot, "postgres.slot", pg.FailoverSlot)
	if err != nil {
		return false, err
	}
	var tx pgx.Tx
	var start cdc.LSN
	var filter replay.Filter
	var held int64 // the rows of tables an existing slot holds, left to the stream
	if !exists {
		snap, err := replay.CreateSlotWithSnapshot(ctx, pg.URL, pg.Slot, "outboxrelay first start", pg.FailoverSlot)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" { // another relay created it after all
			return a.createSlot(ctx, conn)
		}
		if err != nil {
			return false, err
		}
		defer snap.Close(context.WithoutCancel(ctx))
		created, start = true, snap.ConsistentPoint
		if err := cp.SlotCreated(ctx); err != nil {
			return created, err
		}
		if tx, err = snap.Import(ctx, conn); err != nil {
			return created, err
		}
	} else {
		if start, err = slotStart(ctx, conn, pg.Slot); err != nil {
			return false, err
		}
		drop, err := createSlotRows(ctx, conn)
		if err != nil {
			return false, err
		}
		defer drop()
		if tx, err = conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}); err != nil {
			return false, err
		}
		if held, err = a.listSlotRows(ctx, tx, db, tables); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return false, err
		}
		filter.Except = slotRowsTable
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	log.Info("first start: publishing the outbox rows committed before the replication slot's start (postgres.backfill)",
		zap.String("backfill", pg.Backfill), zap.Strings("tables", tables), zap.Bool("slot_created", created), zap.Int64("left_to_slot", held))
	res, err := a.backfill(ctx, tx, db, database, tables, filter)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		if created {
			// As any failed start: leave no slot that nobody reads. The
			// next first start creates it again and publishes these rows.
			if _, derr := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_drop_replication_slot($1)", pg.Slot); derr != nil {
				log.Warn("could not drop the replication slot this start created", zap.String("slot", pg.Slot), zap.Error(derr))
			}
		}
		return false, fmt.Errorf("first start: publish the rows committed before the slot existed: %w; the relay publishes them at its next start", err)
	}
	_ = tx.Rollback(ctx)
	if start != 0 {
		if err := (store.Checkpoint{DB: db, Slot: pg.Slot}).Confirm(ctx, start); err != nil {
			return created, err
		}
	}
	log.Info("first start: published from the outbox tables the rows committed before the replication slot's start; the slot delivers the later ones",
		zap.Int64("published", res.Published), zap.Int("dead_lettered", len(res.DeadLettered)), zap.Int64("filtered", res.Filtered),
		zap.Int64("left_to_slot", held), zap.String("slot_start", start.String()), zap.Bool("slot_created", created))
	return created, nil
}

// slotStart returns the confirmed position of the existing slot: where
// its stream begins.
func slotStart(ctx context.Context, conn *pgx.Conn, slot string) (cdc.LSN, error) {
	var lsn *string
	if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&lsn); err != nil {
		return 0, fmt.Errorf("read replication slot %s: %w", slot, err)
	}
	if lsn == nil {
		return 0, nil
	}
	start, err := pglogrepl.ParseLSN(*lsn)
	if err != nil {
		return 0, fmt.Errorf("parse confirmed_flush_lsn %q: %w", *lsn, err)
	}
	return start, nil
}

// createSlot is cdc.EnsureSlot that records when it created the slot.
func (a *App) createSlot(ctx context.Context, conn *pgx.Conn) (bool, error) {
	pg := a.cfg.Postgres
	created, err := cdc.EnsureSlot(ctx, conn, pg.Slot, "postgres.slot", pg.FailoverSlot)
	if err != nil || !created {
		return created, err
	}
	return created, store.Checkpoint{DB: conn, Slot: pg.Slot}.SlotCreated(ctx)
}

// backfillTables returns the outbox tables whose rows a first start
// publishes. With postgres.backfill: all, every table. With auto, the
// tables that migrate created (outboxrelay.origins), so that every row in
// them came after it, and whose rows no other slot's relay has confirmed:
// a table migrate found may hold rows another tool delivered (Debezium),
// and one another relay consumes has been delivered; those start from now,
// and the log says how to publish them anyway.
func (a *App) backfillTables(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	pg := a.cfg.Postgres
	tables := QualifiedTables(pg.Tables)
	if pg.Backfill == config.BackfillAll {
		return tables, nil
	}
	var origins bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('outboxrelay.origins') IS NOT NULL").Scan(&origins); err != nil {
		return nil, fmt.Errorf("look for outboxrelay.origins: %w", err)
	}
	var out []string
	for _, t := range tables {
		schema, name, err := cdc.SplitTable(t)
		if err != nil {
			return nil, err
		}
		created, relayed := false, false
		if origins {
			err := conn.QueryRow(ctx, `SELECT coalesce((SELECT created FROM outboxrelay.origins WHERE table_schema = $1 AND table_name = $2), false),
					EXISTS (SELECT FROM outboxrelay.checkpoint WHERE slot <> $3 AND confirmed_lsn IS NOT NULL AND $4 = ANY(tables))`,
				schema, name, pg.Slot, t).Scan(&created, &relayed)
			if err != nil {
				return nil, fmt.Errorf("read where the rows of %s begin: %w", t, err)
			}
		}
		if created && !relayed {
			out = append(out, t)
			continue
		}
		why := "migrate did not create it, so it may hold rows that were delivered before"
		if relayed {
			why = "another slot's relay has delivered its rows"
		}
		a.log.Warn("first start: rows committed to this table before the slot was created are not published; set postgres.backfill: all to publish them",
			zap.String("table", t), zap.String("reason", why))
	}
	return slices.Clip(out), nil
}

// backfill publishes every row of tables, read in tx, through a sink of its
// own (non-transactional, like recover's) and waits for the broker.
func (a *App) backfill(ctx context.Context, tx pgx.Tx, db store.TxDB, database string, tables []string, f replay.Filter) (replay.Result, error) {
	cfg := a.cfg
	src := OutboxSource(cfg, database)
	src.Tables = tables
	if n, err := src.Count(ctx, tx, f); err != nil || n == 0 {
		return replay.Result{}, err
	}
	sink, err := OpenSink(ctx, cfg, a.log)
	if err != nil {
		return replay.Result{}, err
	}
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan error, 1)
	if r, ok := sink.(relay.Runner); ok {
		go func() { ran <- r.Run(runCtx) }()
	} else {
		ran <- nil
	}
	// A row the rules drop is counted as the stream counts one.
	pc := replay.PublisherConfig{MaxInFlight: cfg.Relay.MaxInFlight, MaxAttempts: cfg.Relay.MaxAttempts, Filtered: a.filtered}
	if cfg.Relay.DeadLetters {
		pc.DeadLetter = (&store.DeadLetters{DB: db, Slot: cfg.Postgres.Slot}).Add
	}
	pub := replay.NewPublisher(sink, pc, a.log)
	res, err := replay.Republish(ctx, tx, pub, src, f, nil)
	stopRun()
	if rerr := <-ran; rerr != nil && !errors.Is(rerr, context.Canceled) {
		a.log.Warn("sink stopped", zap.Error(rerr))
	}
	if cerr := sink.Close(); cerr != nil {
		a.log.Warn("close sink", zap.Error(cerr))
	}
	if err != nil {
		return res, err
	}
	if n := len(res.Failed) + len(res.Invalid); n > 0 {
		return res, fmt.Errorf("%d messages were refused by the broker or invalid and could not be dead-lettered (see the log)", n)
	}
	return res, nil
}

// filtered counts a row the routing rules drop outside the stream (a first
// start's backfill) in outboxrelay_messages_filtered_total, as the
// stream's Hooks.Filtered counts one.
func (a *App) filtered(route string) {
	if r := a.wired.Load(); r != nil && r.metrics != nil {
		r.metrics.Hooks().Filtered(route)
	}
}
