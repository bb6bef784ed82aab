package relay_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/internal/rules"
	"github.com/outboxrelay/outboxrelay/relay"
)

// benchRoutesFile holds cmd/outboxrelay-bench's routes (package main,
// which a test cannot import): ten routes the benchmark's rows fail nine
// of, and a transform setting the key and a header.
const benchRoutesFile = "../cmd/outboxrelay-bench/routes.yaml"

// BenchmarkBuildRoutes measures what the builder spends on one 1 KB row of
// make bench's relay->kafka+routes workload (the payload {"seq": N, "data":
// ...}), without rules ("rules=none", the reference) and through
// the bench's routes ("rules=bench"), which take it to the tenth route.
func BenchmarkBuildRoutes(b *testing.B) {
	benchRoutes, err := os.ReadFile(benchRoutesFile)
	if err != nil {
		b.Fatal(err)
	}
	var rc rules.Config
	if err := yaml.Unmarshal(benchRoutes, &rc); err != nil {
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
