-- outboxrelay schema, version 1. Every statement is idempotent.
CREATE SCHEMA IF NOT EXISTS outboxrelay;

{{- define "outboxColumns"}}
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    headers        jsonb       NOT NULL DEFAULT '{}',
    traceparent    text        NULL,
    schema_version int         NOT NULL DEFAULT 1,
    created_at     timestamptz NOT NULL DEFAULT now()
{{- end}}
{{- if .Partitioned}}
-- Range-partitioned by created_at into daily partitions that the relay (or
-- `outboxrelay maintain`) creates ahead of time and drops past the
-- retention; the default partition takes any row outside them.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id             uuid        NOT NULL DEFAULT gen_random_uuid(),
    {{- template "outboxColumns"}},
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE TABLE IF NOT EXISTS {{.DefaultPartition}} PARTITION OF {{.Table}} DEFAULT;
{{- else}}
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    {{- template "outboxColumns"}}
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

-- One row per pgoutput slot: where PostgreSQL is, where the relay is. The
-- columns are the fields of `outboxrelay status --json`, in the same order.
-- On a standby the current position is the replay position. lag_bytes counts
-- from the older of confirmed_flush_lsn and restart_lsn: keepalives move the
-- confirmed position through a transaction the server is still decoding,
-- while restart_lsn stays before it until it is delivered.
DO $outboxrelay$
BEGIN
    -- CREATE OR REPLACE VIEW takes an ACCESS EXCLUSIVE lock, which would
    -- queue every status reader behind it: replace it only when it changed.
    IF obj_description(to_regclass('outboxrelay.status'), 'pg_class') IS DISTINCT FROM 'outboxrelay status, version 2' THEN
CREATE OR REPLACE VIEW outboxrelay.status AS
SELECT s.slot_name::text                                         AS slot,
       true                                                      AS exists,
       s.active,
       s.wal_status,
       s.confirmed_flush_lsn,
       s.restart_lsn,
       w.lsn                                                     AS current_wal_lsn,
       pg_wal_lsn_diff(w.lsn, LEAST(s.confirmed_flush_lsn, s.restart_lsn))::bigint AS lag_bytes,
       pg_wal_lsn_diff(w.lsn, s.restart_lsn)::bigint             AS retained_wal_bytes,
       c.last_lsn                                                AS last_published_lsn,
       c.last_published_at,
       c.last_message_id,
       coalesce(c.published_total, 0)                            AS published_total,
       (SELECT count(*) FROM outboxrelay.dead_letters d
         WHERE d.slot = s.slot_name AND d.replayed_at IS NULL)   AS dead_letters
FROM pg_replication_slots s
CROSS JOIN (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                        ELSE pg_current_wal_lsn() END AS lsn) w
LEFT JOIN outboxrelay.checkpoint c ON c.slot = s.slot_name
WHERE s.plugin = 'pgoutput' AND s.database = current_database();
        COMMENT ON VIEW outboxrelay.status IS 'outboxrelay status, version 2';
    END IF;
END
$outboxrelay$;

-- Any role may read the status (the view counts dead letters with its
-- owner's rights); dead letters themselves hold payloads and stay private.
GRANT USAGE ON SCHEMA outboxrelay TO PUBLIC;
GRANT SELECT ON outboxrelay.status, outboxrelay.checkpoint TO PUBLIC;

DO $outboxrelay$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = {{.PublicationLiteral}}) THEN
        CREATE PUBLICATION {{.Publication}} FOR TABLE {{.Table}}{{if .Debezium}}, {{.DebeziumTable}}{{end}}
            WITH (publish = 'insert', publish_via_partition_root = true);
    END IF;
END
$outboxrelay$;
