package config

import (
	"fmt"
	"strings"
)

// descriptions documents every key for the README's configuration
// reference. A test fails when a key has no description or a description
// has no key, so the reference cannot drift from the struct.
var descriptions = map[string]string{
	"postgres.url":                           "PostgreSQL URL (`sslmode`, `sslrootcert`, `sslcert`, `sslkey` as usual); the relay adds `replication=database` itself",
	"postgres.url_file":                      "file holding `postgres.url` (a Kubernetes secret)",
	"postgres.slot":                          "logical replication slot (pgoutput); created if missing",
	"postgres.publication":                   "publication, inserts only, limited to `tables`; created or extended if needed",
	"postgres.tables":                        "outbox tables, `schema.table`",
	"postgres.ignore_tables":                 "tables the publication also sends that are knowingly not relayed (counted in `outboxrelay_skipped_inserts_total`); any other unconfigured table stops the relay",
	"postgres.coverage_interval":             "how often the relay checks that its publication still covers the outbox tables",
	"postgres.columns.id":                    "column that becomes `message_id`",
	"postgres.columns.aggregate_type":        "column for the topic / routing key",
	"postgres.columns.aggregate_id":          "column for the record key (per-aggregate order)",
	"postgres.columns.event_type":            "column for `event_type`",
	"postgres.columns.payload":               "payload column: jsonb, json, text or bytea",
	"postgres.columns.headers":               "jsonb object of extra broker headers; empty when the table has none",
	"postgres.columns.traceparent":           "W3C traceparent (or Debezium `tracingspancontext`); empty when none",
	"postgres.columns.schema_version":        "integer `schema_version`; empty means 1",
	"postgres.columns.created_at":            "timestamptz for `occurred_at` and retention; empty means the commit time",
	"postgres.message_prefix":                "prefix of table-less `pg_logical_emit_message` events",
	"postgres.status_interval":               "how often the confirmed position is reported to PostgreSQL (100ms–10s)",
	"postgres.heartbeat_interval":            "heartbeat message interval, so an idle outbox does not pin WAL; 0 disables",
	"postgres.retention":                     "delete outbox rows older than this, in small batches; 0 keeps all",
	"sink.type":                              "`kafka`, `rabbitmq`, `nats` or `redis`",
	"sink.kafka.brokers":                     "seed brokers, host:port",
	"sink.kafka.topic":                       "topic template: `{aggregate_type}`, `{event_type}`, `{table}`",
	"sink.kafka.linger":                      "how long a partition batch waits for more records",
	"sink.kafka.tls.enabled":                 "connect with TLS",
	"sink.kafka.tls.ca_file":                 "CA bundle that signs the brokers' certificates",
	"sink.kafka.tls.cert_file":               "client certificate (mutual TLS)",
	"sink.kafka.tls.key_file":                "client key (mutual TLS)",
	"sink.kafka.tls.server_name":             "name to verify in the brokers' certificates",
	"sink.kafka.tls.insecure_skip_verify":    "skip certificate verification (tests only)",
	"sink.kafka.sasl.mechanism":              "`PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`",
	"sink.kafka.sasl.username":               "SASL user",
	"sink.kafka.sasl.password":               "SASL password",
	"sink.kafka.sasl.password_file":          "file holding the SASL password",
	"sink.rabbitmq.url":                      "`amqp://` or `amqps://` URL with credentials",
	"sink.rabbitmq.url_file":                 "file holding `sink.rabbitmq.url`",
	"sink.rabbitmq.exchange":                 "exchange to publish to",
	"sink.rabbitmq.routing_key":              "routing key template: `{aggregate_type}`, `{event_type}`, `{table}`",
	"sink.rabbitmq.declare":                  "declare the exchange on connect",
	"sink.rabbitmq.exchange_type":            "exchange type when declaring",
	"sink.rabbitmq.durable":                  "durable exchange when declaring",
	"sink.rabbitmq.tls.enabled":              "use TLS (implied by `amqps://`)",
	"sink.rabbitmq.tls.ca_file":              "CA bundle for the broker's certificate",
	"sink.rabbitmq.tls.cert_file":            "client certificate",
	"sink.rabbitmq.tls.key_file":             "client key",
	"sink.rabbitmq.tls.server_name":          "name to verify in the broker's certificate",
	"sink.rabbitmq.tls.insecure_skip_verify": "skip certificate verification (tests only)",
	"sink.rabbitmq.auth":                     "`plain` (user and password from the URL) or `external` (client certificate)",
	"sink.nats.url":                          "NATS server URL",
	"sink.nats.url_file":                     "file holding `sink.nats.url`",
	"sink.nats.subject":                      "subject template: `{aggregate_type}`, `{event_type}`, `{table}`",
	"sink.nats.stream":                       "JetStream stream that must capture the subjects",
	"sink.nats.create_stream":                "create the stream when it is missing",
	"sink.nats.duplicate_window":             "dedupe window of a created stream",
	"sink.nats.max_pending":                  "unacknowledged publishes at once",
	"sink.nats.ack_timeout":                  "wait for a PubAck before retrying",
	"sink.nats.credentials_file":             "NATS credentials (.creds) file",
	"sink.redis.url":                         "Redis URL (`rediss://` for TLS)",
	"sink.redis.url_file":                    "file holding `sink.redis.url`",
	"sink.redis.stream":                      "stream key template: `{aggregate_type}`, `{event_type}`, `{table}`",
	"sink.redis.max_len":                     "trim streams to about this many entries (`MAXLEN ~`); 0 never trims",
	"sink.redis.batch_size":                  "XADDs per MULTI/EXEC round trip",
	"sink.redis.max_pending":                 "queued messages before Publish waits",
	"envelope.format":                        "`envelope`, `cloudevents` (structured) or `cloudevents-binary`",
	"envelope.source":                        "CloudEvents `source` attribute",
	"relay.max_inflight":                     "messages handed to the broker and not yet acknowledged (backpressure)",
	"relay.max_inflight_bytes":               "bytes of such messages",
	"relay.max_attempts":                     "attempts for a message the broker rejects permanently, before it is dead-lettered",
	"relay.drain_timeout":                    "how long a shutdown waits for acknowledgements",
	"relay.dead_letters":                     "store undeliverable messages in `outboxrelay.dead_letters`; false stops the relay instead",
	"relay.schemas.dir":                      "folder of JSON Schemas, `EVENT_TYPE/vN.json`; a payload that does not match the schema of its event type and `schema_version` is dead-lettered. Empty: no validation",
	"relay.schemas.missing":                  "a payload whose event type and version have no schema: `allow` publishes it, `deadletter` dead-letters it",
	"http.listen":                            "address of /healthz, /readyz, /status, /metrics; empty disables",
	"http.token":                             "bearer token required by /status and /metrics; empty: open",
	"http.token_file":                        "file holding `http.token`",
	"log.level":                              "`debug`, `info`, `warn` or `error` (JSON lines on stderr)",
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
		fmt.Fprintf(&b, "| `%s` | %s | `%s` | %s |\n", k.Path, def, k.Env, descriptions[k.Path])
	}
	return b.String()
}
