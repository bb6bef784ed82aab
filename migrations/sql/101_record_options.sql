
-- A dead letter and a parked message keep what the outbox router's options
-- made of their row (postgres.columns.key and .timestamp, the debezium
-- format's tombstone), so that a replay publishes the same record: NULL
-- key means the aggregate id, NULL timestamp the broker's own.
{{template "addColumn" (args "outboxrelay.dead_letters" "record_key" "text")}}
{{template "addColumn" (args "outboxrelay.dead_letters" "record_timestamp" "timestamptz")}}
{{template "addColumn" (args "outboxrelay.dead_letters" "tombstone" "boolean")}}
{{template "addColumn" (args "outboxrelay.parked" "record_key" "text")}}
{{template "addColumn" (args "outboxrelay.parked" "record_timestamp" "timestamptz")}}
{{template "addColumn" (args "outboxrelay.parked" "tombstone" "boolean")}}
