package redis

import (
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
)

// TestRawDecodesRelayEntries: entries laid out as the relay's Redis sink
// writes them decode, in each format that has a Redis shape, to the
// message the relay sent, row headers included.
func TestRawDecodesRelayEntries(t *testing.T) {
	m := ledger.Generate(1, 1)[0]
	env := goredis.XMessage{ID: "1-1", Values: map[string]any{}}
	f := relayFields(m)
	for i := 0; i < len(f); i += 2 {
		v := f[i+1]
		if b, ok := v.([]byte); ok {
			v = string(b) // what go-redis reads back
		}
		env.Values[f[i].(string)] = v
	}
	binary := goredis.XMessage{ID: "1-2", Values: map[string]any{
		"message_id": "m-2", "event_type": "deposit", "aggregate_id": "acct-7", "aggregate_type": "account",
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "content-type": "application/json",
		"ce_specversion": "1.0", "ce_id": "m-2", "ce_type": "deposit", "ce_source": "/bank/public.outbox",
		"ce_subject": "acct-7", "headers": `{"tenant":"t2","n":3}`, "envelope": `{"amount":5}`,
	}}
	debezium := goredis.XMessage{ID: "1-3", Values: map[string]any{
		"id": "m-3", "message_id": "m-3", "event_type": "deposit", "aggregate_id": "acct-8", "aggregate_type": "account",
		"content-type": "application/json", "envelope": `{"amount":6}`,
	}}
	for _, c := range []struct {
		entry            goredis.XMessage
		format           inbox.Format
		id, agg, payload string
		headers          map[string]string
	}{
		{env, inbox.FormatEnvelope, m.ID, m.Account, "", map[string]string{}},
		{binary, inbox.FormatCloudEventsBinary, "m-2", "acct-7", `{"amount":5}`, map[string]string{"tenant": "t2", "n": "3"}},
		{debezium, inbox.FormatDebezium, "m-3", "acct-8", `{"amount":6}`, map[string]string{}},
	} {
		got, err := inbox.Decode(inbox.FormatAuto, Raw(c.entry))
		if err != nil {
			t.Fatalf("entry %s: %v", c.entry.ID, err)
		}
		if got.Format != c.format || got.ID != c.id || got.AggregateID != c.agg || got.AggregateType != "account" || got.EventType != "deposit" {
			t.Errorf("entry %s decoded as %v id %q aggregate %s/%s event %q; want %v id %q aggregate account/%s event deposit",
				c.entry.ID, got.Format, got.ID, got.AggregateType, got.AggregateID, got.EventType, c.format, c.id, c.agg)
		}
		if c.payload != "" && string(got.Payload) != c.payload {
			t.Errorf("entry %s payload %s, want %s", c.entry.ID, got.Payload, c.payload)
		}
		for k, v := range c.headers {
			if got.Headers[k] != v {
				t.Errorf("entry %s header %s = %q, want %q (headers %v)", c.entry.ID, k, got.Headers[k], v, got.Headers)
			}
		}
	}
}
