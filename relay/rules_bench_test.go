package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/internal/rules"
	"github.com/outboxrelay/outboxrelay/relay"
)

// benchRoutes is a copy of cmd/outboxrelay-bench's benchRoutes (package
// main, which a test cannot import): ten routes the benchmark's rows fail
// nine of, and a transform setting the key and a header.
const benchRoutes = `routes:
  - name: payments-eu
    when: 'aggregate_type == "payment" && "region" in row && row["region"] == "eu"'
    destination: payments.eu
  - name: refunds
    when: 'event_type == "order.refunded" || event_type == "payment.refunded"'
    destination: refunds
  - name: tenant-acme
    when: '"tenant" in headers && headers["tenant"] == "acme"'
    destination: 'acme.{aggregate_type}'
  - name: priority
    when: 'aggregate_type == "order" && has(payload.priority) && payload.priority == "high"'
    destination: orders.priority
  - name: shipments
    when: 'aggregate_type == "shipment"'
    destination: 'outbox.{aggregate_type}'
  - name: customers
    when: 'aggregate_type in ["customer", "account"]'
    destination: 'crm.{aggregate_type}'
  - name: deletions
    when: 'event_type.endsWith(".deleted")'
    destination: audit.deletions
  - name: test-data
    when: 'aggregate_id.startsWith("test-")'
    destination: sandbox
  - name: partner
    when: '"x-partner" in headers'
    destination: partner.events
  - name: orders
    when: 'aggregate_type == "order" && payload.seq > 0.0'
    destination: 'outbox.{aggregate_type}'
unmatched: deadletter
transform:
  key: 'aggregate_type + ":" + aggregate_id'
  headers: {x-seq: 'has(payload.seq) ? string(int(payload.seq)) : ""'}
`

// BenchmarkBuildRoutes measures what the builder spends on one 1 KB row of
// make bench's relay->kafka+routes workload (the payload {"seq": N, "data":
// ...}), without rules ("rules=none", the reference) and through
// benchRoutes ("rules=bench"), which take it to the tenth route.
func BenchmarkBuildRoutes(b *testing.B) {
	var rc rules.Config
	if err := yaml.Unmarshal([]byte(benchRoutes), &rc); err != nil {
		b.Fatal(err)
	}
	data := strings.Repeat("0123456789abcdef", 61)
	ins := &cdc.Insert{Relation: optionsRelation, LSN: 0x100, Values: [][]byte{
		[]byte("0b7e0c4e-8d0e-4b8e-9a57-6e0ae0b3c1f1"), []byte("order"), []byte("a17"), []byte("order.created"),
		fmt.Appendf(nil, `{"seq": 42, "data": "%s"}`, data), nil, nil,
	}}
	tx := cdc.Begin{FinalLSN: 0x200, XID: 9}
	for _, name := range []string{"none", "bench"} {
		b.Run("rules="+name, func(b *testing.B) {
			cfg := relay.Config{Tables: []string{"public.outbox"}}
			if name == "bench" {
				cfg.Rules = rc
			}
			if err := cfg.WithDefaults().Validate(); err != nil {
				b.Fatal(err)
			}
			bl := relay.NewBuilder(cfg, relay.Options{})
			b.ReportAllocs()
			for b.Loop() {
				ms, err := bl.Rows(context.Background(), optionsRelation, ins, tx)
				if err != nil || len(ms) != 1 {
					b.Fatalf("%d messages, %v", len(ms), err)
				}
				if name == "bench" && (ms[0].Route != "orders" || ms[0].Key != "order:a17") {
					b.Fatalf("route %q key %q, want orders and order:a17", ms[0].Route, ms[0].Key)
				}
			}
		})
	}
}
