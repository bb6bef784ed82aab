-- outboxrelay schema, version 1. Every statement is idempotent.
CREATE SCHEMA IF NOT EXISTS outboxrelay;

{{- if .Partitioned}}
-- Range-partitioned by created_at into daily partitions that the relay (or
-- `outboxrelay maintain`) creates ahead of time and drops past the
-- retention; the default partition takes any row outside them. The column
-- names are postgres.columns'.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    {{printf "%-16s" .ID}} uuid        NOT NULL DEFAULT gen_random_uuid(),
    {{- range .Columns}}
    {{.}},
    {{- end}}
    PRIMARY KEY ({{.ID}}, {{.CreatedAt}})
) PARTITION BY RANGE ({{.CreatedAt}});
CREATE TABLE IF NOT EXISTS {{.DefaultPartition}} PARTITION OF {{.Table}} DEFAULT;
{{- else}}
CREATE TABLE IF NOT EXISTS {{.Table}} (
    {{printf "%-16s" .ID}} uuid        PRIMARY KEY DEFAULT gen_random_uuid()
    {{- range .Columns}},
    {{.}}
    {{- end}}
);
{{- end}}
{{- if .Debezium}}

-- Debezium outbox router shape (id, aggregatetype, aggregateid, type, payload).
CREATE TABLE IF NOT EXISTS {{.DebeziumTable}} (
    id                 uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregatetype      varchar(255) NOT NULL,
    aggregateid        varchar(255) NOT NULL,
    type               varchar(255) NOT NULL,
    payload            jsonb,
    tracingspancontext varchar(256)
);
{{- end}}

-- The relay's progress, one row per slot, written at most about once a second.
CREATE TABLE IF NOT EXISTS outboxrelay.checkpoint (
    slot              text        PRIMARY KEY,
    last_lsn          pg_lsn,
    last_message_id   text,
    last_published_at timestamptz,
    published_total   bigint      NOT NULL DEFAULT 0,
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- Messages the broker would not take after the configured attempts.
CREATE TABLE IF NOT EXISTS outboxrelay.dead_letters (
    id               bigserial   PRIMARY KEY,
    slot             text        NOT NULL,
    message_id       text        NOT NULL,
    destination      text        NOT NULL,
    aggregate_type   text        NOT NULL,
    aggregate_id     text        NOT NULL,
    event_type       text        NOT NULL,
    source_table     text        NOT NULL,
    traceparent      text        NOT NULL,
    headers          jsonb       NOT NULL DEFAULT '{}',
    envelope         text        NOT NULL,
    error            text        NOT NULL,
    attempts         int         NOT NULL,
    first_failed_at  timestamptz NOT NULL,
    last_failed_at   timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    replayed_at      timestamptz
);
-- Guarded by a catalog check: CREATE INDEX IF NOT EXISTS locks the table even
-- when the index exists.
DO $outboxrelay$
BEGIN
    IF to_regclass('outboxrelay.dead_letters_pending') IS NULL THEN
        CREATE INDEX dead_letters_pending ON outboxrelay.dead_letters (slot, id) WHERE replayed_at IS NULL;
    END IF;
END
$outboxrelay$;

-- The view outboxrelay.status is created in 009_lag_seconds.sql: it reads
-- checkpoint columns that later files add.

-- Any role may read the relay's progress (and the view outboxrelay.status,
-- see 009); dead letters themselves hold payloads and stay private.
GRANT USAGE ON SCHEMA outboxrelay TO PUBLIC;
GRANT SELECT ON outboxrelay.checkpoint TO PUBLIC;

DO $outboxrelay$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = {{.PublicationLiteral}}) THEN
        CREATE PUBLICATION {{.Publication}} FOR TABLE {{.Table}}{{if .Debezium}}, {{.DebeziumTable}}{{end}}
            WITH (publish = 'insert', publish_via_partition_root = true);
    END IF;
END
$outboxrelay$;
