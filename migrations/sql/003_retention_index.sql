
-- Lets postgres.retention find old rows without scanning the table.
CREATE INDEX IF NOT EXISTS outbox_created_at_idx ON {{.Table}} (created_at);
