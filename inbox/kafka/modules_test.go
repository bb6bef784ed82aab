package kafka

import (
	"os/exec"
	"strings"
	"testing"
)

// TestModuleGraphHasNoOtherBroker: a Kafka consumer that requires this
// module must not find another broker's client in its module graph.
func TestModuleGraphHasNoOtherBroker(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "all").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "github.com/twmb/franz-go ") {
		t.Fatalf("go list -m all does not list franz-go; the check reads the wrong graph:\n%s", out)
	}
	for _, other := range []string{"github.com/rabbitmq/amqp091-go", "github.com/nats-io/", "github.com/redis/"} {
		if strings.Contains(string(out), other) {
			t.Errorf("the Kafka inbox's module graph holds %s", other)
		}
	}
}
