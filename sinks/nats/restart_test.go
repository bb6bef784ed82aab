package nats

import (
	"context"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// startPrivateServer starts a nats-server of the test's own, so that the
// test can kill it: JetStream on, its store in a temporary directory that
// outlives restarts.
func startPrivateServer(tb testing.TB) *sinktest.Server {
	return sinktest.StartServer(tb, "nats-server", []string{"/usr/sbin/nats-server"}, func(port int, dir string) []string {
		return []string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", dir}
	})
}

// TestServerRestarts kills the server twice while messages flow: every
// message is acknowledged, the stream holds each exactly once, and every
// aggregate's messages are in publish order. Ready is false while the
// server is down.
func TestServerRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a nats-server")
	}
	sinktest.VerifyNoLeaks(t)
	ps := startPrivateServer(t)
	url := "nats://" + ps.Addr()
	stream := "RESTARTS"
	cfg := Config{
		URL: url, Subject: "r.{aggregate_type}.{event_type}", Stream: stream, CreateStream: true,
		ReconnectWait: 50 * time.Millisecond, AckTimeout: 2 * time.Second, MaxInFlight: 500,
	}
	s, err := New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Connect(t.Context()); err != nil {
		t.Fatal(err)
	}
	sinktest.RunSink(t, s)

	const n = 20000
	msgs := sinktest.Messages("restart", n, 50)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sinktest.PublishAcrossRestarts(ctx, t, s, ps, msgs)

	f := &fixture{stream: stream, prefix: "r"}
	f.nc, f.js = adminConnURL(t, url)
	if got := f.count(t); got != n {
		t.Errorf("stream holds %d messages, want exactly %d", got, n)
	}
	got := sinktest.ReceiveAll(ctx, t, f.consumer(t, "r.>"), msgs)
	sinktest.CheckOrder(t, msgs, got)
	t.Logf("received %d messages for %d ids", len(got), n)
}
