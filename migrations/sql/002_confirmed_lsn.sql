
-- The position the relay recorded before confirming it to PostgreSQL. The
-- slot can never legitimately be ahead of it; if it is, the slot was dropped
-- and re-created (or advanced) behind the relay's back.
ALTER TABLE outboxrelay.checkpoint ADD COLUMN IF NOT EXISTS confirmed_lsn pg_lsn;
