
-- Dead letters keep their aggregate's order (relay.dead_letter_order: park).
-- A dead letter with parks = true heads its aggregate: the relay stores the
-- aggregate's later messages in outboxrelay.parked behind it instead of
-- publishing them, until `outboxrelay dlq replay` has republished the head
-- and the whole chain (parks becomes false) or `dlq purge` deleted them.
-- commit_lsn and lsn place a letter in commit order, so that a message
-- redelivered after a restart is recognised as already handled.
{{template "addColumn" (args "outboxrelay.dead_letters" "parks" "boolean")}}
{{template "addColumn" (args "outboxrelay.dead_letters" "commit_lsn" "pg_lsn")}}
{{template "addColumn" (args "outboxrelay.dead_letters" "lsn" "pg_lsn")}}
DO $outboxrelay$
BEGIN
    IF to_regclass('outboxrelay.dead_letters_heads') IS NULL THEN
        CREATE INDEX dead_letters_heads ON outboxrelay.dead_letters (slot, aggregate_type, aggregate_id) WHERE parks;
    END IF;
END
$outboxrelay$;

-- The messages parked behind a head, in the order they are to be published
-- (id). A message redelivered after a restart is stored once (head_id, lsn).
CREATE TABLE IF NOT EXISTS outboxrelay.parked (
    id             bigserial   PRIMARY KEY,
    slot           text        NOT NULL,
    head_id        bigint      NOT NULL,
    message_id     text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    source_table   text        NOT NULL,
    traceparent    text        NOT NULL,
    headers        jsonb       NOT NULL DEFAULT '{}',
    body           bytea       NOT NULL,
    content_type   text,
    attributes     jsonb,
    commit_lsn     pg_lsn      NOT NULL,
    lsn            pg_lsn      NOT NULL,
    committed_at   timestamptz NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
DO $outboxrelay$
BEGIN
    IF to_regclass('outboxrelay.parked_chain') IS NULL THEN
        CREATE UNIQUE INDEX parked_chain ON outboxrelay.parked (head_id, lsn);
    END IF;
END
$outboxrelay$;
