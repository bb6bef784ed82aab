-- The messages of a sink that fell behind the others (relay.behind: spill,
-- with a sinks section): the relay stores them here, in commit order (id),
-- instead of holding the slot and every other sink for it, and publishes
-- them from here, each deleted once its sink took it, when the sink has
-- room again. body is the message as built; message holds its other
-- fields as JSON (internal/store/spill.go). commit_lsn is its transaction's:
-- a relay that starts again deletes the messages the slot will deliver again.
CREATE TABLE IF NOT EXISTS outboxrelay.spilled (
    id         bigserial   PRIMARY KEY,
    slot       text        NOT NULL,
    sink       text        NOT NULL,
    message_id text        NOT NULL,
    commit_lsn pg_lsn      NOT NULL,
    message    jsonb       NOT NULL,
    body       bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
DO $outboxrelay$
BEGIN
    IF to_regclass('outboxrelay.spilled_sink') IS NULL THEN
        CREATE INDEX spilled_sink ON outboxrelay.spilled (slot, sink, id);
    END IF;
END
$outboxrelay$;
