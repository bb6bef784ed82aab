
-- How each slot is consumed: the publication and the outbox tables, each
-- with the OID of the table and of its membership in the publication
-- (pg_publication_rel). A relay or a standby started with another
-- configuration refuses to take the slot over (run --accept-config-change
-- overrides), and a table that was replaced or dropped from the publication
-- and added back shows as a changed OID.
{{template "addColumn" (args "outboxrelay.checkpoint" "publication" "text")}}
{{template "addColumn" (args "outboxrelay.checkpoint" "tables" "text[]")}}
{{template "addColumn" (args "outboxrelay.checkpoint" "relations" "jsonb")}}
-- Why the relay last stopped with an error, until it starts again: status
-- reports it while no relay streams from the slot.
{{template "addColumn" (args "outboxrelay.checkpoint" "error" "text")}}
{{template "addColumn" (args "outboxrelay.checkpoint" "error_at" "timestamptz")}}

-- The outbox tables that must stay in their publication. migrate and the
-- relay register them; the event trigger below guards them.
CREATE TABLE IF NOT EXISTS outboxrelay.coverage (
    publication text NOT NULL,
    schema_name text NOT NULL,
    table_name  text NOT NULL,
    PRIMARY KEY (publication, schema_name, table_name)
);
GRANT SELECT ON outboxrelay.coverage TO PUBLIC;
{{range .Coverage}}
INSERT INTO outboxrelay.coverage VALUES ({{$.PublicationLiteral}}, {{.Schema}}, {{.Name}}) ON CONFLICT DO NOTHING;
{{- end}}

