package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

// verify, replay and recover against real servers: the broker side loses
// messages on purpose (records deleted from a Kafka partition, an entry
// deleted from a Redis stream, a replication slot dropped while rows were
// committed), and the ledger of committed rows says what verify must find
// and what must be at the broker after the repair.

// kafkaRecords reads every record of topic from the start until n arrived.
func kafkaRecords(t *testing.T, brokers, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records of %s", len(recs), n, topic)
		}
		recs = append(recs, fs.Records()...)
	}
	return recs
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// missingIDs returns the ids verify listed under "missing ids:".
func missingIDs(out string) []string {
	_, list, ok := strings.Cut(out, "missing ids:\n")
	if !ok {
		return nil
	}
	var ids []string
	for _, l := range strings.Split(list, "\n") {
		if len(l) == 36 && strings.Count(l, "-") == 4 {
			ids = append(ids, l)
		}
	}
	return ids
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]int{}
	for _, x := range a {
		m[x]++
	}
	for _, x := range b {
		if m[x]--; m[x] < 0 {
			return false
		}
	}
	return true
}

func TestVerifyReplayKafkaDeletedRecords(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	var ids []string
	for _, agg := range []string{"1", "2", "3"} {
		ids = append(ids, e.insert("public.outbox", "order", agg, 10)...)
	}
	recs := kafkaRecords(t, e.brokers, "outbox.order", len(ids))
	p.stop()

	// Delete the first 4 records of the partition of aggregate 1 (they may
	// include records of another aggregate that hashes to it).
	var part int32 = -1
	for _, r := range recs {
		if string(r.Key) == "1" {
			part = r.Partition
			break
		}
	}
	var lost []string
	original := map[string]map[string]any{}
	originalKey := map[string]string{}
	for _, r := range recs {
		originalKey[header(r, "message_id")] = string(r.Key)
		if r.Partition == part && r.Offset < 4 {
			lost = append(lost, header(r, "message_id"))
		}
		var env map[string]any
		if err := json.Unmarshal(r.Value, &env); err != nil {
			t.Fatal(err)
		}
		original[header(r, "message_id")] = env
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: "outbox.order", Partition: part, At: 4})
	if res, err := adm.DeleteRecords(t.Context(), offs); err != nil || res.Error() != nil {
		t.Fatalf("delete records: %v %v", err, res.Error())
	}

	out, code := e.cli("verify", "--config", cfg, "--since", "1h")
	if code != 1 {
		t.Fatalf("verify exited %d, want 1 (missing):\n%s", code, out)
	}
	if got := missingIDs(out); !sameSet(got, lost) {
		t.Fatalf("verify listed missing %v, want exactly %v\n%s", got, lost, out)
	}
	if !strings.Contains(out, fmt.Sprintf("committed      %d\n", len(ids))) || !strings.Contains(out, "missing        4\n") {
		t.Fatalf("verify counts:\n%s", out)
	}
	t.Logf("verify before replay:\n%s", out)

	out, code = e.cli("replay", "--config", cfg, "--since", "1h", "--missing")
	if code != 0 || !strings.Contains(out, "replayed 4 of 4 messages") {
		t.Fatalf("replay --missing exited %d:\n%s", code, out)
	}
	// The broker did not hold them: no duplicate to count.
	if total, reasons := statusRepublished(t, e, "outboxrelay"); total != 0 {
		t.Errorf("status republished_total after replay --missing = %d %v, want 0", total, reasons)
	}
	out, code = e.cli("verify", "--config", cfg, "--since", "1h")
	if code != 0 || !strings.Contains(out, "missing        0\n") || !strings.Contains(out, "duplicates     0\n") {
		t.Fatalf("verify after replay exited %d:\n%s", code, out)
	}

	// The replayed messages are the relay's: same envelope but for the WAL
	// positions the table does not hold.
	all := kafkaRecords(t, e.brokers, "outbox.order", len(ids)-len(lost)+len(lost))
	replayed := 0
	for _, r := range all {
		id := header(r, "message_id")
		if !strings.Contains(strings.Join(lost, " "), id) {
			continue
		}
		replayed++
		var env map[string]any
		if err := json.Unmarshal(r.Value, &env); err != nil {
			t.Fatal(err)
		}
		want := original[id]
		for _, k := range []string{"message_id", "event_type", "aggregate_type", "aggregate_id", "occurred_at", "trace_id", "traceparent", "payload", "headers", "schema_version", "envelope_version"} {
			if fmt.Sprint(env[k]) != fmt.Sprint(want[k]) {
				t.Errorf("replayed %s: %s = %v, relay sent %v", id, k, env[k], want[k])
			}
		}
		// The first records of the partition may belong to another
		// aggregate hashed to it: the relay interleaves aggregates.
		if string(r.Key) != originalKey[id] {
			t.Errorf("replayed %s has key %q, want the aggregate id %q", id, r.Key, originalKey[id])
		}
	}
	if replayed != len(lost) {
		t.Errorf("found %d replayed records, want %d", replayed, len(lost))
	}
}

