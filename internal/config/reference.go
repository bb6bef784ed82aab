package config

import (
	"fmt"
	"strings"

	"github.com/outboxrelay/outboxrelay/sinks"
)

// descriptions documents every key for the README's configuration
// reference, but for the sinks' sections, which their packages document
// (sinks.Type.Docs). A test fails when a key has no description or a
// description has no key, so the reference cannot drift from the struct.
var descriptions = map[string]string{
	"postgres.url":                    "PostgreSQL URL (`sslmode`, `sslrootcert`, `sslcert`, `sslkey` as usual); the relay adds `replication=database` itself",
	"postgres.url_file":               "file holding `postgres.url` (a Kubernetes secret)",
	"postgres.slot":                   "logical replication slot (pgoutput); created if missing",
	"postgres.publication":            "publication, inserts only, limited to `tables`; created or extended if needed",
	"postgres.tables":                 "outbox tables, `schema.table`",
	"postgres.ignore_tables":          "tables the publication also sends that are knowingly not relayed (counted in `outboxrelay_skipped_inserts_total`); any other unconfigured table stops the relay",
	"postgres.coverage_interval":      "how often the relay checks that its publication still covers the outbox tables",
	"postgres.columns.id":             "column that becomes `message_id`",
	"postgres.columns.aggregate_type": "column for the topic / routing key",
	"postgres.columns.aggregate_id":   "column for the record key (per-aggregate order)",
	"postgres.columns.event_type":     "column for `event_type`",
	"postgres.columns.payload":        "payload column: jsonb, json, text or bytea",
	"postgres.columns.headers":        "jsonb object of extra broker headers; empty when the table has none",
	"postgres.columns.traceparent":    "W3C traceparent (or Debezium `tracingspancontext`); empty when none",
	"postgres.columns.schema_version": "integer `schema_version`; empty means 1",
	"postgres.columns.created_at":     "timestamptz for `occurred_at` and retention; empty means the commit time",
	"postgres.message_prefix":         "prefix of table-less `pg_logical_emit_message` events",
	"postgres.status_interval":        "how often the confirmed position is reported to PostgreSQL (100ms–10s)",
	"postgres.heartbeat_interval":     "heartbeat message interval, so an idle outbox does not pin WAL; 0 disables",
	"postgres.retention":              "delete outbox rows older than this, in small batches; 0 keeps all",
	"postgres.backfill":               "on a relay's first start (no position recorded for its slot): `auto` publishes the rows of tables `migrate` created that no relay has relayed, `all` every row the tables hold, `none` nothing; then it streams",
	"postgres.failover_slot":          "create the slot as a failover slot (PostgreSQL 17+), which follows a failover to a standby with `sync_replication_slots = on`; refused on older versions",
	"sink.type":                       "the sink to run: `kafka`, `nats`, `rabbitmq`, `redis` or `webhook`",
	"envelope.format":                 "`envelope`, `cloudevents` (structured), `cloudevents-binary` or `debezium` (Debezium's outbox event router output: the payload as the body, an `id` header)",
	"envelope.source":                 "CloudEvents `source` attribute",
	"relay.max_inflight":              "messages handed to the broker and not yet acknowledged (backpressure)",
	"relay.max_inflight_bytes":        "bytes of such messages",
	"relay.max_attempts":              "attempts for a message the broker rejects permanently, before it is dead-lettered",
	"relay.drain_timeout":             "how long a shutdown waits for acknowledgements",
	"relay.dead_letters":              "store undeliverable messages in `outboxrelay.dead_letters`; false stops the relay instead",
	"relay.dead_letter_order":         "`park`: the later messages of a dead letter's aggregate wait behind it in `outboxrelay.parked` until `dlq replay` publishes the chain in order; `pass`: they are published, leaving a gap",
	"relay.schemas.dir":               "folder of JSON Schemas, `EVENT_TYPE/vN.json`; a payload that does not match the schema of its event type and `schema_version` is dead-lettered. Empty: no validation",
	"relay.schemas.missing":           "a payload whose event type and version have no schema: `allow` publishes it, `deadletter` dead-letters it",
	"http.listen":                     "address of /healthz, /readyz, /status, /metrics; empty disables",
	"http.token":                      "bearer token required by /status and /metrics; empty: open",
	"http.token_file":                 "file holding `http.token`",
	"log.level":                       "`debug`, `info`, `warn` or `error` (JSON lines on stderr)",
}

// Reference renders the configuration reference: every key, its default
// and its environment variable, as a Markdown table.
func Reference() string {
	var b strings.Builder
	b.WriteString("| key | default | environment | meaning |\n|---|---|---|---|\n")
	for _, k := range Keys() {
		def := k.Default
		if def == "" {
			def = "—"
		} else {
			def = "`" + def + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | `%s` | %s |\n", k.Path, def, k.Env, description(k.Path))
	}
	return b.String()
}

// description documents the key at path: from descriptions, or for a key
// of a sink's section from that sink's registration.
func description(path string) string {
	if d, ok := descriptions[path]; ok {
		return d
	}
	rest, ok := strings.CutPrefix(path, "sink.")
	if !ok {
		return ""
	}
	name, key, _ := strings.Cut(rest, ".")
	if t, ok := sinks.Lookup(name); ok {
		return t.Docs[key]
	}
	return ""
}
