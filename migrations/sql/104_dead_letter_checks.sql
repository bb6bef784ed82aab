-- A replay checks a dead letter as the relay checks a row (issue 42):
-- invalid is true for a letter the relay refused to build (no broker ever
-- refused it), and `dlq replay` refuses such a letter unless the operator
-- forces it. replay_forced_by records who did, with replayed_at saying
-- when. Letters stored before the column existed are marked from the error
-- the relay recorded for an invalid row.
DO $outboxrelay$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'outboxrelay.dead_letters'::regclass AND attname = 'invalid' AND NOT attisdropped) THEN
        ALTER TABLE outboxrelay.dead_letters ADD COLUMN invalid boolean NOT NULL DEFAULT false;
        UPDATE outboxrelay.dead_letters SET invalid = true WHERE error LIKE 'invalid outbox message:%';
    END IF;
END
$outboxrelay$;
{{template "addColumn" (args "outboxrelay.dead_letters" "replay_forced_by" "text")}}