func TestVerifyReplayRedisDeletedEntry(t *testing.T) {
	pgservertest.RequireTCP(t, "127.0.0.1:6379", "Redis")
	e := newEnv(t)
	prefix := "outboxrelay-verify:" + extraID() + ":"
	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	key := prefix + "order"
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	sinkYAML := fmt.Sprintf("  redis:\n    url: redis://127.0.0.1:6379/0\n    stream: \"%s{aggregate_type}\"", prefix)
	cfg := e.writeConfig(fmt.Sprintf("postgres:\n  url: %s\nsink:\n  type: redis\n%s\nlog:\n  level: warn\n", e.dbURL, sinkYAML))
	p := e.startSinkRelay("redis", sinkYAML)
	ids := e.insert("public.outbox", "order", "7", 20)
	deadline := time.Now().Add(30 * time.Second)
	for n, _ := rdb.XLen(t.Context(), key).Result(); n < int64(len(ids)); n, _ = rdb.XLen(t.Context(), key).Result() {
		if time.Now().After(deadline) {
			t.Fatalf("stream holds %d entries, want %d", n, len(ids))
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.stop()
	entries, err := rdb.XRange(t.Context(), key, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	victim := entries[11]
	if err := rdb.XDel(t.Context(), key, victim.ID).Err(); err != nil {
		t.Fatal(err)
	}
	lost := fmt.Sprint(victim.Values["message_id"])

	out, code := e.cli("verify", "--config", cfg, "--since", "10m")
	if code != 1 || !sameSet(missingIDs(out), []string{lost}) {
		t.Fatalf("verify exited %d, want 1 listing only %s:\n%s", code, lost, out)
	}
	out, code = e.cli("replay", "--config", cfg, "--since", "10m", "--missing")
	if code != 0 || !strings.Contains(out, "replayed 1 of 1 messages") {
		t.Fatalf("replay --missing exited %d:\n%s", code, out)
	}
	out, code = e.cli("verify", "--config", cfg, "--since", "10m")
	if code != 0 || !strings.Contains(out, "found          20\n") {
		t.Fatalf("verify after replay exited %d:\n%s", code, out)
	}
}

func TestVerifyBadInput(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	e.insert("public.outbox", "order", "1", 1)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"verify", "--config", cfg}, "--since is required"},
		{[]string{"verify", "--config", cfg, "--since", "yesterday"}, "neither an RFC 3339 time"},
		{[]string{"verify", "--config", cfg, "--since", "2000-01-01T00:00:00Z", "--until", "2000-01-02T00:00:00Z"}, "no outbox rows are retained"},
		{[]string{"replay", "--config", cfg, "--since", "1h", "--rate", "-1"}, "must not be negative"},
		{[]string{"verify", "--config", e.writeConfig(strings.Replace(e.configText(), "type: kafka", "type: rabbitmq\n  rabbitmq:\n    url: amqp://guest:guest@127.0.0.1:5672/", 1)), "--since", "1h"}, "cannot be read without consuming"},
		{[]string{"recover", "--config", cfg}, "healthy"},
	} {
		out, code := e.cli(c.args...)
		wantCode := 2
		if c.want == "healthy" {
			wantCode = 0
		}
		if code != wantCode || !strings.Contains(out, c.want) || strings.Count(strings.TrimSpace(out), "\n") > 0 && wantCode == 2 {
			t.Errorf("%v: exit %d, want %d with one line containing %q:\n%s", c.args[:1], code, wantCode, c.want, out)
		}
	}
}

