package cdc

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// LatePublication is a slot that exists while the publication it would be
// streamed through does not. PostgreSQL decodes a slot's WAL with the
// catalog as it was when each change was written, and pgoutput looks its
// publications up in that catalog, so a publication created now would be
// missing for every change the slot holds from before it. The walsender of
// PostgreSQL 14-17 ends each start at the first of them (publication "P"
// does not exist) while the slot keeps WAL; that of PostgreSQL 18 skips
// them with a warning, so their rows are never sent. A publication must
// therefore exist before the slot that streams through it, and neither the
// relay nor migrate creates one for a slot that is already there.
type LatePublication struct {
	Slot, Publication string
	// Tables are the outbox tables, as schema.name.
	Tables []string
	// Others are the publications that publish the outbox tables now: the
	// slot was likely made with one of them.
	Others []string
	// Consumed is the publication the relay has consumed the slot through,
	// "" when it never has.
	Consumed string
}

// FindLatePublication returns a *LatePublication when slot exists and
// publication pub does not, and nil otherwise. consumed is the publication
// the relay's record says it consumed slot through ("" for none). It
// changes nothing.
func FindLatePublication(ctx context.Context, conn *pgx.Conn, slot, pub string, tables []string, consumed string) (*LatePublication, error) {
	var slotExists, pubExists bool
	var others []string
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1),
			EXISTS (SELECT FROM pg_publication WHERE pubname = $2),
			(SELECT coalesce(array_agg(DISTINCT pubname::text ORDER BY pubname::text), '{}') FROM pg_publication_tables
				WHERE schemaname || '.' || tablename = ANY($3))`, slot, pub, tables).Scan(&slotExists, &pubExists, &others)
	if err != nil {
		return nil, fmt.Errorf("read replication slot %s and publication %s: %w", slot, pub, err)
	}
	if !slotExists || pubExists {
		return nil, nil
	}
	return &LatePublication{Slot: slot, Publication: pub, Tables: tables, Others: others, Consumed: consumed}, nil
}

// Err is the *SetupError that names the mismatch and the two fixes: stream
// through a publication the slot can see, or make the publication and then
// the slot anew. In ModeMigrate the fixes are said for migrate's flags
// (setting is --publication or postgres.publication).
func (l *LatePublication) Err(mode Mode, setting string) error {
	slot, pub := l.Slot, l.Publication
	mismatch := fmt.Sprintf("replication slot %s exists and publication %s does not: PostgreSQL decodes a slot's WAL with the catalog as it was when each change was written, so a publication created now would be missing for the changes %s holds from before it (PostgreSQL 14-17 stop streaming at the first of them, 18 skips them)",
		slot, pub, slot)
	drop := fmt.Sprintf("SELECT pg_drop_replication_slot('%s')", strings.ReplaceAll(slot, "'", "''"))
	if l.Consumed != "" {
		// A relay has consumed the slot: one made anew starts later, and
		// recover republishes what lies between.
		keep := ""
		if l.Consumed != pub {
			keep = fmt.Sprintf("set %s back to %s, through which the relay consumed %s, or ", setting, l.Consumed, slot)
		}
		return &SetupError{Msg: fmt.Sprintf("%s; %sstop every relay on %s, create %s (CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)), then run `outboxrelay recover --config FILE --force`, which makes %s anew after it and republishes the outbox rows since the relay's last recorded position",
			mismatch, keep, slot, pub, displayIdent(pub), displayTables(l.Tables), slot)}
	}
	made := ""
	if len(l.Others) > 0 {
		made = fmt.Sprintf(" (the publications that publish %s now: %s)", strings.Join(l.Tables, ", "), strings.Join(l.Others, ", "))
	}
	again := fmt.Sprintf("start the relay again: it creates %s, then the slot, and first publishes the outbox rows already committed, as postgres.backfill says", pub)
	if mode == ModeMigrate {
		again = fmt.Sprintf("run migrate again: it creates %s, then the slot, and the relay's first start publishes the outbox rows committed before, as postgres.backfill says", pub)
	}
	return &SetupError{Msg: fmt.Sprintf("%s; set %s to the publication %s was made with%s, or drop the slot (%s) and %s",
		mismatch, setting, slot, made, drop, again)}
}

// displayTables writes schema.name tables for SQL in a hint,
// comma-separated, quoting only the names that need it.
func displayTables(tables []string) string {
	out := make([]string, 0, len(tables))
	for _, t := range tables {
		schema, name, err := SplitTable(t)
		if err != nil {
			continue // qualify made them; a name it could not split is not there
		}
		out = append(out, displayIdent(schema)+"."+displayIdent(name))
	}
	return strings.Join(out, ", ")
}
