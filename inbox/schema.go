package inbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultSchema is the PostgreSQL schema of the inbox tables unless
// Config.Schema names another.
const DefaultSchema = "inbox"

// schemaSQL creates the inbox tables; {schema} stands for the quoted schema
// name. Every statement is idempotent, so Migrate can run at every start.
//
//   - processed: one row per message a consumer has processed, the dedupe
//     record. Its primary key is what makes a redelivery a duplicate: a
//     second insert of the same (consumer, message_id) waits for the first
//     transaction and then conflicts.
//   - dead_letters: messages that failed every attempt or could not be
//     decoded, with the body as received. state parked holds the message's
//     aggregate; released means a replay ran it and its chain.
//   - parked: messages that arrived behind a parked dead letter of their
//     aggregate, in arrival order (seq), waiting for a replay.
//   - status: a view, one row per consumer with processed records in the
//     window or unreleased dead letters: the newest processed record, the
//     dead letters not released, the aggregates parked and the messages
//     waiting behind them (`outboxrelay inbox status` reads it).
const schemaSQL = `CREATE SCHEMA IF NOT EXISTS {schema};

CREATE TABLE IF NOT EXISTS {schema}.processed (
	consumer       text        NOT NULL,
	message_id     text        NOT NULL,
	aggregate_type text        NOT NULL DEFAULT '',
	aggregate_id   text        NOT NULL DEFAULT '',
	event_type     text        NOT NULL DEFAULT '',
	occurred_at    timestamptz,
	processed_at   timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS processed_consumer_time ON {schema}.processed (consumer, processed_at);

CREATE TABLE IF NOT EXISTS {schema}.dead_letters (
	id             bigserial   PRIMARY KEY,
	consumer       text        NOT NULL,
	message_id     text        NOT NULL,
	aggregate_type text        NOT NULL DEFAULT '',
	aggregate_id   text        NOT NULL DEFAULT '',
	record_key     bytea,
	body           bytea       NOT NULL,
	headers        jsonb       NOT NULL DEFAULT '{}',
	error          text        NOT NULL,
	attempts       integer     NOT NULL,
	state          text        NOT NULL CHECK (state IN ('parked', 'dead', 'released')),
	created_at     timestamptz NOT NULL DEFAULT now(),
	head_done_at   timestamptz,
	released_at    timestamptz
);
CREATE UNIQUE INDEX IF NOT EXISTS dead_letters_message ON {schema}.dead_letters (consumer, message_id) WHERE message_id <> '';
CREATE INDEX IF NOT EXISTS dead_letters_parked ON {schema}.dead_letters (consumer, aggregate_type, aggregate_id) WHERE state = 'parked';

CREATE TABLE IF NOT EXISTS {schema}.parked (
	seq            bigserial   PRIMARY KEY,
	consumer       text        NOT NULL,
	aggregate_type text        NOT NULL,
	aggregate_id   text        NOT NULL,
	message_id     text        NOT NULL,
	record_key     bytea,
	body           bytea       NOT NULL,
	headers        jsonb       NOT NULL DEFAULT '{}',
	parked_at      timestamptz NOT NULL DEFAULT now(),
	UNIQUE (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS parked_aggregate ON {schema}.parked (consumer, aggregate_type, aggregate_id, seq);

-- An operator's Discard: the dead letter's message is given up on, when
-- and why; its chain is replayed without it.
ALTER TABLE {schema}.dead_letters ADD COLUMN IF NOT EXISTS discarded_at timestamptz;
ALTER TABLE {schema}.dead_letters ADD COLUMN IF NOT EXISTS discard_reason text;

-- An operator's requests from outside the consumer (outboxrelay inbox dlq
-- replay and discard), which cannot run its handler: the consumer's
-- runner claims a requested replay (replay_claimed_until, a lease so that
-- one process runs it and a crashed one's claim expires) and runs it;
-- replay_error keeps why the last one failed.
ALTER TABLE {schema}.dead_letters ADD COLUMN IF NOT EXISTS discarded_by text;
ALTER TABLE {schema}.dead_letters ADD COLUMN IF NOT EXISTS replay_requested_at timestamptz;
ALTER TABLE {schema}.dead_letters ADD COLUMN IF NOT EXISTS replay_requested_by text;
ALTER TABLE {schema}.dead_letters ADD COLUMN IF NOT EXISTS replay_claimed_until timestamptz;
ALTER TABLE {schema}.dead_letters ADD COLUMN IF NOT EXISTS replay_error text;
CREATE INDEX IF NOT EXISTS dead_letters_replay_requested ON {schema}.dead_letters (consumer, id) WHERE replay_requested_at IS NOT NULL AND state <> 'released';

-- The consumers are found by a skip scan of processed's primary key, so
-- the view reads a few index pages per consumer, not the table.
CREATE OR REPLACE VIEW {schema}.status AS
WITH RECURSIVE seen(consumer) AS (
	SELECT min(consumer) FROM {schema}.processed
	UNION ALL
	SELECT (SELECT min(p.consumer) FROM {schema}.processed p WHERE p.consumer > s.consumer)
	FROM seen s WHERE s.consumer IS NOT NULL
), consumers AS (
	SELECT consumer FROM seen WHERE consumer IS NOT NULL
	UNION
	SELECT consumer FROM {schema}.dead_letters WHERE state <> 'released'
)
SELECT c.consumer,
	newest.message_id   AS last_message_id,
	newest.processed_at AS last_processed_at,
	(SELECT count(*) FROM {schema}.dead_letters d WHERE d.consumer = c.consumer AND d.state <> 'released') AS dead_letters,
	(SELECT count(*) FROM {schema}.dead_letters d WHERE d.consumer = c.consumer AND d.state = 'parked')    AS parked_aggregates,
	(SELECT count(*) FROM {schema}.parked p WHERE p.consumer = c.consumer)                                  AS parked_messages
FROM consumers c
LEFT JOIN LATERAL (SELECT p.message_id, p.processed_at FROM {schema}.processed p
	WHERE p.consumer = c.consumer ORDER BY p.processed_at DESC LIMIT 1) newest ON true;
`

// SQL returns the statements Migrate runs for schema ("" means
// DefaultSchema), for review or for a migration tool of your own.
func SQL(schema string) string {
	return strings.ReplaceAll(schemaSQL, "{schema}", quoteSchema(schema))
}

// Execer is what Migrate needs: a *pgx.Conn, a *pgxpool.Pool or a pgx.Tx.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Migrate creates the inbox tables in schema ("" means DefaultSchema) if
// they do not exist. It is safe to run at every start and from several
// processes at once (the statements are serialized by an advisory lock
// held for their transaction).
func Migrate(ctx context.Context, db Execer, schema string) error {
	// One multi-statement Exec runs as one implicit transaction.
	q := "SELECT pg_advisory_xact_lock(hashtextextended('outboxrelay inbox migrate', 0));\n" + SQL(schema)
	if _, err := db.Exec(ctx, q); err != nil {
		return fmt.Errorf("create inbox tables in schema %s: %w", quoteSchema(schema), err)
	}
	return nil
}

func quoteSchema(schema string) string {
	if schema == "" {
		schema = DefaultSchema
	}
	return pgx.Identifier{schema}.Sanitize()
}
