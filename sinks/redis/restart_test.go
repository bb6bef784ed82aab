package redis

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// privateServer is a redis-server of the test's own, so that the test can
// kill it. It persists to an append-only file in a temporary directory, so
// that what it acknowledged survives a kill.
type privateServer struct {
	tb   testing.TB
	bin  string
	port int
	dir  string
	cmd  *exec.Cmd
}

func startPrivateServer(tb testing.TB) *privateServer {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("redis-server is not installed: %v", err)
		}
		tb.Skipf("redis-server is not installed: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ps := &privateServer{tb: tb, bin: bin, port: port, dir: tb.TempDir()}
	ps.start()
	tb.Cleanup(ps.kill)
	return ps
}

func (ps *privateServer) url() string { return "redis://127.0.0.1:" + strconv.Itoa(ps.port) + "/0" }

func (ps *privateServer) start() {
	ps.tb.Helper()
	ps.cmd = exec.Command(ps.bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(ps.port), "--dir", ps.dir,
		"--save", "", "--appendonly", "yes", "--appendfsync", "always")
	if err := ps.cmd.Start(); err != nil {
		ps.tb.Fatalf("start redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(ps.port), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			ps.tb.Fatalf("redis-server did not listen on %d: %v", ps.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (ps *privateServer) kill() {
	if ps.cmd == nil {
		return
	}
	_ = ps.cmd.Process.Kill()
	_ = ps.cmd.Wait()
	ps.cmd = nil
}

// TestServerRestarts kills Redis twice while messages flow: every message
// is acknowledged and in its stream, in publish order per aggregate (a
// batch cut off mid-reply may be there twice), and Ready is false while
// the server is down.
func TestServerRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a redis-server")
	}
	verifyNoLeaks(t)
	ps := startPrivateServer(t)
	f := newFixtureURL(t, ps.url())
	cfg := f.config()
	cfg.URL = ps.url()
	cfg.Timeout = 2 * time.Second
	s, err := New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Connect(t.Context()); err != nil {
		t.Fatal(err)
	}
	runSink(t, s)

	const n = 20000
	msgs := sinktest.Messages("restart", n, 50)
	tr := sinktest.NewTracker(msgs)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	published := make(chan int, n)
	go func() {
		for i, m := range msgs {
			s.Publish(ctx, m, tr.Done)
			published <- i
			if i%200 == 0 {
				time.Sleep(5 * time.Millisecond)
			}
		}
		close(published)
	}()

	sawUnready := false
	for _, at := range []int{n / 3, 2 * n / 3} {
		for i := range published {
			if i >= at {
				break
			}
		}
		ps.kill()
		t.Logf("killed redis-server after %d publishes", at)
		deadline := time.Now().Add(5 * time.Second)
		for s.Ready() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		sawUnready = sawUnready || !s.Ready()
		time.Sleep(300 * time.Millisecond)
		ps.start()
	}
	for range published {
	}
	tr.Wait(ctx, t)
	tr.CheckAllAcked(t)
	if !sawUnready {
		t.Error("Ready stayed true while the server was down")
	}
	c := &consumer{rdb: f.rdb, key: f.prefix + "restart", last: "0"}
	got := sinktest.ReceiveAll(ctx, t, c, msgs)
	sinktest.CheckOrder(t, msgs, got)
	t.Logf("received %d entries for %d messages", len(got), n)
}
