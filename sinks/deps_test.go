package sinks_test

import (
	"os/exec"
	"strings"
	"testing"
)

// brokerClients are the client libraries of the sinks, by sink package:
// a package path that starts with one of them is that sink's client.
var brokerClients = map[string][]string{
	"kafka":    {"github.com/twmb/franz-go/"},
	"nats":     {"github.com/nats-io/nats.go"},
	"rabbitmq": {"github.com/rabbitmq/amqp091-go"},
	"redis":    {"github.com/redis/go-redis/"},
	"pubsub":   {"cloud.google.com/go/pubsub"},
	"kinesis":  {"github.com/aws/aws-sdk-go-v2/service/kinesis"},
	"sqs":      {"github.com/aws/aws-sdk-go-v2/service/sqs"},
	"sns":      {"github.com/aws/aws-sdk-go-v2/service/sns"},
}

// TestSinkDependencies: a sink package imports, directly or not, no other
// sink's broker client, and the shared packages (sinks, verify, the
// relay) none at all, so that a program that uses one sink builds only its
// client. One go list of every package's dependencies.
func TestSinkDependencies(t *testing.T) {
	const mod = "github.com/outboxrelay/outboxrelay/"
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}",
		"../sinks/...", "../verify", "../relay", "../replay").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, deps := f[0], f[1:]
		own := "" // the sink whose client pkg may import
		if rest, ok := strings.CutPrefix(pkg, mod+"sinks/"); ok {
			own, _, _ = strings.Cut(rest, "/")
		}
		if strings.HasSuffix(pkg, "/sinktest") || strings.HasSuffix(pkg, "/srtest") {
			continue // test helpers start brokers of their own
		}
		checked++
		for _, d := range deps {
			for sink, clients := range brokerClients {
				for _, c := range clients {
					if sink != own && (strings.HasPrefix(d, c) || d == strings.TrimSuffix(c, "/")) {
						t.Errorf("%s imports %s, the client of the %s sink (go list -deps %s)", pkg, d, sink, "./"+strings.TrimPrefix(pkg, mod))
					}
				}
			}
		}
	}
	if checked < 6 { // sinks, route, the five sinks' packages, verify, relay, replay
		t.Fatalf("checked %d packages; go list found too few:\n%s", checked, out)
	}
}
