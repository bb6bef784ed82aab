
-- Lets postgres.retention find old rows without scanning the table. Created
-- only when missing: CREATE INDEX IF NOT EXISTS locks the table even when the
-- index exists.
DO $outboxrelay$
BEGIN
    IF to_regclass({{.IndexLiteral}}) IS NULL THEN
        CREATE INDEX outbox_created_at_idx ON {{.Table}} (created_at);
    END IF;
END
$outboxrelay$;
