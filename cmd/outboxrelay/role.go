package main

import (
	"context"
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

// roleSQL is the least-privilege role for `outboxrelay run`, in parts:
// each is comment lines then statements. create is the CREATE ROLE part;
// grants are what `migrate --print-role` prints after it and what `migrate
// --grant` runs, so that the two cannot differ.
type roleSQL struct {
	create roleSection
	grants []roleSection
	notes  []string
}

type roleSection struct {
	comments []string
	stmts    []string
}

func buildRoleSQL(role string, o migrations.Options) (roleSQL, error) {
	if role == "" {
		return roleSQL{}, usageErr("migrate: --role must not be empty")
	}
	tables := []string{o.Table}
	if o.Debezium {
		if o.DebeziumTable == "" {
			o.DebeziumTable = "public.outboxevent"
		}
		tables = append(tables, o.DebeziumTable)
	}
	r := pgx.Identifier{role}.Sanitize()
	var out roleSQL
	out.create = roleSection{
		comments: []string{
			"LOGIN to connect, REPLICATION to create and stream from the slot; no SUPERUSER, CREATEDB or CREATEROLE.",
			fmt.Sprintf("Replace the placeholder, or leave it and set the password with psql's \\password %s.", r),
		},
		stmts: []string{fmt.Sprintf("CREATE ROLE %s WITH LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '%s';", r, rolePlaceholder)},
	}
	out.grants = append(out.grants, roleSection{
		comments: []string{"CONNECT is granted to PUBLIC by default; this keeps working where it was revoked."},
		stmts:    []string{fmt.Sprintf("DO $outboxrelay$ BEGIN EXECUTE format('GRANT CONNECT ON DATABASE %%I TO %%I', current_database(), %s); END $outboxrelay$;", literal(role))},
	})
	outbox := roleSection{comments: []string{"The outbox tables: the relay streams their inserts and checks their columns."}}
	schemas := map[string]bool{}
	for _, t := range tables {
		schema, name, err := cdc.SplitTable(t)
		if err != nil {
			return roleSQL{}, usageErr("migrate: %v", err)
		}
		if !schemas[schema] {
			schemas[schema] = true
			outbox.stmts = append(outbox.stmts, fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s;", pgx.Identifier{schema}.Sanitize(), r))
		}
		outbox.stmts = append(outbox.stmts, fmt.Sprintf("GRANT SELECT ON %s TO %s;", pgx.Identifier{schema, name}.Sanitize(), r))
	}
	out.grants = append(out.grants, outbox, roleSection{
		comments: []string{"The relay's own objects: its checkpoint, dead letters (list, replay, purge), parked messages, the count of republished messages, the messages of a sink that is behind and the status view."},
		stmts: []string{
			fmt.Sprintf("GRANT USAGE ON SCHEMA outboxrelay TO %s;", r),
			fmt.Sprintf("GRANT SELECT, INSERT, UPDATE ON outboxrelay.checkpoint TO %s;", r),
			fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON outboxrelay.dead_letters TO %s;", r),
			fmt.Sprintf("GRANT USAGE ON SEQUENCE outboxrelay.dead_letters_id_seq TO %s;", r),
			fmt.Sprintf("GRANT SELECT, INSERT, DELETE ON outboxrelay.parked TO %s;", r),
			fmt.Sprintf("GRANT USAGE ON SEQUENCE outboxrelay.parked_id_seq TO %s;", r),
			fmt.Sprintf("GRANT SELECT, INSERT, UPDATE ON outboxrelay.republished TO %s;", r),
			fmt.Sprintf("GRANT SELECT, INSERT, DELETE ON outboxrelay.spilled TO %s;", r),
			fmt.Sprintf("GRANT USAGE ON SEQUENCE outboxrelay.spilled_id_seq TO %s;", r),
			fmt.Sprintf("GRANT SELECT ON outboxrelay.status TO %s;", r),
		},
	})
	out.notes = append(out.notes, "Only with postgres.retention: the relay deletes old outbox rows.")
	for _, t := range tables {
		schema, name, _ := cdc.SplitTable(t)
		out.notes = append(out.notes, fmt.Sprintf("GRANT DELETE ON %s TO %s;", pgx.Identifier{schema, name}.Sanitize(), r))
	}
	out.notes = append(out.notes, "",
		fmt.Sprintf("The publication %s is created by `outboxrelay migrate`, owned by the role that ran it; the", pgx.Identifier{o.Publication}.Sanitize()),
		"replication slot by migrate when that role has REPLICATION, otherwise by the relay at its first start.",
		"The relay only needs them to exist, and needs no ownership.",
		"Heartbeats (postgres.heartbeat_interval) call pg_logical_emit_message, which PUBLIC may",
		fmt.Sprintf("execute unless an administrator revoked it; then grant EXECUTE on it to %s.", r),
		fmt.Sprintf("pg_hba.conf must admit %s to the outbox database: a logical replication connection", r),
		"matches the database's name, not the keyword replication. Prefer hostssl and scram-sha-256 or cert.")
	return out, nil
}

// printRole writes the SQL that creates a least-privilege role for
// `outboxrelay run`: what the relay reads and writes, nothing more. It is
// meant to be read, then run by the owner of the objects `migrate` created
// (a superuser for CREATE ROLE ... REPLICATION). Every statement but CREATE
// ROLE can be run again.
func printRole(w io.Writer, role string, o migrations.Options) error {
	sql, err := buildRoleSQL(role, o)
	if err != nil {
		return err
	}
	var b strings.Builder
	line := func(s string) { b.WriteString(s + "\n") }
	section := func(s roleSection) {
		for _, c := range s.comments {
			line("-- " + c)
		}
		for _, st := range s.stmts {
			line(st)
		}
		line("")
	}
	line("-- Least-privilege role for `outboxrelay run` (printed by `outboxrelay migrate --print-role`).")
	line("-- Run it after `outboxrelay migrate`, in the outbox database, as a superuser (or a role with")
	line("-- CREATEROLE that owns the outbox tables and the outboxrelay schema). `outboxrelay migrate")
	line("-- --grant ROLE` runs every statement after CREATE ROLE for a role that exists.")
	line("")
	section(sql.create)
	for _, s := range sql.grants {
		section(s)
	}
	for _, n := range sql.notes {
		if n == "" {
			line("")
			continue
		}
		line("-- " + n)
	}
	_, err = io.WriteString(w, b.String())
	return err
}

// grantRole grants the existing role what printRole grants, in one
// transaction. It is idempotent.
func grantRole(ctx context.Context, conn *pgx.Conn, role string, o migrations.Options) error {
	sql, err := buildRoleSQL(role, o)
	if err != nil {
		return err
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)", role).Scan(&exists); err != nil {
		return usageErr("migrate: look up role %s: %v", role, err)
	}
	if !exists {
		return usageErr("migrate: role %s does not exist; create it first (the CREATE ROLE statement of `outboxrelay migrate --print-role --role %s`)", role, role)
	}
	var stmts []string
	for _, s := range sql.grants {
		stmts = append(stmts, s.stmts...)
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, strings.Join(stmts, "\n"), pgx.QueryExecModeSimpleProtocol)
		return err
	})
	if err != nil {
		return usageErr("migrate: grant role %s: %v; run migrate --grant as the owner of the outbox tables and the outboxrelay schema", role, err)
	}
	return nil
}

func literal(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