// TestRecoverDroppedSlot drops the slot while committed rows wait in it
// and more rows are committed while no slot exists: the relay refuses to
// start, recover re-creates the slot and republishes, and then every
// committed row is at the broker.
func TestRecoverDroppedSlot(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	var ids []string
	ids = append(ids, e.insert("public.outbox", "order", "1", 20)...)
	kafkaRecords(t, e.brokers, "outbox.order", len(ids))
	p.stop()

	// Rows in the slot, then the slot dropped, then rows with no slot.
	ids = append(ids, e.insert("public.outbox", "order", "1", 30)...)
	ids = append(ids, e.insert("public.outbox", "order", "2", 30)...)
	e.exec("SELECT pg_drop_replication_slot('outboxrelay')")
	ids = append(ids, e.insert("public.outbox", "order", "1", 25)...)

	out, code := e.cli("run", "--config", cfg)
	if code != 2 || !strings.Contains(out, "outboxrelay recover") {
		t.Fatalf("relay after the slot was dropped exited %d, want 2 naming recover:\n%s", code, tail(out, 5))
	}
	// The relay's start re-created the slot: rows committed now are in it.
	ids = append(ids, e.insert("public.outbox", "order", "2", 10)...)

	out, code = e.cli("verify", "--config", cfg, "--since", "1h")
	lostBefore := len(missingIDs(out))
	if code != 1 || lostBefore != len(ids)-20 {
		t.Fatalf("verify before recover exited %d with %d missing, want 1 and %d:\n%s", code, lostBefore, len(ids)-20, out)
	}

	out, code = e.cli("recover", "--config", cfg)
	if code != 0 || !strings.Contains(out, "recovered") {
		t.Fatalf("recover exited %d:\n%s", code, out)
	}
	t.Logf("recover:\n%s", out)
	var republished int64
	if _, err := fmt.Sscanf(out[strings.Index(out, "republished "):], "republished %d messages", &republished); err != nil || republished == 0 {
		t.Fatalf("recover's output has no republished count (%v):\n%s", err, out)
	}
	if total, reasons := statusRepublished(t, e, "outboxrelay"); total != republished || reasons["recover"] != republished {
		t.Errorf("status republished_total after recover = %d %v, want %d for recover", total, reasons, republished)
	}

	p = e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	ids = append(ids, e.insert("public.outbox", "order", "1", 15)...)
	c := e.consume("outbox.order")
	recs := c.waitIDs(ids, 60*time.Second)
	p.stop()

	// Per aggregate, first deliveries in commit order.
	pos := map[string]int{}
	for i, id := range ids {
		pos[id] = i
	}
	last := map[string]int{}
	seen := map[string]bool{}
	for _, r := range recs {
		id := r.Headers["message_id"]
		if seen[id] {
			continue
		}
		seen[id] = true
		if prev, ok := last[r.Key]; ok && pos[id] < prev {
			t.Errorf("aggregate %s: row #%d first delivered after #%d", r.Key, pos[id], prev)
		}
		last[r.Key] = pos[id]
	}
	out, code = e.cli("verify", "--config", cfg, "--since", "1h")
	if code != 0 {
		t.Fatalf("verify after recover exited %d:\n%s", code, out)
	}
	t.Logf("recovery figures: rows %d, lost before recover %d, lost after 0, duplicates %d", len(ids), lostBefore, duplicates(recs))
}

// TestRecoverLostSlot loses the slot to a small max_slot_wal_keep_size while
// the relay is stopped and rows are committed under load: the relay
// refuses the lost slot naming recover, and after recover every committed
// row is at the broker.
func TestRecoverLostSlot(t *testing.T) {
	srv := pgservertest.Start(t, pgserver.Options{Settings: map[string]string{
		"max_slot_wal_keep_size": "1MB", "max_wal_size": "64MB", "min_wal_size": "32MB",
	}})
	e := newEnvOn(t, srv)
	cfg := e.config()
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := e.insert("public.outbox", "order", "1", 10)
	kafkaRecords(t, e.brokers, "outbox.order", len(ids))
	p.stop()

	e.exec("CREATE TABLE filler (x text)")
	deadline := time.Now().Add(90 * time.Second)
	for {
		ids = append(ids, e.insert("public.outbox", "order", "1", 20)...)
		ids = append(ids, e.insert("public.outbox", "order", "2", 20)...)
		e.exec("INSERT INTO filler SELECT repeat(md5(g::text), 30) FROM generate_series(1, 20000) g")
		e.exec("TRUNCATE filler")
		e.exec("SELECT pg_switch_wal()")
		e.exec("CHECKPOINT")
		var status string
		if err := e.db.QueryRow(t.Context(), "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = 'outboxrelay'").Scan(&status); err != nil {
			t.Fatal(err)
		}
		if status == "lost" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot wal_status is %q after 90s of load, want lost", status)
		}
	}
	ids = append(ids, e.insert("public.outbox", "order", "2", 10)...)

	out, code := e.cli("run", "--config", cfg)
	if code != 2 || !strings.Contains(out, "wal_status=lost") || !strings.Contains(out, "outboxrelay recover") {
		t.Fatalf("relay on a lost slot exited %d, want 2 naming recover:\n%s", code, tail(out, 5))
	}
	out, code = e.cli("verify", "--config", cfg, "--since", "1h")
	lostBefore := len(missingIDs(out))
	if code != 1 {
		t.Fatalf("verify before recover exited %d, want 1:\n%s", code, out)
	}
	out, code = e.cli("recover", "--config", cfg)
	if code != 0 || !strings.Contains(out, "has lost WAL") {
		t.Fatalf("recover exited %d:\n%s", code, out)
	}
	p = e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	ids = append(ids, e.insert("public.outbox", "order", "1", 5)...)
	recs := e.consume("outbox.order").waitIDs(ids, 60*time.Second)
	p.stop()
	out, code = e.cli("verify", "--config", cfg, "--since", "1h")
	if code != 0 {
		t.Fatalf("verify after recover exited %d:\n%s", code, out)
	}
	t.Logf("lost-slot recovery figures: rows %d, lost before recover %d, lost after 0, duplicates %d", len(ids), lostBefore, duplicates(recs))
}

