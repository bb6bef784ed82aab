package config

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/sinks/kafka"
	"github.com/outboxrelay/outboxrelay/sinks/nats"
)

// TestSinglePipelineIsDefault: a file without pipelines is one pipeline
// named default, with the top-level sections.
func TestSinglePipelineIsDefault(t *testing.T) {
	cfg, err := Load(writeTemp(t, "c.yaml", minimal), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	units := cfg.Units()
	if len(units) != 1 || units[0].Name != DefaultPipeline || units[0].Fatal || units[0].Config.Postgres.URL != "postgres://relay@127.0.0.1/shop" {
		t.Fatalf("units = %+v", units)
	}
	out, err := cfg.RedactedYAML()
	if err != nil || strings.Contains(string(out), "pipelines") {
		t.Fatalf("a single pipeline prints no pipelines key (%v):\n%s", err, out)
	}
}

// TestPipelinesOverrideDefaults: each pipeline starts from the top-level
// sections (file, then environment) and replaces the keys it sets;
// secrets it sets, as a value or a file, replace the inherited pair.
func TestPipelinesOverrideDefaults(t *testing.T) {
	pw := writeTemp(t, "pw", "b-secret\n")
	file := `
postgres:
  url_file: ` + writeTemp(t, "url", "postgres://relay:top@127.0.0.1/shop") + `
  tables: [public.outbox]
  status_interval: 3s
sink:
  type: kafka
  kafka:
    brokers: [k1:9092]
relay:
  max_attempts: 7
pipelines:
  - name: orders
    fatal: true
  - name: billing
    postgres:
      url: postgres://billing:` + "${X}" + `@127.0.0.1/billing
      slot: billing_slot
    sink:
      type: nats
      nats:
        url: nats://n1:4222
    relay:
      max_attempts: 2
  - name: tenant-3
    postgres:
      password_placeholder: ""
`
	file = strings.Replace(file, "      password_placeholder: \"\"\n", "      url: postgres://t3@127.0.0.1/t3\n      slot: t3\n    sink:\n      kafka:\n        sasl:\n          mechanism: PLAIN\n          username: u\n          password_file: "+pw+"\n", 1)
	cfg, err := Load(writeTemp(t, "c.yaml", file), env(map[string]string{"OUTBOXRELAY_POSTGRES_STATUS_INTERVAL": "4s"}))
	if err != nil {
		t.Fatal(err)
	}
	units := cfg.Units()
	if len(units) != 3 {
		t.Fatalf("%d units, want 3", len(units))
	}
	orders, billing, t3 := units[0], units[1], units[2]
	if orders.Name != "orders" || !orders.Fatal || orders.Config.Postgres.URL != "postgres://relay:top@127.0.0.1/shop" ||
		orders.Config.Relay.MaxAttempts != 7 || orders.Config.Postgres.StatusInterval != 4*time.Second {
		t.Errorf("orders does not inherit the top level (file, then environment): %+v", orders)
	}
	if billing.Fatal || billing.Config.Postgres.URL != "postgres://billing:${X}@127.0.0.1/billing" || billing.Config.Postgres.Slot != "billing_slot" ||
		billing.Config.Sink.Type != "nats" || billing.Config.Relay.MaxAttempts != 2 ||
		billing.Config.Postgres.StatusInterval != 4*time.Second || len(billing.Config.Postgres.Tables) != 1 {
		t.Errorf("billing's own keys do not replace the defaults': %+v", billing.Config)
	}
	if got := SinkAs[*nats.Config](billing.Config.Sink).URL; got != "nats://n1:4222" {
		t.Errorf("billing nats urls = %v", got)
	}
	if got := SinkAs[*nats.Config](orders.Config.Sink).URL; got == "nats://n1:4222" {
		t.Error("billing's sink section leaked into orders'")
	}
	k := SinkAs[*kafka.Config](t3.Config.Sink)
	if k.SASL.Password != "b-secret" || len(k.Brokers) != 1 || k.Brokers[0] != "k1:9092" || t3.Config.Postgres.URL != "postgres://t3@127.0.0.1/t3" {
		t.Errorf("tenant-3: password %q brokers %v url %q", k.SASL.Password, k.Brokers, t3.Config.Postgres.URL)
	}
	if p := SinkAs[*kafka.Config](orders.Config.Sink).SASL.Password; p != "" {
		t.Errorf("tenant-3's password reached orders: %q", p)
	}
	out, err := cfg.RedactedYAML()
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"top@", "b-secret"} {
		if strings.Contains(string(out), secret) {
			t.Errorf("printed configuration shows %q:\n%s", secret, out)
		}
	}
	if !strings.Contains(string(out), "name: billing") {
		t.Errorf("printed configuration lacks the pipelines:\n%s", out)
	}
	// The original keeps its secrets.
	if SinkAs[*kafka.Config](cfg.Units()[2].Config.Sink).SASL.Password != "b-secret" {
		t.Error("RedactedYAML changed the configuration")
	}
}

// TestPipelinesProblems: every pipeline is checked as a configuration of
// its own, each problem naming the pipeline; names are required, unique
// and label-safe; two pipelines cannot read one slot.
func TestPipelinesProblems(t *testing.T) {
	file := `
sink:
  kafka:
    brokers: [k1:9092]
pipelines:
  - name: a
    postgres:
      url: postgres://x@h/a
  - name: a
    postgres:
      url: postgres://y@h/other
  - postgres:
      url: postgres://x@h/c
  - name: Bad Name
    postgres:
      url: postgres://x@h/d
      backfill: sometimes
  - name: e
    postgres:
      bogus: 1
`
	_, err := Load(writeTemp(t, "c.yaml", file), env(nil))
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	for _, want := range []string{
		"pipelines[1] (a): name is also pipelines[0]'s",
		"pipelines[1] (a): postgres.slot outboxrelay on the same server is also pipelines[0]'s",
		"pipelines[2]: name is required",
		"pipelines[3] (Bad Name): name must be lower-case",
		`pipelines[3] (Bad Name): postgres.backfill "sometimes" is not one of auto, all, none`,
		"pipelines[4].postgres.bogus is not a configuration key",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	for _, e := range Problems(err) {
		if strings.HasPrefix(e.Error(), "postgres.url") {
			t.Errorf("the top-level postgres.url is only a default with pipelines:\n%s", msg)
		}
	}
	// A pipeline without a URL of its own or a default one is reported.
	_, err = Load(writeTemp(t, "c.yaml", "pipelines:\n  - name: x\n"), env(nil))
	if err == nil || !strings.Contains(err.Error(), "pipelines[0] (x): postgres.url is required") {
		t.Errorf("err = %v", err)
	}
	_, err = Load(writeTemp(t, "c.yaml", minimal), env(map[string]string{"OUTBOXRELAY_PIPELINES": "a"}))
	if err == nil || !strings.Contains(err.Error(), "pipelines can be set in the file only") {
		t.Errorf("err = %v", err)
	}
}
