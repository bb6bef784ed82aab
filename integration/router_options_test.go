package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outboxrelay/internal/store"
)

// TestRouterOptionsKafka: the outbox router's options by configuration,
// through the relay binary to Kafka (kfake). postgres.columns.key picks the
// record key, postgres.columns.timestamp the record timestamp,
// postgres.header_columns adds a column as a header, and in the debezium
// format a NULL payload is a record with a null value (a tombstone), where
// it was dead-lettered. Checked against the ledger of committed rows: none
// lost, per-key commit order, and no dead letter.
func TestRouterOptionsKafka(t *testing.T) {
	e := newEnv(t)
	if _, err := e.db.Exec(t.Context(), `ALTER TABLE outbox ADD COLUMN tenant text, ADD COLUMN happened timestamptz,
		ALTER COLUMN payload DROP NOT NULL`); err != nil {
		t.Fatal(err)
	}
	p := e.start("OUTBOXRELAY_ENVELOPE_FORMAT=debezium", "OUTBOXRELAY_SINK_KAFKA_TOPIC=outbox.event.{aggregate_type}",
		"OUTBOXRELAY_POSTGRES_COLUMNS_KEY=tenant", "OUTBOXRELAY_POSTGRES_COLUMNS_TIMESTAMP=happened",
		"OUTBOXRELAY_POSTGRES_HEADER_COLUMNS=tenant")
	p.waitLog(`"streaming"`, 30*time.Second)

	ids := map[string][]string{} // by tenant, in commit order
	tomb := map[string]bool{}
	at := map[string]time.Time{}
	base := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	for i := 0; i < 6; i++ {
		tx, err := e.db.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for j, tenant := range []string{"t1", "t2"} {
			n := 2*i + j
			when := base.Add(time.Duration(n) * time.Minute)
			var payload any = map[string]int{"n": n}
			if n%3 == 0 {
				payload = nil
			}
			var id string
			if err := tx.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, tenant, happened)
				VALUES ('order', $1, 'order.changed', $2, $3, $4) RETURNING id::text`,
				"agg-"+tenant, payload, tenant, when).Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids[tenant] = append(ids[tenant], id)
			tomb[id], at[id] = payload == nil, when
		}
		if err := tx.Commit(t.Context()); err != nil {
			t.Fatal(err)
		}
	}

	recs := e.rawRecords("outbox.event.order", len(tomb))
	p.stop()

	var got []delivered
	tombstones := 0
	for _, r := range recs {
		hs := map[string]string{}
		for _, h := range r.Headers {
			hs[h.Key] = string(h.Value)
		}
		id := hs["id"]
		want, ok := tomb[id]
		if !ok {
			t.Fatalf("record id %q is not a committed row", id)
		}
		if hs["tenant"] != string(r.Key) {
			t.Errorf("record %s: key %q, tenant header %q; want both the tenant column", id, r.Key, hs["tenant"])
		}
		if !r.Timestamp.Equal(at[id]) {
			t.Errorf("record %s: timestamp %v, want the happened column %v", id, r.Timestamp, at[id])
		}
		switch {
		case want && r.Value != nil:
			t.Errorf("record %s: null payload sent as %q, want a null value (tombstone)", id, r.Value)
		case want:
			tombstones++
		default:
			var v map[string]int
			if err := json.Unmarshal(r.Value, &v); err != nil || len(v) != 1 {
				t.Errorf("record %s: value %q, %v", id, r.Value, err)
			}
		}
		got = append(got, delivered{id: id, key: string(r.Key), env: map[string]any{"message_id": id}})
	}
	if tombstones != 4 {
		t.Errorf("%d tombstones, want 4 (every third of 12 rows)", tombstones)
	}
	checkCommitOrder(t, ids, got)
	var dead int
	if err := e.db.QueryRow(t.Context(), `SELECT count(*) FROM outboxrelay.dead_letters`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 0 {
		t.Errorf("%d dead letters, want 0", dead)
	}
}

// TestDeadLetterReplayKeepsRecordOptions: a dead letter and a message
// parked behind it keep their record key (postgres.columns.key), record
// timestamp (postgres.columns.timestamp) and tombstone, so that `dlq
// replay` publishes the same Kafka records: before the store kept them, a
// replayed record was keyed by its aggregate id, stamped with the produce
// time and carried an empty value instead of a null one.
func TestDeadLetterReplayKeepsRecordOptions(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	dl := &store.DeadLetters{DB: e.db, Slot: "billing"}
	at := time.Date(2024, 5, 6, 7, 8, 9, 123000000, time.UTC)
	head := deadMessage("7", "order.created", 0x200)
	head.Key, head.Timestamp = "tenant-a", at
	if err := dl.AddHead(ctx, head); err != nil {
		t.Fatal(err)
	}
	tomb := deadMessage("7", "order.deleted", 0x300)
	tomb.Key, tomb.Timestamp, tomb.Tombstone, tomb.Envelope = "tenant-a", at.Add(time.Second), true, nil
	if parked, err := dl.Park(ctx, tomb); err != nil || !parked {
		t.Fatalf("park: %v, %v", parked, err)
	}
	plain := deadMessage("7", "order.paid", 0x400)
	if parked, err := dl.Park(ctx, plain); err != nil || !parked {
		t.Fatalf("park: %v, %v", parked, err)
	}
	cfg := e.writeConfig(strings.Replace(e.configText(), "  status_interval: 200ms\n", "  status_interval: 200ms\n  slot: billing\n", 1))
	if out, code := e.cli("dlq", "replay", "--config", cfg, "--all"); code != 0 {
		t.Fatalf("dlq replay --all exit %d: %s", code, out)
	}

	recs := e.rawRecords("outbox.order", 3)
	if len(recs) != 3 {
		t.Fatalf("%d records replayed, want 3", len(recs))
	}
	for i, want := range []struct {
		m    string
		key  string
		at   time.Time
		null bool
	}{{head.ID, "tenant-a", at, false}, {tomb.ID, "tenant-a", at.Add(time.Second), true}, {plain.ID, "7", time.Time{}, false}} {
		r := recs[i]
		var id string
		for _, h := range r.Headers {
			if h.Key == "message_id" {
				id = string(h.Value)
			}
		}
		if id != want.m || string(r.Key) != want.key || (r.Value == nil) != want.null {
			t.Errorf("record %d: id %s key %q null value %v; want %s, %q, %v", i, id, r.Key, r.Value == nil, want.m, want.key, want.null)
		}
		if !want.at.IsZero() && !r.Timestamp.Equal(want.at) {
			t.Errorf("record %d: timestamp %v, want %v", i, r.Timestamp, want.at)
		}
	}
}

// rawRecords reads topic from the start until it has n records or 30
// seconds passed, as franz-go returns them (timestamps, null values).
func (e *env) rawRecords(topic string, n int) []*kgo.Record {
	e.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	return recs
}

// TestEnvelopeColumnsKafka: postgres.envelope_columns places a column into
// the envelope, through the relay binary to Kafka: a row's tenant is a
// top-level field of its envelope, a NULL one is null, and every row
// arrives once in commit order. A name that collides with an envelope
// field, or that a CloudEvents format cannot carry, fails --check-config.
func TestEnvelopeColumnsKafka(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	if _, err := e.db.Exec(ctx, `ALTER TABLE outbox ADD COLUMN tenant text, ADD COLUMN shard text NOT NULL DEFAULT 'shard-1'`); err != nil {
		t.Fatal(err)
	}
	withColumns := func(cols string) string {
		return strings.Replace(e.configText(), "postgres:\n", "postgres:\n  envelope_columns: "+cols+"\n", 1)
	}
	for _, c := range []struct{ cfg, want string }{
		{withColumns("[tenant, payload]"), `postgres.envelope_columns: "payload" is a field of the envelope`},
		{withColumns("[tenant_id]") + "envelope:\n  format: cloudevents\n", `"tenant_id" is not a CloudEvents attribute name`},
	} {
		if out, code := e.cli("run", "--config", e.writeConfig(c.cfg), "--check-config"); code != 2 || !strings.Contains(out, c.want) {
			t.Errorf("--check-config exit %d: %s; want exit 2 and %q", code, out, c.want)
		}
	}
	p := e.startConfig(withColumns("[tenant]"))
	p.waitLog(`"streaming"`, 30*time.Second)
	var ids []string
	tenants := map[string]any{}
	for i, tenant := range []any{"acme", nil, "globex", "acme"} {
		var id string
		if err := e.db.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, tenant)
			VALUES ('order', 'o1', 'order.created', jsonb_build_object('n', $1::int), $2) RETURNING id::text`, i, tenant).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		tenants[id] = tenant
	}
	first := e.rawRecords("outbox.order", len(ids))
	p.stop()
	// replay builds the messages from the table as the relay does: the
	// tenant in the envelope and, with header_columns, in a header, and the
	// record key from postgres.columns.key, here a column replay used not to
	// read.
	cfg := e.writeConfig(withColumns("[tenant]\n  header_columns: [tenant]\n  columns:\n    key: shard"))
	if out, code := e.cli("replay", "--config", cfg, "--since", "1h"); code != 0 || !strings.Contains(out, fmt.Sprintf("replayed %d of %d", len(ids), len(ids))) {
		t.Fatalf("replay exit %d: %s", code, out)
	}
	recs := e.rawRecords("outbox.order", 2*len(ids))
	// By key: the relay's records are keyed by the aggregate, the replay's
	// by the shard column; they may be on different partitions.
	got := map[string][]delivered{}
	for _, r := range recs {
		var env map[string]any
		if err := json.Unmarshal(r.Value, &env); err != nil {
			t.Fatalf("record %s: %v", r.Value, err)
		}
		id := header(r, "message_id")
		if v, ok := env["tenant"]; !ok || v != tenants[id] {
			t.Errorf("record %s (key %s): tenant %v (present %v), want %v", id, r.Key, v, ok, tenants[id])
		}
		if want, _ := tenants[id].(string); string(r.Key) == "shard-1" && header(r, "tenant") != want {
			t.Errorf("replayed record %s: tenant header %q, want %q", id, header(r, "tenant"), want)
		}
		got[string(r.Key)] = append(got[string(r.Key)], delivered{id: id, key: string(r.Key), env: env})
	}
	if len(first) != len(ids) || len(got["o1"]) != len(ids) || len(got["shard-1"]) != len(ids) || len(got) != 2 {
		t.Errorf("%d records from the relay, then %d keyed o1 and %d keyed shard-1 (%d keys); want %d each", len(first), len(got["o1"]), len(got["shard-1"]), len(got), len(ids))
	}
	checkCommitOrder(t, map[string][]string{"o1": ids}, got["o1"])
	checkCommitOrder(t, map[string][]string{"shard-1": ids}, got["shard-1"])
	t.Logf("envelope_columns: %d rows delivered with their tenant in the envelope, and replayed the same", len(first))
}
