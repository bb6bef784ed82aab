package nats

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

// privateServer is a nats-server of the test's own, so that the test can
// kill it: JetStream on, its store in a temporary directory that outlives
// restarts.
type privateServer struct {
	tb   testing.TB
	bin  string
	port int
	dir  string
	cmd  *exec.Cmd
}

func startPrivateServer(tb testing.TB) *privateServer {
	tb.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/nats-server"); serr == nil {
			bin = "/usr/sbin/nats-server"
		} else if os.Getenv("CI") == "true" {
			tb.Fatalf("nats-server is not installed: %v", err)
		} else {
			tb.Skipf("nats-server is not installed: %v", err)
		}
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

func (ps *privateServer) url() string { return "nats://127.0.0.1:" + strconv.Itoa(ps.port) }

func (ps *privateServer) start() {
	ps.tb.Helper()
	ps.cmd = exec.Command(ps.bin, "-a", "127.0.0.1", "-p", strconv.Itoa(ps.port), "-js", "-sd", ps.dir)
	if err := ps.cmd.Start(); err != nil {
		ps.tb.Fatalf("start nats-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(ps.port), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			ps.tb.Fatalf("nats-server did not listen on %d: %v", ps.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill stops the server with SIGKILL, as a crash would.
func (ps *privateServer) kill() {
	if ps.cmd == nil {
		return
	}
	_ = ps.cmd.Process.Kill()
	_ = ps.cmd.Wait()
	ps.cmd = nil
}

// TestServerRestarts kills the server twice while messages flow: every
// message is acknowledged, the stream holds each exactly once, and every
// aggregate's messages are in publish order. Ready is false while the
// server is down.
func TestServerRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a nats-server")
	}
	verifyNoLeaks(t)
	ps := startPrivateServer(t)
	stream := "RESTARTS"
	cfg := Config{
		URL: ps.url(), Subject: "r.{aggregate_type}.{event_type}", Stream: stream, CreateStream: true,
		ReconnectWait: 50 * time.Millisecond, AckTimeout: 2 * time.Second, MaxPending: 500,
	}
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
				time.Sleep(5 * time.Millisecond) // spread the messages over the restarts
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
		t.Logf("killed nats-server after %d publishes", at)
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

	f := &fixture{stream: stream, prefix: "r"}
	f.nc, f.js = adminConnURL(t, ps.url())
	if got := f.count(t); got != n {
		t.Errorf("stream holds %d messages, want exactly %d", got, n)
	}
	got := sinktest.ReceiveAll(ctx, t, f.consumer(t, "r.>"), msgs)
	sinktest.CheckOrder(t, msgs, got)
	t.Logf("received %d messages for %d ids", len(got), n)
}
