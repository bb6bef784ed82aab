package inbox

import (
	"os/exec"
	"strings"
	"testing"
)

// TestModuleGraphIsPgxOnly: the core's module graph holds pgx and what pgx
// needs, and no broker client, Prometheus or the relay's module.
func TestModuleGraphIsPgxOnly(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "all").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "github.com/jackc/pgx/v5 ") {
		t.Fatalf("go list -m all does not list pgx; the check reads the wrong graph:\n%s", out)
	}
	for _, other := range []string{"github.com/twmb/", "github.com/rabbitmq/", "github.com/nats-io/", "github.com/redis/",
		"github.com/prometheus/", "github.com/outboxrelay/outboxrelay "} {
		if strings.Contains(string(out), other) {
			t.Errorf("the inbox core's module graph holds %s", other)
		}
	}
}
