package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

// The package shares one PostgreSQL server (wal_level=logical, a small
// logical_decoding_work_mem so that big transactions spill) and the relay
// binary; each test gets its own database, slot and broker.
var (
	pg        *pgserver.Server
	relayBin  string
	dbCounter atomic.Int64
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "outboxrelay-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	relayBin = filepath.Join(dir, "outboxrelay")
	build := exec.Command("go", "build", "-o", relayBin, "../cmd/outboxrelay")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build outboxrelay:", err)
		return 1
	}
	settings := map[string]string{
		"logical_decoding_work_mem": "64kB",
		"max_wal_senders":           "40",
		"max_replication_slots":     "40",
		"max_connections":           "200",
	}
	pg, err = pgserver.Start(ctx, pgserver.Options{Version: pgservertest.Version(), Settings: settings})
	if errors.Is(err, pgserver.ErrVersionMissing) && os.Getenv("CI") != "true" {
		fmt.Fprintf(os.Stderr, "skipping the end-to-end tests: %v (set CI=true to make this a failure)\n", err)
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "start PostgreSQL:", err)
		return 1
	}
	if v, err := pg.Version(); err == nil {
		fmt.Fprintf(os.Stderr, "PostgreSQL %d from %s\n", v, pg.BinDir())
	}
	defer pg.Stop()
	if os.Getenv(matrixEnv) != "" {
		if matrixServers, err = startMatrix(ctx, pg, settings); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer stopMatrix(matrixServers)
	}
	return m.Run()
}

// env is one test's database and broker.
type env struct {
	t       *testing.T
	dbURL   string
	db      *pgx.Conn
	kafka   *kfake.Cluster
	brokers string
	extra   string // extra YAML appended to the config
}

// newEnv creates a database, migrates it with the relay binary and starts
// a kfake broker that the relay reaches over TCP. The database is on the
// package's server, or under TestMatrix on the version's (serverFor).
func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWith(t, serverFor(t), "")
}

// newEnvOn is newEnv on a server of the test's own, for tests that stop it.
func newEnvOn(t *testing.T, srv *pgserver.Server) *env {
	t.Helper()
	return newEnvWith(t, srv, "")
}

// newEnvWith is newEnv on srv that runs preMigrate (SQL) in the new
// database before migrate: an outbox table or a publication of the user's own.
func newEnvWith(t *testing.T, srv *pgserver.Server, preMigrate string, migrateArgs ...string) *env {
	t.Helper()
	ctx := t.Context()
	name := fmt.Sprintf("it_%d_%d", os.Getpid(), dbCounter.Add(1))
	url, err := srv.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatalf("create database: %v", err)
	}
	return newEnvIn(t, url, preMigrate, migrateArgs...)
}

