package redis

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// decodeSection reads a sink.redis section as the configuration loader
// does: over the registered defaults, unknown keys refused.
func decodeSection(t *testing.T, section string) *Config {
	t.Helper()
	typ, ok := sinks.Lookup("redis")
	if !ok {
		t.Fatal("redis is not registered")
	}
	set := typ.Defaults()
	dec := yaml.NewDecoder(strings.NewReader(section))
	dec.KnownFields(true)
	if err := dec.Decode(set); err != nil {
		t.Fatalf("decode %q: %v", section, err)
	}
	return set.(*Config)
}

// TestTimeoutKeys: sink.redis.dial_timeout and sink.redis.timeout are
// settings of the file, with the package defaults when unset.
func TestTimeoutKeys(t *testing.T) {
	c := decodeSection(t, "url: redis://127.0.0.1:6379/0\n")
	if c.DialTimeout != DefaultDialTimeout || c.Timeout != DefaultTimeout {
		t.Errorf("unset: dial_timeout %v, timeout %v; want %v, %v", c.DialTimeout, c.Timeout, DefaultDialTimeout, DefaultTimeout)
	}
	c = decodeSection(t, "dial_timeout: 2s\ntimeout: 30s\n")
	if c.DialTimeout != 2*time.Second || c.Timeout != 30*time.Second {
		t.Errorf("dial_timeout %v, timeout %v; want 2s, 30s", c.DialTimeout, c.Timeout)
	}
	c = decodeSection(t, "timeout: -1s\n")
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "sink.redis.timeout") {
		t.Errorf("negative timeout: Validate() = %v, want an error naming sink.redis.timeout", err)
	}
}

// TestTimeoutBoundsSilentServer: a server that accepts the connection and
// never answers fails Connect with the configured timeout, not the
// caller's deadline.
func TestTimeoutBoundsSilentServer(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c // held open, never answered
		}
	}()
	defer func() {
		l.Close()
		for c := range accepted {
			c.Close()
		}
	}()

	c := decodeSection(t, "url: redis://"+l.Addr().String()+"/0\ntimeout: 200ms\n")
	s, err := New(*c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The caller's deadline is beyond the timeout: Connect ends with the
	// network timeout go-redis reports.
	ctx, cancel := context.WithTimeout(t.Context(), 2*DefaultTimeout)
	defer cancel()
	err = s.Connect(ctx)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Connect to a silent server: %v, want a network timeout", err)
	}
	if !strings.Contains(err.Error(), "sink.redis.url") {
		t.Errorf("error does not name the setting: %v", err)
	}
}

func TestWaitKeys(t *testing.T) {
	if err := (Config{WaitReplicas: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "sink.redis.wait_replicas") {
		t.Errorf("negative wait_replicas: Validate() = %v", err)
	}
	if err := (Config{WaitReplicas: 1, WaitTimeout: 20 * time.Second}).Validate(); err == nil || !strings.Contains(err.Error(), "sink.redis.wait_timeout") {
		t.Errorf("wait_timeout above timeout: Validate() = %v", err)
	}
	if err := (Config{WaitReplicas: 1}).Validate(); err != nil {
		t.Errorf("wait_replicas 1 with the default timeouts: %v", err)
	}
}
