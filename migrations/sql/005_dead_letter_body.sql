
-- The exact message body (any bytes, e.g. a binary CloudEvents payload), its
-- content type and CloudEvents attributes, so that a replay publishes the
-- very message that failed.
ALTER TABLE outboxrelay.dead_letters ADD COLUMN IF NOT EXISTS body bytea;
ALTER TABLE outboxrelay.dead_letters ADD COLUMN IF NOT EXISTS content_type text;
ALTER TABLE outboxrelay.dead_letters ADD COLUMN IF NOT EXISTS attributes jsonb;