-- The coverage guard. A table swap, ALTER PUBLICATION ... DROP TABLE or a
-- publication that stops publishing inserts would let inserts into an outbox
-- table commit without ever reaching the relay: pgoutput decides what to send
-- with the catalog as it was when each change was written. This event
-- trigger runs at the end of every such command, in its transaction:
--   * a new table created under a guarded name is added to the publication
--     in the same transaction, so no insert can precede its coverage, and
--     the slot's record of the table's OID is updated;
--   * any other command on a guarded table or on the publication that
--     leaves a guarded table out of the publication, or the publication
--     without inserts or publish_via_partition_root, or drops the
--     publication, or leaves a partition UNLOGGED or a foreign table, fails
--     with an error naming the fix. DDL on other tables is never refused.
-- Event triggers need a superuser; without one the relay's periodic check
-- (postgres.coverage_interval) is the only guard, and it detects a gap
-- after the fact instead of preventing it.
DO $outboxrelay$
BEGIN
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        RAISE NOTICE 'outboxrelay: the coverage event trigger needs a superuser and was not installed; the relay checks coverage every postgres.coverage_interval instead';
        RETURN;
    END IF;
    CREATE OR REPLACE FUNCTION outboxrelay.guard_coverage() RETURNS event_trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $guard$
    DECLARE
        g record;
        pub record;
        rel regclass;
        member oid;
        unlogged text;
        remote text;
    BEGIN
        IF current_setting('outboxrelay.migrating', true) = 'on' THEN
            RETURN; -- outboxrelay migrate verifies and repairs coverage itself
        END IF;
        FOR g IN SELECT publication, schema_name, table_name FROM outboxrelay.coverage ORDER BY 1, 2, 3 LOOP
            rel := to_regclass(format('%I.%I', g.schema_name, g.table_name));
            -- A table command is checked only when it touched a guarded table,
            -- so that unrelated DDL never fails for the outbox's sake.
            IF tg_tag NOT IN ('ALTER PUBLICATION', 'DROP PUBLICATION') THEN
                CONTINUE WHEN rel IS NULL;
                -- An UNLOGGED partition (SET UNLOGGED, CREATE UNLOGGED TABLE
                -- ... PARTITION OF, ATTACH PARTITION) or outbox table writes
                -- no WAL: its inserts would never reach the relay.
                SELECT string_agg(t.relid::regclass::text, ', ' ORDER BY 1) INTO unlogged
                  FROM pg_partition_tree(rel) t JOIN pg_class c ON c.oid = t.relid
                 WHERE c.relpersistence = 'u';
                IF unlogged IS NOT NULL AND EXISTS (
                    SELECT 1 FROM pg_event_trigger_ddl_commands() c, pg_partition_tree(rel) t
                     WHERE c.classid = 'pg_class'::regclass AND c.objid = t.relid) THEN
                    RAISE EXCEPTION 'outboxrelay: % would leave % of outbox table %.% UNLOGGED, so its inserts would not be written to the WAL and never relayed', tg_tag, unlogged, g.schema_name, g.table_name
                        USING HINT = 'Outbox tables and their partitions must be logged (ALTER TABLE ... SET LOGGED, or CREATE TABLE without UNLOGGED)';
                END IF;
                -- A foreign partition (CREATE FOREIGN TABLE ... PARTITION OF,
                -- ATTACH PARTITION) stores its rows on another server.
                SELECT string_agg(t.relid::regclass::text, ', ' ORDER BY 1) INTO remote
                  FROM pg_partition_tree(rel) t JOIN pg_class c ON c.oid = t.relid
                 WHERE c.relkind = 'f';
                IF remote IS NOT NULL AND EXISTS (
                    SELECT 1 FROM pg_event_trigger_ddl_commands() c, pg_partition_tree(rel) t
                     WHERE c.classid = 'pg_class'::regclass AND c.objid = t.relid) THEN
                    RAISE EXCEPTION 'outboxrelay: % would make % a partition of outbox table %.% that is a foreign table, whose rows are stored on another server and never relayed', tg_tag, remote, g.schema_name, g.table_name
                        USING HINT = 'Outbox partitions must be tables of this server';
                END IF;
                CONTINUE WHEN rel NOT IN (SELECT c.objid FROM pg_event_trigger_ddl_commands() c);
            END IF;
            SELECT p.oid, p.pubinsert, p.pubviaroot, p.puballtables INTO pub FROM pg_publication p WHERE p.pubname = g.publication;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'outboxrelay: % would drop publication %, which relays outbox table %.%', tg_tag, g.publication, g.schema_name, g.table_name
                    USING HINT = 'Keep the publication; to retire the relay, first DELETE FROM outboxrelay.coverage WHERE publication = ' || quote_literal(g.publication);
            END IF;
            IF NOT pub.pubinsert OR NOT pub.pubviaroot THEN
                RAISE EXCEPTION 'outboxrelay: % would leave publication % without publish = insert or publish_via_partition_root, so inserts into %.% would not be relayed', tg_tag, g.publication, g.schema_name, g.table_name
                    USING HINT = format('ALTER PUBLICATION %I SET (publish = ''insert'', publish_via_partition_root = true)', g.publication);
            END IF;
            CONTINUE WHEN rel IS NULL OR pub.puballtables; -- no table of that name: nothing can be inserted into it
            SELECT pr.oid INTO member FROM pg_publication_rel pr WHERE pr.prpubid = pub.oid AND pr.prrelid = rel;
            IF FOUND AND current_setting('server_version_num')::int >= 150000 THEN
                -- PostgreSQL 15+: a row filter or column list would leave
                -- rows or columns out. (Only prepared on 15+, where the
                -- columns exist.)
                IF EXISTS (SELECT 1 FROM pg_publication_rel pr WHERE pr.oid = member AND (pr.prqual IS NOT NULL OR pr.prattrs IS NOT NULL)) THEN
                    RAISE EXCEPTION 'outboxrelay: % would publish outbox table % in publication % with a row filter or column list, so the rows or columns it leaves out would not be relayed', tg_tag, rel, g.publication
                        USING HINT = format('Publish it whole: ALTER PUBLICATION %I ADD TABLE %s, without WHERE or a column list', g.publication, rel);
                END IF;
            END IF;
            CONTINUE WHEN member IS NOT NULL;
            CONTINUE WHEN EXISTS (SELECT 1 FROM pg_publication_tables t
                                  WHERE t.pubname = g.publication AND t.schemaname = g.schema_name AND t.tablename = g.table_name);
            IF tg_tag IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO')
               AND rel IN (SELECT c.objid FROM pg_event_trigger_ddl_commands() c) THEN
                EXECUTE format('ALTER PUBLICATION %I ADD TABLE %s', g.publication, rel);
                SELECT pr.oid INTO member FROM pg_publication_rel pr WHERE pr.prpubid = pub.oid AND pr.prrelid = rel;
                UPDATE outboxrelay.checkpoint c
                   SET relations = jsonb_set(coalesce(c.relations, '{}'), ARRAY[g.schema_name || '.' || g.table_name],
                                             jsonb_build_object('oid', rel::oid::bigint, 'member', member::bigint))
                 WHERE c.publication = g.publication AND c.relations ? (g.schema_name || '.' || g.table_name);
                RAISE NOTICE 'outboxrelay: added the new outbox table % to publication %', rel, g.publication;
            ELSE
                RAISE EXCEPTION 'outboxrelay: % would leave outbox table % out of publication %, so its inserts would not be relayed', tg_tag, rel, g.publication
                    USING HINT = format('Keep it in the publication (ALTER PUBLICATION %I ADD TABLE %s in the same transaction); to stop relaying it, first DELETE FROM outboxrelay.coverage WHERE table_name = %L', g.publication, rel, g.table_name);
            END IF;
        END LOOP;
    END
    $guard$;
    -- A trigger from before CREATE FOREIGN TABLE was guarded is replaced.
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'outboxrelay_coverage' AND 'CREATE FOREIGN TABLE' = ANY (evttags)) THEN
        DROP EVENT TRIGGER IF EXISTS outboxrelay_coverage;
        CREATE EVENT TRIGGER outboxrelay_coverage ON ddl_command_end
            WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'CREATE FOREIGN TABLE', 'ALTER TABLE', 'DROP TABLE',
                         'ALTER PUBLICATION', 'DROP PUBLICATION')
            EXECUTE FUNCTION outboxrelay.guard_coverage();
    END IF;
END
$outboxrelay$;
