package integration

import (
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestReadinessFollowsTheReplicationConnection: /readyz stays 200 on an
// idle, healthy relay, turns 503 within seconds once the replication
// connection goes silent (a partition that drops packets and resets
// nothing, so no receive fails), and 200 again after it heals, with every
// row delivered.
//
// The bound is the stream's: it asks the walsender for a reply at every
// status update (postgres.status_interval, 200ms here) once it has heard
// nothing for one interval, and counts as stalled after max(3 ×
// status_interval, 3s) of silence (cdc.Stream.StallAfter). /readyz must
// answer 503 within that plus two status intervals and a second of slack:
// 4.4s. Before, it stayed 200 until the 30s receive timeout ended the
// session.
func TestReadinessFollowsTheReplicationConnection(t *testing.T) {
	const (
		statusInterval = 200 * time.Millisecond
		stallAfter     = 3 * time.Second // max(3 × statusInterval, 3s)
		bound          = stallAfter + 2*statusInterval + time.Second
	)
	e := newEnv(t)
	proxy := startFreezeProxy(t, "127.0.0.1:"+strconv.Itoa(pg.Port()))
	u, err := url.Parse(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = proxy.addr()
	cfg := e.configText()
	if !strings.Contains(cfg, "status_interval: 200ms") {
		t.Fatalf("the test's config no longer has status_interval 200ms:\n%s", cfg)
	}
	p := e.startConfig(strings.Replace(cfg, e.dbURL, u.String(), 1))
	p.waitLog(`"streaming"`, 30*time.Second)
	readyz := "http://" + p.httpAddr() + "/readyz"
	c := e.consume("outbox.order")
	ids := e.insert("outbox", "order", "1", 100)
	c.waitIDs(ids, 30*time.Second)
	waitReady(t, readyz, 200, 30*time.Second)

	// Idle and healthy: the walsender sends nothing of its own for
	// wal_sender_timeout/2 (30s), so readiness relies on the replies the
	// relay asks for.
	for deadline := time.Now().Add(2*stallAfter + time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if code, body := get(t, readyz); code != 200 {
			t.Fatalf("idle healthy relay: /readyz %d %q", code, body)
		}
	}

	proxy.freeze()
	frozen := time.Now()
	ids = append(ids, e.insert("outbox", "order", "2", 100)...) // written during the partition
	var took time.Duration
	var body string
	for {
		code, b := get(t, readyz)
		if code == 503 {
			took, body = time.Since(frozen), b
			break
		}
		if time.Since(frozen) > 45*time.Second {
			proxy.thaw()
			t.Fatalf("/readyz still %d %q %s after the replication connection went silent", code, b, time.Since(frozen).Round(100*time.Millisecond))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("/readyz 503 %s after the partition: %q", took.Round(100*time.Millisecond), body)
	if took > bound {
		t.Errorf("/readyz turned 503 only %s after the replication connection went silent, want within %s", took.Round(100*time.Millisecond), bound)
	}
	if !strings.Contains(body, "sent nothing on the replication connection") {
		t.Errorf("/readyz 503 does not say the replication connection is silent: %q", body)
	}
	proxy.thaw()
	waitReady(t, readyz, 200, 60*time.Second)
	recs := c.waitIDs(ids, 60*time.Second)
	p.stop()
	t.Logf("partition of the PostgreSQL connection: rows %d, lost 0, duplicates %d; /readyz 503 after %s (bound %s)",
		len(ids), duplicates(recs), took.Round(100*time.Millisecond), bound)
}

// waitReady polls url until it answers want.
func waitReady(t *testing.T, url string, want int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		code, body := get(t, url)
		if code == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s answered %d %q for %s, want %d", url, code, body, timeout, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// freezeProxy forwards TCP connections to target and can freeze them: no
// byte passes either way and new connections wait, as in a network
// partition that drops packets without resetting anything. Safe for
// concurrent use.
type freezeProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	frozen chan struct{} // closed by thaw; nil when not frozen
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startFreezeProxy(t *testing.T, target string) *freezeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezeProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *freezeProxy) addr() string { return p.ln.Addr().String() }

// gate waits while the proxy is frozen.
func (p *freezeProxy) gate() {
	p.mu.Lock()
	frozen := p.frozen
	p.mu.Unlock()
	if frozen != nil {
		<-frozen
	}
}

func (p *freezeProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen == nil {
		p.frozen = make(chan struct{})
	}
}

func (p *freezeProxy) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
}

func (p *freezeProxy) serve() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.gate()
			server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
			if err != nil {
				client.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, client, server)
			p.mu.Unlock()
			p.wg.Add(2)
			go p.pipe(server, client)
			go p.pipe(client, server)
		}()
	}
}

// pipe copies src to dst, holding each chunk while the proxy is frozen.
func (p *freezeProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // the peer closed: so does the other side (deferred)
		}
	}
}

func (p *freezeProxy) close() {
	p.ln.Close()
	p.thaw()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
