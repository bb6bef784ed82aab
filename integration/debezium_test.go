package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestDebeziumFormatKafka: with envelope.format: debezium and the topic of
// Debezium's outbox event router (outbox.event.{aggregate_type}), every
// committed row reaches Kafka (kfake, through the relay binary) as the
// router emits it by default with expand-JSON: key = aggregate id, value =
// the payload document itself (an object, not a JSON string), exactly one
// id header holding the message id. A row header named id cannot spoof it;
// the row's other headers pass, and each dropped one is counted in
// outboxrelay_reserved_headers_dropped_total{header="id"}. Checked against the ledger of committed
// rows: none lost, per-aggregate commit order.
func TestDebeziumFormatKafka(t *testing.T) {
	e := newEnv(t)
	p := e.start("OUTBOXRELAY_ENVELOPE_FORMAT=debezium", "OUTBOXRELAY_SINK_KAFKA_TOPIC=outbox.event.{aggregate_type}")
	p.waitLog(`"streaming"`, 30*time.Second)

	ids := map[string][]string{}
	seqOf := map[string]int{}
	for i := 0; i < 5; i++ {
		tx, err := e.db.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, agg := range []string{"1", "2"} {
			var id string
			if err := tx.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
				VALUES ('order', $1, 'order.created', jsonb_build_object('seq', $2::int, 'note', 'a "quoted" word'), '{"id": "SPOOFED", "tenant": "acme"}')
				RETURNING id::text`, agg, i).Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids[agg] = append(ids[agg], id)
			seqOf[id] = i
		}
		if err := tx.Commit(t.Context()); err != nil {
			t.Fatal(err)
		}
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers), kgo.ConsumeTopics("outbox.event.order"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < len(seqOf) && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	_, metrics := get(t, "http://"+p.httpAddr()+"/metrics")
	p.stop()
	if v := metricValues(metrics, "outboxrelay_reserved_headers_dropped_total")[`{header="id",slot="outboxrelay"}`]; v != float64(len(seqOf)) {
		t.Errorf("reserved_headers_dropped_total{header=\"id\"} = %v, want %d (one per row with an id header)", v, len(seqOf))
	}

	var got []delivered
	for _, r := range recs {
		hs := map[string][]string{}
		for _, h := range r.Headers {
			hs[h.Key] = append(hs[h.Key], string(h.Value))
		}
		if len(hs["id"]) != 1 || len(hs["message_id"]) != 1 || hs["id"][0] != hs["message_id"][0] {
			t.Fatalf("record headers %v: want exactly one id header, the message id", hs)
		}
		id := hs["id"][0]
		var value map[string]any
		if err := json.Unmarshal(r.Value, &value); err != nil {
			t.Fatalf("record %s: value %q is not a JSON object (expand-JSON): %v", id, r.Value, err)
		}
		want, ok := seqOf[id]
		if !ok {
			t.Fatalf("record id %s is not a committed row", id)
		}
		if value["seq"] != float64(want) || value["note"] != `a "quoted" word` || len(value) != 2 {
			t.Errorf("record %s: value %s, want the payload {seq: %d, note}", id, r.Value, want)
		}
		if fmt.Sprint(hs["tenant"]) != "[acme]" || fmt.Sprint(hs["content-type"]) != "[application/json]" {
			t.Errorf("record %s: headers %v", id, hs)
		}
		// The ledger check reads message_id from the envelope map.
		got = append(got, delivered{id: id, key: string(r.Key), env: map[string]any{"message_id": id}})
	}
	for _, d := range got {
		if !slices.Contains(ids[d.key], d.id) {
			t.Errorf("record %s: key %q is not its aggregate id", d.id, d.key)
		}
	}
	checkCommitOrder(t, ids, got)
}
