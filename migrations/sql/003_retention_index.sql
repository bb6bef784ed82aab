-- Lets postgres.retention find old rows without scanning the table. Here,
-- inside the migration transaction, only for a table this transaction
-- created: nobody can insert into it yet, so the plain build blocks no one.
-- An existing table gets the index from Apply after the transaction, with
-- CREATE INDEX CONCURRENTLY, which does not block the service's inserts
-- (see migrations.go, retentionIndex). Created only when missing: CREATE
-- INDEX IF NOT EXISTS locks the table even when the index exists.
-- A table without a creation time column (postgres.columns.created_at
-- empty) gets none.
{{- if .CreatedAt}}
DO $outboxrelay$
BEGIN
    IF (SELECT xmin::text FROM pg_class WHERE oid = {{.TableLiteral}}::regclass) = pg_current_xact_id()::xid::text THEN
        IF to_regclass({{.IndexLiteral}}) IS NULL THEN
            CREATE INDEX outbox_created_at_idx ON {{.Table}} ({{.CreatedAt}});
        ELSIF to_regclass({{.AltIndexLiteral}}) IS NULL THEN
            -- Index names are per schema: that one is another outbox table's.
            CREATE INDEX {{.AltIndex}} ON {{.Table}} ({{.CreatedAt}});
        END IF;
    END IF;
END
$outboxrelay$;
{{- end}}
