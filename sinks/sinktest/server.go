package sinktest

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/relay"
)

// Server is a broker process of the test's own, so that the test can kill
// it: it listens on a free loopback port and keeps its data in a temporary
// directory that outlives restarts.
type Server struct {
	tb   testing.TB
	name string
	bin  string
	args func(port int, dir string) []string
	port int
	dir  string
	cmd  *exec.Cmd
}

// StartServer starts the program name (looked up in PATH, then at the
// paths of also) with the arguments args returns for the port and the data
// directory, waits until it listens, and kills it when the test ends. A
// missing program skips the test, and fails it under CI=true.
func StartServer(tb testing.TB, name string, also []string, args func(port int, dir string) []string) *Server {
	tb.Helper()
	bin, err := exec.LookPath(name)
	for _, p := range also {
		if err == nil {
			break
		}
		if _, serr := os.Stat(p); serr == nil {
			bin, err = p, nil
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s is not installed: %v", name, err)
		}
		tb.Skipf("%s is not installed: %v", name, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &Server{tb: tb, name: name, bin: bin, args: args, port: port, dir: tb.TempDir()}
	s.Start()
	tb.Cleanup(s.Kill)
	return s
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Start starts the server again after Kill and waits until it listens.
func (s *Server) Start() {
	s.tb.Helper()
	s.cmd = exec.Command(s.bin, s.args(s.port, s.dir)...)
	if err := s.cmd.Start(); err != nil {
		s.tb.Fatalf("start %s: %v", s.name, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.tb.Fatalf("%s did not listen on %d: %v", s.name, s.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the server with SIGKILL, as a crash would.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// PublishAcrossRestarts publishes msgs through s while it kills srv twice,
// after a third and after two thirds of the Publish calls, and starts it
// again 300ms later. It fails t unless every message is acknowledged
// exactly once before ctx ends and s reported not Ready while the server
// was down. What reached the broker is the caller's to check.
func PublishAcrossRestarts(ctx context.Context, t *testing.T, s relay.Sink, srv *Server, msgs []*relay.Message) {
	t.Helper()
	n := len(msgs)
	tr := NewTracker(msgs)
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
		srv.Kill()
		t.Logf("killed %s after %d publishes", srv.name, at)
		deadline := time.Now().Add(5 * time.Second)
		for s.Ready() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		sawUnready = sawUnready || !s.Ready()
		time.Sleep(300 * time.Millisecond)
		srv.Start()
	}
	for range published {
	}
	tr.Wait(ctx, t)
	tr.CheckAllAcked(t)
	if !sawUnready {
		t.Error("Ready stayed true while the server was down")
	}
}
