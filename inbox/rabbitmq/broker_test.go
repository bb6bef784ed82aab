package rabbitmq

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
)

// newQueue connects to the tests' RabbitMQ and declares a durable queue
// of a name of its own (prefix, the pid, the time) with args; the caller
// deletes it and closes conn.
func newQueue(t *testing.T, prefix string, args amqp.Table) (*amqp.Connection, *amqp.Channel, string) {
	t.Helper()
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		consumertest.Unreachable(t, "RabbitMQ", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	queue := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), time.Now().UnixNano())
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		conn.Close()
		t.Fatal(err)
	}
	return conn, ch, queue
}

// queueMessages is how many messages queue holds, ready or delivered and
// not yet acknowledged, as RabbitMQ counts them now: a passive declare
// counts only the ready ones. It asks rabbitmqctl (list_queues, default
// vhost), which .ci/services installs with the broker it starts.
func queueMessages(t *testing.T, queue string) int {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "list_queues", "-q", "--no-table-headers", "name", "messages").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl list_queues: %v: %s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == queue {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("rabbitmqctl list_queues: queue %s: %q is not a count", queue, f[1])
			}
			return n
		}
	}
	t.Fatalf("rabbitmqctl list_queues does not list queue %s (is OUTBOXRELAY_RABBITMQ_URL another broker than the local one?):\n%s", queue, out)
	return 0
}
