package cdc_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/integration/pgserver"
	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

// TestPeek: Peek hands the inserts the slot holds, those committed after
// its creation, up to the WAL position asked for, and leaves the slot
// where it was; a slot another process streams from gives ErrSlotActive.
func TestPeek(t *testing.T) {
	ctx := t.Context()
	srv := pgservertest.Start(t, pgserver.Options{})
	url, err := srv.CreateDatabase(ctx, "peek")
	if err != nil {
		t.Fatal(err)
	}
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	exec := func(sql string) {
		t.Helper()
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	insert := func(from, to int) []string {
		t.Helper()
		rows, err := db.Query(ctx, "INSERT INTO ob (id, v) SELECT g, 'x' FROM generate_series($1::int, $2::int) g RETURNING id::text", from, to)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	lsn := func(sql string) cdc.LSN {
		t.Helper()
		var s string
		if err := db.QueryRow(ctx, sql).Scan(&s); err != nil {
			t.Fatal(err)
		}
		l, err := pglogrepl.ParseLSN(s)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	exec("CREATE TABLE ob (id bigint PRIMARY KEY, v text)")
	exec("CREATE TABLE other (id bigint PRIMARY KEY)")
	exec("CREATE PUBLICATION p FOR TABLE ob WITH (publish = 'insert')")
	insert(1, 5) // before the slot: not in it
	exec("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
	held := insert(6, 10)
	exec("INSERT INTO other VALUES (1)") // not published
	upto := lsn("SELECT pg_current_wal_insert_lsn()::text")
	insert(11, 15) // past upto
	confirmed := lsn("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 's'")

	var got []string
	err = cdc.Peek(ctx, db, "s", "p", upto, func(ins *cdc.Insert) error {
		if ins.Relation.QualifiedName() != "public.ob" {
			t.Errorf("insert into %s, want only public.ob's", ins.Relation.QualifiedName())
		}
		got = append(got, string(ins.Values[0]))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, held) {
		t.Errorf("Peek gave ids %v, want %v: the rows committed after the slot and before %s", got, held, upto)
	}
	if after := lsn("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 's'"); after != confirmed {
		t.Errorf("the slot's confirmed position moved from %s to %s", confirmed, after)
	}

	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	other, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	if err := pglogrepl.StartReplication(ctx, other, "s", 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'p'"}}); err != nil {
		t.Fatal(err)
	}
	err = cdc.Peek(ctx, db, "s", "p", upto, func(*cdc.Insert) error { return nil })
	if !errors.Is(err, cdc.ErrSlotActive) {
		t.Errorf("Peek of a slot another process streams from: %v, want ErrSlotActive", err)
	}
}
