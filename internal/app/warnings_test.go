package app

import (
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/sinks/kafka"
)

func TestWarnings(t *testing.T) {
	cfg := config.Default()
	cfg.Postgres.URL = "postgres://relay:pw@db.internal/shop?sslmode=require"
	cfg.HTTP.Listen = "0.0.0.0:9187"
	config.SinkAs[*kafka.Config](cfg.Sink).SASL = kafka.SASL{Mechanism: kafka.SASLPlain, Username: "u", Password: "p"}
	got := strings.Join(Warnings(cfg), "\n")
	for _, want := range []string{"sslmode=verify-full", "http.token is not set", "PLAIN without sink.kafka.tls"} {
		if !strings.Contains(got, want) {
			t.Errorf("warnings lack %q:\n%s", want, got)
		}
	}
	cfg.Postgres.URL = "postgres://relay@127.0.0.1/shop"
	cfg.HTTP.Listen = "127.0.0.1:9187"
	config.SinkAs[*kafka.Config](cfg.Sink).TLSFiles.Enabled = true
	if ws := Warnings(cfg); len(ws) != 0 {
		t.Errorf("loopback, TLS: warnings %v", ws)
	}
}
