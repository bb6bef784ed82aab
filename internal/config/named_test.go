package config

import (
	"strings"
	"testing"
)

// TestSinksLoad: a sinks section lists named sinks in file order, routes
// pick them by name, and a route naming a sink the section lacks is one
// error naming the route and the sink.
func TestSinksLoad(t *testing.T) {
	body := minimal + `
sinks:
  analytics:
    type: kafka
    kafka: {brokers: [127.0.0.1:9092]}
  partner:
    type: webhook
    webhook: {url: "http://127.0.0.1:9/hook", secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
routes:
  - name: orders
    when: 'aggregate_type == "order"'
    sink: partner
  - name: rest
    sink: analytics
`
	cfg, err := Load(writeTemp(t, "c.yaml", body), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	list := cfg.SinkList()
	if got := strings.Join(list.Names(), ","); got != "analytics,partner" {
		t.Fatalf("sinks %s, want analytics,partner in file order", got)
	}
	if list[1].Sink.Type != "webhook" || list[1].Sink.Settings() == nil {
		t.Fatalf("partner is %q, want webhook", list[1].Sink.Type)
	}
	out, err := cfg.RedactedYAML()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "MfKQ9r8") {
		t.Fatalf("the webhook secret of sinks.partner is printed:\n%s", out)
	}

	bad := strings.Replace(body, "sink: partner", "sink: partnr", 1)
	_, err = Load(writeTemp(t, "c.yaml", bad), env(nil))
	want := `routes[0] (orders).sink "partnr" is not a sink; sinks are analytics, partner`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want an error with %q", err, want)
	}
	if n := len(Problems(err)); n != 1 {
		t.Fatalf("%d problems for one unknown sink, want 1: %v", n, err)
	}
	_, err = Load(writeTemp(t, "c.yaml", minimal+"routes:\n  - name: t\n    sink: x\n"), env(nil))
	if err == nil || !strings.Contains(err.Error(), `routes[0] (t).sink "x": there is no sinks section`) {
		t.Fatalf("a route sink without sinks: got %v", err)
	}
	_, err = Load(writeTemp(t, "c.yaml", strings.Replace(body, "kafka: {brokers: [127.0.0.1:9092]}", "kafka: {brokers: [127.0.0.1:9092], exactly_once: true}", 1)), env(nil))
	if err == nil || !strings.Contains(err.Error(), "sinks.analytics: exactly_once needs the sink to be the slot's only one") {
		t.Fatalf("exactly_once among several sinks: got %v", err)
	}
	_, err = Load(writeTemp(t, "c.yaml", strings.Replace(body, "kafka: {brokers", "kafka: {brokerz", 1)), env(nil))
	if err == nil || !strings.Contains(err.Error(), "sinks.analytics.kafka.brokerz") {
		t.Fatalf("an unknown key in a named sink: got %v", err)
	}
}
