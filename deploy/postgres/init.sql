-- Runs once, when the compose PostgreSQL volume is first initialised
-- (docker-entrypoint-initdb.d), as the postgres superuser in database shop.
--
-- The relay connects as its own role: LOGIN and REPLICATION (to create and
-- stream the slot), no superuser. `outboxrelay migrate` runs as the owner
-- (postgres here) and creates the outbox table, the outboxrelay schema and
-- the publication; the default privileges below hand the relay what it
-- needs on the tables migrate creates later.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'outboxrelay') THEN
        CREATE ROLE outboxrelay WITH LOGIN REPLICATION PASSWORD 'outboxrelay';
    END IF;
END
$$;

CREATE SCHEMA IF NOT EXISTS outboxrelay;
GRANT USAGE ON SCHEMA outboxrelay TO outboxrelay;
-- Status, checkpoint and dead letters.
ALTER DEFAULT PRIVILEGES FOR ROLE postgres IN SCHEMA outboxrelay
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO outboxrelay;
ALTER DEFAULT PRIVILEGES FOR ROLE postgres IN SCHEMA outboxrelay
    GRANT USAGE, SELECT ON SEQUENCES TO outboxrelay;
-- The outbox table: read for `dlq replay` and checks; the relay never writes it.
ALTER DEFAULT PRIVILEGES FOR ROLE postgres IN SCHEMA public
    GRANT SELECT ON TABLES TO outboxrelay;
