package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/migrations"
)

// rolePlaceholder stands for the password in the printed SQL: the operator
// chooses it, and it never has to pass through the relay.
const rolePlaceholder = "CHANGE-ME"

// printRole writes the SQL that creates a least-privilege role for
// `outboxrelay run`: what the relay reads and writes, nothing more. It is
// meant to be read, then run by the owner of the objects `migrate` created
// (a superuser for CREATE ROLE ... REPLICATION). Every statement but CREATE
// ROLE can be run again.
func printRole(w io.Writer, role string, o migrations.Options) error {
	if role == "" {
		return usageErr("migrate: --role must not be empty")
	}
	tables := []string{o.Table}
	if o.Debezium {
		if o.DebeziumTable == "" {
			o.DebeziumTable = "public.outboxevent"
		}
		tables = append(tables, o.DebeziumTable)
	}
	r := pgx.Identifier{role}.Sanitize()
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }

	line("-- Least-privilege role for `outboxrelay run` (printed by `outboxrelay migrate --print-role`).")
	line("-- Run it after `outboxrelay migrate`, in the outbox database, as a superuser (or a role with")
	line("-- CREATEROLE that owns the outbox tables and the outboxrelay schema).")
	line("")
	line("-- LOGIN to connect, REPLICATION to stream from the slot; no SUPERUSER, CREATEDB or CREATEROLE.")
	line("-- Replace the placeholder, or leave it and set the password with psql's \\password %s.", r)
	line("CREATE ROLE %s WITH LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '%s';", r, rolePlaceholder)
	line("")
	line("-- CONNECT is granted to PUBLIC by default; this keeps working where it was revoked.")
	line("DO $outboxrelay$ BEGIN EXECUTE format('GRANT CONNECT ON DATABASE %%I TO %%I', current_database(), %s); END $outboxrelay$;", literal(role))
	line("")
	line("-- The outbox tables: the relay streams their inserts and checks their columns.")
	schemas := map[string]bool{}
	for _, t := range tables {
		schema, name, err := cdc.SplitTable(t)
		if err != nil {
			return usageErr("migrate: %v", err)
		}
		if !schemas[schema] {
			schemas[schema] = true
			line("GRANT USAGE ON SCHEMA %s TO %s;", pgx.Identifier{schema}.Sanitize(), r)
		}
		line("GRANT SELECT ON %s TO %s;", pgx.Identifier{schema, name}.Sanitize(), r)
	}
	line("")
	line("-- The relay's own objects: its checkpoint, dead letters (list, replay, purge), parked messages and the status view.")
	line("GRANT USAGE ON SCHEMA outboxrelay TO %s;", r)
	line("GRANT SELECT, INSERT, UPDATE ON outboxrelay.checkpoint TO %s;", r)
	line("GRANT SELECT, INSERT, UPDATE, DELETE ON outboxrelay.dead_letters TO %s;", r)
	line("GRANT USAGE ON SEQUENCE outboxrelay.dead_letters_id_seq TO %s;", r)
	line("GRANT SELECT, INSERT, DELETE ON outboxrelay.parked TO %s;", r)
	line("GRANT USAGE ON SEQUENCE outboxrelay.parked_id_seq TO %s;", r)
	line("GRANT SELECT ON outboxrelay.status TO %s;", r)
	line("")
	line("-- Only with postgres.retention: the relay deletes old outbox rows.")
	for _, t := range tables {
		schema, name, _ := cdc.SplitTable(t)
		line("-- GRANT DELETE ON %s TO %s;", pgx.Identifier{schema, name}.Sanitize(), r)
	}
	line("")
	line("-- The publication %s and the replication slot are created by `outboxrelay migrate`, owned", pgx.Identifier{o.Publication}.Sanitize())
	line("-- by the role that ran it; the relay only needs them to exist, and needs no ownership.")
	line("-- Heartbeats (postgres.heartbeat_interval) call pg_logical_emit_message, which PUBLIC may")
	line("-- execute unless an administrator revoked it; then grant EXECUTE on it to %s.", r)
	line("-- pg_hba.conf must admit %s to the outbox database: a logical replication connection", r)
	line("-- matches the database's name, not the keyword replication. Prefer hostssl and scram-sha-256 or cert.")
	_, err := io.WriteString(w, b.String())
	return err
}

func literal(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
