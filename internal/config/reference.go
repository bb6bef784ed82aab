package config

import (
	"fmt"
	"strings"

	"github.com/outboxrelay/outboxrelay/sinks"
)

// descriptions documents the keys this package declares for the README's
// configuration reference. The keys of another package's struct that a
// section embeds are documented by that struct's Docs (relay.Config,
// cdc.Config), and the sinks' sections by their packages (sinks.Type.Docs).
// A test fails when a key has no description or a description has no key,
// so the reference cannot drift from the structs.
var descriptions = map[string]string{
	"postgres.coverage_interval":  "how often the relay checks that its publication still covers the outbox tables",
	"postgres.heartbeat_interval": "heartbeat message interval, so an idle outbox does not pin WAL, and how often an idle relay records its position; 0 disables heartbeats (the position is then recorded every 10s)",
	"postgres.retention":          "delete outbox rows older than this, in small batches; 0 keeps all",
	"postgres.backfill":           "on a relay's first start (no position recorded for its slot): `auto` publishes the rows of tables `migrate` created that no relay has relayed, `all` every row the tables hold, `none` nothing; then it streams",
	"sink.type":                   "the sink to run: `kafka`, `kinesis`, `nats`, `pubsub`, `rabbitmq`, `redis`, `sns`, `sqs` or `webhook`",
	"sinks":                       "several sinks fed from the one slot, by name: each `NAME: {type: ..., <type>: {...}}` as the `sink` section is written, which it replaces; routes pick one with `sink: NAME` (the first listed takes the rest). Each sink has its own order, retries, dead letters and watermark; the slot is confirmed to the slowest (see [Routing](routing.md#several-sinks-from-one-slot)). File only",
	"relay.drain_timeout":         "how long a shutdown waits for acknowledgements",
	"relay.dead_letters":          "store undeliverable messages in `outboxrelay.dead_letters`; false stops the relay instead",
	"relay.schemas.dir":           "folder of JSON Schemas, `EVENT_TYPE/vN.json`; a payload that does not match the schema of its event type and `schema_version` is dead-lettered. Empty: no validation",
	"relay.schemas.missing":       "a payload whose event type and version have no schema: `allow` publishes it, `deadletter` dead-letters it",
	"http.listen":                 "address of /healthz, /readyz, /status, /metrics; empty disables",
	"http.token":                  "bearer token required by /status and /metrics; empty: open",
	"http.token_file":             "file holding `http.token`",
	"http.action_token":           "bearer token the management API's actions (`POST /api/v1/pipelines/NAME/pause`, `.../resume`) require, distinct from `http.token`; empty: actions are off",
	"http.action_token_file":      "file holding `http.action_token`",
	"pipelines":                   "a list of pipelines run in one process, each with `name`, `fatal` and its own `postgres`, `sink`, `envelope` and `relay` keys over the top-level ones; empty: the top level is one pipeline named `default` (see [Running many pipelines](operations.md#running-many-pipelines))",
	"log.level":                   "`debug`, `info`, `warn` or `error` (JSON lines on stderr)",
	"process.cpu_scheduling":      "the CPU scheduling policy of the relay's threads (Linux): `batch` puts those under the default policy under SCHED_BATCH, with the same share of the CPU and nice value, but its threads do not preempt a running thread when they wake, so a relay sharing CPUs with PostgreSQL does not keep preempting the walsender that feeds it; `inherited` keeps the policy the process started with (see [Performance](performance.md#cpu-scheduling))",
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
		fmt.Fprintf(&b, "| `%s` | %s | `%s` | %s |\n", k.Path, def, k.Env, k.Doc)
	}
	return b.String()
}

// sinkDoc documents the key at path of a sink's section from that sink's
// registration, or is empty.
func sinkDoc(path string) string {
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
