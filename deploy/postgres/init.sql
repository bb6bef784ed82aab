-- Runs once, when the compose PostgreSQL volume is first initialised
-- (docker-entrypoint-initdb.d), as the postgres superuser in database shop.
--
-- The relay's own role, as the CREATE ROLE of `outboxrelay migrate
-- --print-role` makes it: LOGIN, and REPLICATION to create and stream its
-- slot; no superuser, CREATEDB or CREATEROLE. Nothing is granted here: the
-- tables do not exist yet. The compose `migrate` one-shot runs as postgres,
-- creates the outbox table, the outboxrelay schema, the publication and
-- the slot, and with `--grant outboxrelay` grants this role exactly what
-- `--print-role` grants (SELECT on the outbox; its checkpoint, dead letters
-- and status view), no default privileges and no write access to the outbox.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'outboxrelay') THEN
        CREATE ROLE outboxrelay WITH LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD 'outboxrelay';
    END IF;
END
$$;
