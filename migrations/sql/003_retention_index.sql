-- Lets postgres.retention find old rows without scanning the table. Here,
-- inside the migration transaction, only for a table this transaction
-- created: nobody can insert into it yet, so the plain build blocks no one.
-- An existing table gets the index from Apply after the transaction, with
-- CREATE INDEX CONCURRENTLY, which does not block the service's inserts
-- (see migrations.go, retentionIndex). Created only when missing: CREATE
-- INDEX IF NOT EXISTS locks the table even when the index exists.
DO $outboxrelay$
BEGIN
    IF to_regclass({{.IndexLiteral}}) IS NULL
       AND (SELECT xmin::text FROM pg_class WHERE oid = {{.TableLiteral}}::regclass) = pg_current_xact_id()::xid::text THEN
        CREATE INDEX outbox_created_at_idx ON {{.Table}} (created_at);
    END IF;
END
$outboxrelay$;
