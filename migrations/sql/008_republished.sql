-- Messages published again while the broker may already hold them
-- (relay.Hooks.Republished): a retry after a retryable failure, `replay`,
-- `recover`. Each process that republishes writes its own row per reason
-- (writer: one id per process run) with its whole count, so a write whose
-- reply was lost can be written again without counting twice, and a relay
-- and a `replay` running at once do not overwrite each other. status and
-- the view add the rows up. A clean run writes no row.
CREATE TABLE IF NOT EXISTS outboxrelay.republished (
    slot       text        NOT NULL,
    writer     text        NOT NULL,
    reason     text        NOT NULL,
    total      bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (slot, writer, reason)
);
GRANT SELECT ON outboxrelay.republished TO PUBLIC;
