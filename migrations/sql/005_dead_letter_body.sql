
-- The exact message body (any bytes, e.g. a binary CloudEvents payload), its
-- content type and CloudEvents attributes, so that a replay publishes the
-- very message that failed.
{{template "addColumn" (args "outboxrelay.dead_letters" "body" "bytea")}}
{{template "addColumn" (args "outboxrelay.dead_letters" "content_type" "text")}}
{{template "addColumn" (args "outboxrelay.dead_letters" "attributes" "jsonb")}}
