-- Where each outbox table's rows begin for the relay, recorded by the first
-- migrate that names the table, before 001 creates it: when it ran, and
-- whether it created the table (so every row in it came after) or found one
-- that may hold rows another tool (Debezium) delivered. A relay's first start
-- (no slot, no recorded position) reads it to decide which rows to publish
-- from the table before it streams (postgres.backfill). Reruns change nothing.
CREATE SCHEMA IF NOT EXISTS outboxrelay;
CREATE TABLE IF NOT EXISTS outboxrelay.origins (
    table_schema text        NOT NULL,
    table_name   text        NOT NULL,
    created      boolean     NOT NULL,
    migrated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_schema, table_name)
);
GRANT USAGE ON SCHEMA outboxrelay TO PUBLIC;
GRANT SELECT ON outboxrelay.origins TO PUBLIC;
{{- range .Coverage}}
INSERT INTO outboxrelay.origins (table_schema, table_name, created)
SELECT {{.Schema}}, {{.Name}}, NOT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = {{.Schema}} AND c.relname = {{.Name}})
ON CONFLICT DO NOTHING;
{{- end}}

