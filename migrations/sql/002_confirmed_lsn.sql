
-- The position the relay recorded before confirming it to PostgreSQL. The
-- slot can never legitimately be ahead of it; if it is, the slot was dropped
-- and re-created (or advanced) behind the relay's back.
-- Columns are added only when missing: ALTER TABLE ... ADD COLUMN IF NOT
-- EXISTS takes an ACCESS EXCLUSIVE lock even when the column exists, and the
-- relay's checkpoint writes would queue behind it.
{{template "addColumn" (args "outboxrelay.checkpoint" "confirmed_lsn" "pg_lsn")}}
