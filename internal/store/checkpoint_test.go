package store

import (
	"errors"
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/migrations"
)

// TestCheckpoint: each group of the checkpoint's columns reads back what its
// writer wrote, the confirmed position never moves back except by Reset, and
// cdc's setup reads the record through cdc.Record.
func TestCheckpoint(t *testing.T) {
	ctx := t.Context()
	conn := connectT(t, "checkpoint")
	cp := Checkpoint{DB: conn, Slot: "orders"}

	var setupErr *cdc.SetupError
	if err := cp.Ready(ctx); !errors.As(err, &setupErr) || !strings.Contains(err.Error(), "schema outboxrelay is missing") {
		t.Fatalf("Ready before migrate = %v, want the missing-schema SetupError", err)
	}
	if err := migrations.Apply(ctx, conn, migrations.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := cp.Ready(ctx); err != nil {
		t.Fatalf("Ready after migrate: %v", err)
	}
	// A schema from before the dead letters' invalid column is refused
	// with the fix, and migrate brings it back.
	if _, err := conn.Exec(ctx, "ALTER TABLE outboxrelay.dead_letters DROP COLUMN invalid"); err != nil {
		t.Fatal(err)
	}
	if err := cp.Ready(ctx); !errors.As(err, &setupErr) || !strings.Contains(err.Error(), "run `outboxrelay migrate`") {
		t.Fatalf("Ready without dead_letters.invalid = %v, want the older-version SetupError", err)
	}
	if err := migrations.Apply(ctx, conn, migrations.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := cp.Ready(ctx); err != nil {
		t.Fatalf("Ready after migrating again: %v", err)
	}

	if lsn, ok, err := cp.Confirmed(ctx); err != nil || ok {
		t.Fatalf("Confirmed with no row = %s, %t, %v; want nothing", lsn, ok, err)
	}
	if _, ok, err := cp.Consumer(ctx); err != nil || ok {
		t.Fatalf("Consumer with no row = %t, %v; want nothing", ok, err)
	}
	if err := cp.Confirm(ctx, 0x3000); err != nil {
		t.Fatal(err)
	}
	if err := cp.Confirm(ctx, 0x2000); err != nil { // a late acknowledgement
		t.Fatal(err)
	}
	lsn, ok, since, err := cp.Recorded(ctx)
	if err != nil || !ok || lsn != 0x3000 || since.IsZero() {
		t.Fatalf("Recorded = %s, %t, %s, %v; want 0/3000 since the Confirm", lsn, ok, since, err)
	}
	if err := cp.CheckSlot(ctx, 0x3000); err != nil {
		t.Fatalf("CheckSlot at the record: %v", err)
	}
	if err := cp.CheckSlot(ctx, 0x1000); err != nil {
		t.Fatalf("CheckSlot behind the record: %v", err)
	}
	if err := cp.CheckSlot(ctx, 0x4000_0000); !errors.As(err, &setupErr) || !strings.Contains(err.Error(), "outboxrelay recover") {
		t.Fatalf("CheckSlot far ahead of the record = %v, want the replaced-slot SetupError", err)
	}

	state, err := cdc.ReadCoverage(ctx, conn, "outboxrelay", []string{"public.outbox"})
	if err != nil || state.Tables["public.outbox"].OID == 0 {
		t.Fatalf("read coverage: %+v, %v", state, err)
	}
	cur := cdc.Consumer{Publication: "outboxrelay", Tables: []string{"public.outbox"}, Relations: state.Tables}
	if err := cp.RecordError(ctx, errors.New("connect postgres://relay:hunter2@db/app: refused")); err != nil {
		t.Fatal(err)
	}
	var stopErr *string
	if err := conn.QueryRow(ctx, "SELECT error FROM outboxrelay.checkpoint WHERE slot = 'orders'").Scan(&stopErr); err != nil ||
		stopErr == nil || strings.Contains(*stopErr, "hunter2") {
		t.Fatalf("recorded error %v (%v), want it with the password hidden", stopErr, err)
	}
	if err := cp.RecordConsumer(ctx, cur); err != nil {
		t.Fatal(err)
	}
	got, ok, err := cp.Consumer(ctx)
	if err != nil || !ok || got.Publication != cur.Publication || len(got.Tables) != 1 || got.Relations["public.outbox"] != cur.Relations["public.outbox"] {
		t.Fatalf("Consumer = %+v, %t, %v; want %+v", got, ok, err, cur)
	}
	if err := conn.QueryRow(ctx, "SELECT error FROM outboxrelay.checkpoint WHERE slot = 'orders'").Scan(&stopErr); err != nil || stopErr != nil {
		t.Fatalf("error after RecordConsumer = %v (%v), want it cleared", stopErr, err)
	}

	if err := cp.Reset(ctx, 0x1000); err != nil {
		t.Fatal(err)
	}
	if lsn, ok, err := cp.Confirmed(ctx); err != nil || !ok || lsn != 0x1000 {
		t.Fatalf("Confirmed after Reset = %s, %t, %v; want 0/1000", lsn, ok, err)
	}

	// The slot does not exist although the checkpoint has a confirmed
	// position (a failover the slot did not follow): setup refuses rather
	// than create a slot that would skip what was not confirmed.
	_, err = cdc.Prepare(ctx, conn, cp, cdc.Config{Slot: "orders", Publication: "outboxrelay", Tables: []string{"public.outbox"}}, nil)
	if !errors.As(err, &setupErr) || !strings.Contains(err.Error(), "does not exist on this server") {
		t.Fatalf("Prepare with a confirmed position and no slot = %v, want the missing-slot SetupError", err)
	}
	other := Checkpoint{DB: conn, Slot: "billing"}
	if _, err := cdc.Prepare(ctx, conn, other, cdc.Config{Slot: "billing", Publication: "outboxrelay", Tables: []string{"public.outbox"}}, nil); err != nil {
		t.Fatalf("Prepare for a slot never confirmed: %v", err)
	}
}

// TestStatusMissingSlot: for a slot that does not exist, status advises
// what run will do: create it when the relay has confirmed nothing of it,
// refuse and name recover when it has (the slot was dropped).
func TestStatusMissingSlot(t *testing.T) {
	ctx := t.Context()
	conn := connectT(t, "missing_slot")
	if err := migrations.Apply(ctx, conn, migrations.Options{}); err != nil {
		t.Fatal(err)
	}
	st, err := ReadStatus(ctx, conn, "orders")
	if err != nil {
		t.Fatal(err)
	}
	cp := Checkpoint{DB: conn, Slot: "orders"}
	cfg := cdc.Config{Slot: "orders", Publication: "outboxrelay", Tables: []string{"public.outbox"}}
	if _, err := cdc.Prepare(ctx, conn, cp, cfg, nil); err != nil {
		t.Fatalf("run's setup with nothing recorded: %v", err)
	}
	if p := st.Problems(0); len(p) != 1 || !strings.Contains(p[0], "start the relay to create it") {
		t.Errorf("problems with nothing recorded = %q, want the relay to create the slot", p)
	}

	// The slot was dropped after the relay confirmed a position of it.
	if err := cp.Confirm(ctx, 0x3000); err != nil {
		t.Fatal(err)
	}
	st, err = ReadStatus(ctx, conn, "orders")
	if err != nil {
		t.Fatal(err)
	}
	_, refusal := cdc.Prepare(ctx, conn, cp, cfg, nil)
	if refusal == nil || !strings.Contains(refusal.Error(), "outboxrelay recover") {
		t.Fatalf("run's setup with a recorded position = %v, want it to refuse and name recover", refusal)
	}
	if p := st.Problems(0); len(p) != 1 || p[0] != refusal.Error() {
		t.Errorf("status problems = %q, want what run refuses with: %q", p, refusal)
	}
}