// newEnvIn is newEnvWith in the database at url, which the test created.
func newEnvIn(t *testing.T, url, preMigrate string, migrateArgs ...string) *env {
	t.Helper()
	ctx := t.Context()
	var err error
	e := &env{t: t, dbURL: url}
	if preMigrate != "" {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Exec(ctx, preMigrate)
		c.Close(ctx)
		if err != nil {
			t.Fatalf("%s: %v", preMigrate, err)
		}
	}
	out, code := e.cli(append([]string{"migrate", "--database-url", url}, migrateArgs...)...)
	if code != 0 {
		t.Fatalf("migrate exited %d: %s", code, out)
	}
	e.db, err = pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.db.Close(context.Background())
		// Free the slots so the shared server does not retain WAL for them,
		// and the next test can use the same slot name. A relay killed just
		// before leaves its walsender a moment longer: end it.
		if c, err := pgx.Connect(context.Background(), url); err == nil {
			for attempt := 0; attempt < 50; attempt++ {
				c.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
					WHERE database = current_database() AND active_pid IS NOT NULL`)
				c.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active")
				var left int
				if c.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").Scan(&left) != nil || left == 0 {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			c.Close(context.Background())
		}
	})
	e.kafka, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.kafka.Close)
	e.brokers = e.kafka.ListenAddrs()[0]
	return e
}

func (e *env) config() string {
	e.t.Helper()
	return e.writeConfig(e.configText())
}

func (e *env) writeConfig(cfg string) string {
	e.t.Helper()
	path := filepath.Join(e.t.TempDir(), "outboxrelay.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return path
}

// cliConfig runs `outboxrelay run` with the configuration cfg and args to completion.
func (e *env) cliConfig(cfg string, args ...string) (string, int) {
	e.t.Helper()
	return e.cli(append([]string{"run", "--config", e.writeConfig(cfg)}, args...)...)
}

// configText is the test's configuration file.
func (e *env) configText() string {
	return fmt.Sprintf(`postgres:
  url: %s
  status_interval: 200ms
sink:
  type: kafka
  kafka:
    brokers: [%s]
http:
  listen: 127.0.0.1:0
log:
  level: info
%s`, e.dbURL, e.brokers, e.extra)
}

// cli runs the relay binary to completion and returns its combined output and exit code.
func (e *env) cli(args ...string) (string, int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, relayBin, args...)
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		}
		e.t.Fatalf("run %v: %v", args, err)
	}
	return string(out), 0
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOXRELAY_") {
			env = append(env, kv)
		}
	}
	return env
}

// proc is a running relay.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs `outboxrelay run` in the background.
func (e *env) start(extraEnv ...string) *proc {
	e.t.Helper()
	cmd := exec.Command(relayBin, "run", "--config", e.config())
	cmd.Env = append(cleanEnv(), extraEnv...)
	return e.startCmd(cmd)
}

// startConfig runs `outboxrelay run` with the configuration cfg and args in the background.
func (e *env) startConfig(cfg string, args ...string) *proc {
	e.t.Helper()
	cmd := exec.Command(relayBin, append([]string{"run", "--config", e.writeConfig(cfg)}, args...)...)
	cmd.Env = cleanEnv()
	return e.startCmd(cmd)
}

func (e *env) startCmd(cmd *exec.Cmd) *proc {
	e.t.Helper()
	p := &proc{t: e.t, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	e.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if e.t.Failed() || os.Getenv("OUTBOXRELAY_TEST_LOGS") != "" {
			e.t.Logf("relay output:\n%s", tail(p.out.String(), 60))
		}
	})
	return p
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stop sends SIGTERM and requires a clean exit 0.
func (p *proc) stop() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		p.t.Fatalf("relay did not stop within 60s after SIGTERM\n%s", tail(p.out.String(), 40))
	}
	if p.err != nil {
		p.t.Fatalf("relay exited with %v after SIGTERM\n%s", p.err, tail(p.out.String(), 40))
	}
}

// kill sends SIGKILL: a crash.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// waitLog waits until the relay's output contains s.
func (p *proc) waitLog(s string, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if strings.Contains(p.out.String(), s) {
			return
		}
		select {
		case <-p.done:
			p.t.Fatalf("relay exited (%v) before logging %q\n%s", p.err, s, tail(p.out.String(), 40))
		case <-time.After(50 * time.Millisecond):
		}
	}
	p.t.Fatalf("relay did not log %q within %s\n%s", s, timeout, tail(p.out.String(), 40))
}

// exec runs SQL on the test database.
func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.db.Exec(e.t.Context(), sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// insert writes n rows for aggregate in one transaction and returns their ids.
func (e *env) insert(table, aggType, aggID string, n int) []string {
	e.t.Helper()
	rows, err := e.db.Query(e.t.Context(), fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, event_type, payload)
		SELECT $1, $2, $1 || '.created', jsonb_build_object('seq', g) FROM generate_series(1, $3) g RETURNING id::text`, table),
		aggType, aggID, n)
	if err != nil {
		e.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// record is one consumed Kafka record.
type record struct {
	Topic   string
	Key     string
	Value   []byte
	Headers map[string]string
	Env     map[string]any
	// ProducerID is the idempotent producer that wrote it (a relay's sink
	// client), Timestamp when that producer sent it.
	ProducerID int64
	Timestamp  time.Time
}

// consumer reads every record of the given topics from the start.
type consumer struct {
	t   *testing.T
	cl  *kgo.Client
	mu  sync.Mutex
	got []record
}

func (e *env) consume(topics ...string) *consumer {
	e.t.Helper()
	return e.consumeWith(nil, topics...)
}

// consumeWith is consume with extra client options (TLS, SASL).
func (e *env) consumeWith(opts []kgo.Opt, topics ...string) *consumer {
	e.t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.brokers), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	c := &consumer{t: e.t, cl: cl}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			fs.EachRecord(func(r *kgo.Record) {
				rec := record{Topic: r.Topic, Key: string(r.Key), Value: r.Value, Headers: map[string]string{},
					ProducerID: r.ProducerID, Timestamp: r.Timestamp}
				for _, h := range r.Headers {
					rec.Headers[h.Key] = string(h.Value)
				}
				_ = json.Unmarshal(r.Value, &rec.Env)
				c.mu.Lock()
				c.got = append(c.got, rec)
				c.mu.Unlock()
			})
		}
	}()
	e.t.Cleanup(func() {
		cancel()
		wg.Wait()
		cl.Close()
	})
	return c
}

func (c *consumer) records() []record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]record(nil), c.got...)
}

// waitIDs waits until every id has arrived at least once and returns all records.
func (c *consumer) waitIDs(ids []string, timeout time.Duration) []record {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		recs := c.records()
		seen := map[string]bool{}
		for _, r := range recs {
			seen[r.Headers["message_id"]] = true
		}
		missing := 0
		var sample []string
		for _, id := range ids {
			if !seen[id] {
				missing++
				if len(sample) < 5 {
					sample = append(sample, id)
				}
			}
		}
		if missing == 0 {
			return recs
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%d of %d messages missing after %s (received %d records); first missing: %v", missing, len(ids), timeout, len(recs), sample)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// slotLSN returns the slot's confirmed_flush_lsn.
// waitSlotPast waits up to timeout for the slot's confirmed_flush_lsn to
// reach lsn, and reports whether it did.
func (e *env) waitSlotPast(lsn string, timeout time.Duration) bool {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var past bool
		if err := e.db.QueryRow(e.t.Context(), `SELECT coalesce(confirmed_flush_lsn >= $1::pg_lsn, false) FROM pg_replication_slots WHERE slot_name = 'outboxrelay'`, lsn).Scan(&past); err != nil {
			e.t.Fatal(err)
		}
		if past || !time.Now().Before(deadline) {
			return past
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *env) slotLSN() string {
	e.t.Helper()
	var lsn *string
	err := e.db.QueryRow(e.t.Context(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'outboxrelay'").Scan(&lsn)
	if err != nil {
		e.t.Fatal(err)
	}
	if lsn == nil {
		return ""
	}
	return *lsn
}

// duplicates counts ids that arrived more than once.
func duplicates(recs []record) int {
	n := map[string]int{}
	d := 0
	for _, r := range recs {
		n[r.Headers["message_id"]]++
		if n[r.Headers["message_id"]] == 2 {
			d++
		}
	}
	return d
}
