
-- When confirmed_lsn was last recorded: a slot ahead of the record after a
-- PostgreSQL restart is explained by confirmations the relay could not record
-- while the server shut down.
ALTER TABLE outboxrelay.checkpoint ADD COLUMN IF NOT EXISTS confirmed_at timestamptz;
