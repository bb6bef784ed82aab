package nats

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
)

// newStream connects to the tests' NATS and creates a stream of a name of
// its own (prefix, the pid, the time) over subject.>; the caller deletes
// it and closes nc.
func newStream(ctx context.Context, t *testing.T, prefix string) (nc *nats.Conn, js jetstream.JetStream, stream, subject string) {
	t.Helper()
	nc, err := nats.Connect(natsURL())
	if err != nil {
		consumertest.Unreachable(t, "NATS", err)
	}
	if js, err = jetstream.New(nc); err != nil {
		nc.Close()
		t.Fatal(err)
	}
	stream = fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), time.Now().UnixNano())
	subject = strings.ToLower(stream)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject + ".>"}}); err != nil {
		nc.Close()
		t.Fatal(err)
	}
	return nc, js, stream, subject
}
