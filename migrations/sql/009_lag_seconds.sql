-- Where replication lag in seconds counts from: the commit time of the
-- oldest message the broker has not acknowledged or, when none is pending,
-- of the newest transaction the relay has seen (its heartbeat keeps that
-- recent on an idle relay). The relay records it every second while it
-- moves; when the relay stops or is stuck it stays, so its age, the view's
-- lag_seconds, keeps growing with no relay running.
{{template "addColumn" (args "outboxrelay.checkpoint" "lag_since" "timestamptz")}}

-- One row per pgoutput slot: where PostgreSQL is, where the relay is. The
-- columns are the fields of `outboxrelay status --json`, in the same order.
-- On a standby the current position is the replay position. lag_bytes counts
-- from the older of confirmed_flush_lsn and restart_lsn: keepalives move the
-- confirmed position through a transaction the server is still decoding,
-- while restart_lsn stays before it until it is delivered. lag_seconds is the
-- age of lag_since (see above), so it grows while the relay is down or stuck.
-- Version 3 inserted lag_seconds after lag_bytes, and version 4
-- republished_total after published_total, which CREATE OR REPLACE VIEW
-- cannot do: an older view is dropped first, in this transaction.
DO $outboxrelay$
BEGIN
    -- CREATE OR REPLACE VIEW takes an ACCESS EXCLUSIVE lock, which would
    -- queue every status reader behind it: replace it only when it changed.
    IF obj_description(to_regclass('outboxrelay.status'), 'pg_class') IS DISTINCT FROM 'outboxrelay status, version 4' THEN
        DROP VIEW IF EXISTS outboxrelay.status;
CREATE OR REPLACE VIEW outboxrelay.status AS
SELECT s.slot_name::text                                         AS slot,
       true                                                      AS exists,
       s.active,
       s.wal_status,
       s.confirmed_flush_lsn,
       s.restart_lsn,
       w.lsn                                                     AS current_wal_lsn,
       pg_wal_lsn_diff(w.lsn, LEAST(s.confirmed_flush_lsn, s.restart_lsn))::bigint AS lag_bytes,
       CASE WHEN c.lag_since IS NOT NULL
            THEN GREATEST(0, extract(epoch FROM clock_timestamp() - c.lag_since))::double precision END AS lag_seconds,
       pg_wal_lsn_diff(w.lsn, s.restart_lsn)::bigint             AS retained_wal_bytes,
       c.last_lsn                                                AS last_published_lsn,
       c.last_published_at,
       c.last_message_id,
       coalesce(c.published_total, 0)                            AS published_total,
       (SELECT coalesce(sum(r.total), 0) FROM outboxrelay.republished r
         WHERE r.slot = s.slot_name)::bigint                     AS republished_total,
       (SELECT count(*) FROM outboxrelay.dead_letters d
         WHERE d.slot = s.slot_name AND d.replayed_at IS NULL)   AS dead_letters
FROM pg_replication_slots s
CROSS JOIN (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                        ELSE pg_current_wal_lsn() END AS lsn) w
LEFT JOIN outboxrelay.checkpoint c ON c.slot = s.slot_name
WHERE s.plugin = 'pgoutput' AND s.database = current_database();
        COMMENT ON VIEW outboxrelay.status IS 'outboxrelay status, version 4';
    END IF;
END
$outboxrelay$;

GRANT SELECT ON outboxrelay.status TO PUBLIC;
