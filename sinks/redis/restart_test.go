package redis

import (
	"context"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// startPrivateServer starts a redis-server of the test's own, so that the
// test can kill it. It persists to an append-only file in a temporary
// directory, so that what it acknowledged survives a kill.
func startPrivateServer(tb testing.TB) *sinktest.Server {
	return sinktest.StartServer(tb, "redis-server", nil, func(port int, dir string) []string {
		return []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
			"--save", "", "--appendonly", "yes", "--appendfsync", "always"}
	})
}

// TestServerRestarts kills Redis twice while messages flow: every message
// is acknowledged and in its stream, in publish order per aggregate (a
// batch cut off mid-reply may be there twice), and Ready is false while
// the server is down.
func TestServerRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a redis-server")
	}
	sinktest.VerifyNoLeaks(t)
	ps := startPrivateServer(t)
	url := "redis://" + ps.Addr() + "/0"
	f := newFixtureURL(t, url)
	cfg := f.config()
	cfg.URL = url
	cfg.Timeout = 2 * time.Second
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
	c := &consumer{rdb: f.rdb, key: f.prefix + "restart", last: "0"}
	got := sinktest.ReceiveAll(ctx, t, c, msgs)
	sinktest.CheckOrder(t, msgs, got)
	t.Logf("received %d entries for %d messages", len(got), n)
}