// renderTTY returns the lines a terminal shows for out: a carriage return
// goes back to the start of the line, ESC [K erases to its end.
func renderTTY(out string) []string {
	var lines []string
	for _, l := range strings.Split(strings.ReplaceAll(out, "\r\n", "\n"), "\n") {
		var screen []rune
		col := 0
		for i := 0; i < len(l); {
			switch {
			case l[i] == '\r':
				col = 0
				i++
			case strings.HasPrefix(l[i:], "\x1b[K"):
				screen = screen[:col]
				i += 3
			default:
				r, size := utf8.DecodeRuneInString(l[i:])
				if col < len(screen) {
					screen[col] = r
				} else {
					screen = append(screen, r)
				}
				col++
				i += size
			}
		}
		lines = append(lines, string(screen))
	}
	return lines
}

// TestVerifyCountsParked: messages parked behind a dead letter of their
// aggregate are counted as parked, not missing, and on a terminal (stdout
// and stderr on one screen) the progress line does not run into the
// report.
func TestVerifyCountsParked(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order.created")
	e.extra = "relay:\n  max_attempts: 2\n"
	text := strings.Replace(e.configText(), "    brokers: ["+e.brokers+"]\n", "    brokers: ["+e.brokers+"]\n    topic: outbox.{event_type}\n", 1)
	if !strings.Contains(text, "topic: outbox.{event_type}") {
		t.Fatalf("could not set the topic in:\n%s", text)
	}
	cfg := e.writeConfig(text)
	p := e.startConfig(text)
	p.waitLog(`"streaming"`, 30*time.Second)
	first := e.insertEvents("7", "order.created", 2)
	poison := e.insertEvents("7", "bad topic", 1)[0]
	parked := e.insertEvents("7", "order.created", 3)
	others := e.insertEvents("1", "order.created", 3)
	c.waitIDs(append(first, others...), 60*time.Second)
	if head := e.waitParked(parked); head.MessageID != poison {
		t.Fatalf("dead letter %s, want the poison message %s", head.MessageID, poison)
	}
	p.stop()

	out, code := e.cli("verify", "--config", cfg, "--since", "10m")
	for _, want := range []string{"committed      9\n", "found          5\n", "missing        0\n", "dead-lettered  1\n", "parked         3\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("verify does not report %q:\n%s", want, out)
		}
	}
	if code != 0 || strings.Contains(out, "missing ids:") {
		t.Errorf("verify exited %d, want 0 with no missing ids (3 parked are not missing):\n%s", code, out)
	}

	// The same on a terminal: script(1) runs verify with stdout and stderr
	// on one pseudo-terminal.
	scriptBin, err := exec.LookPath("script")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("script (util-linux) is not installed; it gives verify a terminal")
		}
		t.Skip("script (util-linux) is not installed; it gives verify a terminal (CI=true makes this a failure)")
	}
	cmd := exec.CommandContext(t.Context(), scriptBin, "-qec", relayBin+" verify --config "+cfg+" --since 10m", "/dev/null")
	cmd.Env = cleanEnv()
	raw, err := cmd.CombinedOutput()
	if _, exited := err.(*exec.ExitError); err != nil && !exited {
		t.Fatalf("verify on a terminal: %v\n%q", err, raw)
	}
	screen := renderTTY(string(raw))
	var report bool
	for _, l := range screen {
		if strings.Contains(l, "reading the broker") && strings.Contains(l, "committed") {
			t.Errorf("the progress line runs into the report: %q", l)
		}
		report = report || strings.TrimSpace(l) == "committed      9"
	}
	if !report {
		t.Errorf("no report line %q on the terminal:\n%s\n(raw %q)", "committed      9", strings.Join(screen, "\n"), raw)
	}
	t.Logf("verify: 9 committed, 5 found, 1 dead-lettered, 3 parked, 0 missing; terminal:\n%s", strings.Join(screen, "\n"))
}
