
-- When confirmed_lsn was last recorded: a slot ahead of the record after a
-- PostgreSQL restart is explained by confirmations the relay could not record
-- while the server shut down.
{{template "addColumn" (args "outboxrelay.checkpoint" "confirmed_at" "timestamptz")}}
