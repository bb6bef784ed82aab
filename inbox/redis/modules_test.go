package redis

import (
	"os/exec"
	"strings"
	"testing"
)

// TestModuleGraphHasNoOtherBroker: a Redis consumer that requires this
// module must not find another broker's client in its module graph.
func TestModuleGraphHasNoOtherBroker(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "all").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "github.com/redis/go-redis/v9 ") {
		t.Fatalf("go list -m all does not list go-redis; the check reads the wrong graph:\n%s", out)
	}
	for _, other := range []string{"github.com/twmb/franz-go", "github.com/rabbitmq/", "github.com/nats-io/"} {
		if strings.Contains(string(out), other) {
			t.Errorf("the Redis inbox's module graph holds %s", other)
		}
	}
}
