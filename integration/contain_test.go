package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	goredis "github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
	"github.com/outboxrelay/outboxrelay/sinks/kafka"
)

// Row content stays inside its message: a row cannot address the relay's
// own destinations, and a destination or header that is not valid UTF-8
// dead-letters its row instead of stopping the relay (issue 28, items 1
// and 2).

// lostAfter waits up to timeout for every id of ids to reach c and returns
// how many did not.
func lostAfter(c *consumer, ids []string, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for {
		seen := map[string]bool{}
		for _, r := range c.records() {
			seen[r.Headers["message_id"]] = true
		}
		lost := 0
		for _, id := range ids {
			if !seen[id] {
				lost++
			}
		}
		if lost == 0 || time.Now().After(deadline) {
			return lost
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// deadLetterError returns the error stored with id's dead letter, waiting
// up to timeout for it; "" when there is none.
func (e *env) deadLetterError(id string, timeout time.Duration) string {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var msg string
		err := e.db.QueryRow(e.t.Context(), "SELECT error FROM outboxrelay.dead_letters WHERE message_id = $1", id).Scan(&msg)
		if err == nil {
			return msg
		}
		if err != pgx.ErrNoRows {
			e.t.Fatalf("read dead letter %s: %v", id, err)
		}
		if time.Now().After(deadline) {
			return ""
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// operatorView is what an operator sees: the exit code of outboxrelay
// status and the relay's /readyz.
func (e *env) operatorView(p *proc) string {
	e.t.Helper()
	_, code := e.cli("status", "--database-url", e.dbURL)
	resp, err := http.Get("http://" + p.httpAddr() + "/readyz")
	if err != nil {
		e.t.Fatalf("GET /readyz: %v", err)
	}
	resp.Body.Close()
	return fmt.Sprintf("status exit %d, /readyz %d", code, resp.StatusCode)
}

// TestExactlyOnceRowCannotWritePosition: with exactly_once and the topic
// template {aggregate_type}, a row addressed to __outboxrelay_positions,
// keyed with the transactional.id and holding FF/FFFFFFFF as its raw
// (debezium, text) payload, is dead-lettered and never produced. Before,
// it was produced into the positions topic inside the relay's own
// transaction, and after the next restart the relay skipped every later
// transaction: 3 of 6 rows lost, with status 0 and /readyz 200.
func TestExactlyOnceRowCannotWritePosition(t *testing.T) {
	e := newEnv(t)
	e.exec(`ALTER TABLE public.outbox ALTER COLUMN payload TYPE text USING payload::text`)
	cfg := []string{exactlyOnce, "OUTBOXRELAY_ENVELOPE_FORMAT=debezium", "OUTBOXRELAY_SINK_KAFKA_TOPIC={aggregate_type}"}
	c := e.consumeCommitted("order")
	p := e.start(cfg...)
	p.waitLog(`"streaming"`, 30*time.Second)

	var ids []string
	for range 2 {
		ids = append(ids, e.insert("public.outbox", "order", "1", 1)...)
	}
	var hostile string
	err := e.db.QueryRow(t.Context(), `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ($1, $2, 'position.forged', 'FF/FFFFFFFF') RETURNING id::text`,
		kafka.DefaultPositionsTopic, kafka.TransactionalID("outboxrelay")).Scan(&hostile)
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, e.insert("public.outbox", "order", "2", 1)...)
	if lost := lostAfter(c, ids, 60*time.Second); lost != 0 {
		t.Fatalf("%d of %d rows lost before the restart", lost, len(ids))
	}
	p.stop()

	p = e.start(cfg...)
	p.waitLog(`"streaming"`, 30*time.Second)
	for range 3 {
		ids = append(ids, e.insert("public.outbox", "order", "1", 1)...)
	}
	lost := lostAfter(c, ids, 30*time.Second)
	view := e.operatorView(p)
	reason := e.deadLetterError(hostile, 10*time.Second)
	t.Logf("rows %d (and 1 hostile), lost %d; %s; hostile row dead-lettered: %q", len(ids), lost, view, reason)
	if lost != 0 {
		t.Errorf("%d of %d rows lost after a row addressed the positions topic", lost, len(ids))
	}
	if d := duplicates(c.records()); d != 0 {
		t.Errorf("%d rows arrived twice: the restarted relay did not resume from its position", d)
	}
	if !strings.Contains(reason, `kafka topic "__outboxrelay_positions" is reserved for the relay's exactly-once positions`) {
		t.Errorf("hostile row's dead letter: %q, want the reason that the topic is the relay's own", reason)
	}
	for _, r := range c.records() {
		if r.Headers["message_id"] == hostile {
			t.Errorf("the hostile row reached topic %s", r.Topic)
		}
	}
	p.stop()

	// Nothing but the relay's own position records is in the topic.
	rd, err := kgo.NewClient(kgo.SeedBrokers(e.brokers), kgo.ConsumeTopics(kafka.DefaultPositionsTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	positions := 0
	for ctx.Err() == nil {
		rd.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			positions++
			if len(r.Headers) != 1 || r.Headers[0].Key != kafka.PositionHeader || string(r.Value) == "FF/FFFFFFFF" {
				var names []string
				for _, h := range r.Headers {
					names = append(names, h.Key)
				}
				t.Errorf("positions topic holds a record the relay did not write: key %q, value %q, headers %v", r.Key, r.Value, names)
			}
		})
	}
	if positions == 0 {
		t.Error("the positions topic holds no record")
	}
}

// newSQLASCIIEnv is newEnv in a SQL_ASCII database, which stores whatever
// bytes a client sends in text columns, valid UTF-8 or not.
func newSQLASCIIEnv(t *testing.T) *env {
	t.Helper()
	name := fmt.Sprintf("it_%d_%d_ascii", os.Getpid(), dbCounter.Add(1))
	c, err := pgx.Connect(t.Context(), pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(t.Context(), "CREATE DATABASE "+name+" ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
	c.Close(context.Background())
	if err != nil {
		t.Fatalf("create database: %v", err)
	}
	return newEnvIn(t, pg.URL(name), "")
}

// insertInvalidUTF8 commits a row whose aggregate_type holds the byte 0xE9
// (Latin-1 é, not UTF-8) and returns its id.
func (e *env) insertInvalidUTF8() string {
	e.t.Helper()
	var id string
	if err := e.db.QueryRow(e.t.Context(), `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES (E'ord\xe9r', 'bad', 'order.created', '{}') RETURNING id::text`).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// checkContainedUTF8 is the end of the invalid UTF-8 scenario on any sink:
// the bad row is dead-lettered with the reason, the relay still runs and
// is ready, and every good row (got: the ids the broker holds) arrived once.
func checkContainedUTF8(t *testing.T, e *env, p *proc, bad string, good, got []string) {
	t.Helper()
	reason := checkContained(t, e, p, bad, good, got)
	if !strings.Contains(reason, `is not valid UTF-8 (byte 0xE9 at offset`) {
		t.Errorf("dead letter of the bad row: %q, want the reason that its destination or key is not valid UTF-8", reason)
	}
}

// checkContained checks that the bad row is dead-lettered and never
// delivered, that the relay still runs and is ready, and that every good
// row (got: the ids the broker holds) arrived once. It returns the bad
// row's dead letter error.
func checkContained(t *testing.T, e *env, p *proc, bad string, good, got []string) string {
	t.Helper()
	seen := map[string]int{}
	for _, id := range got {
		seen[id]++
	}
	lost, dup := 0, 0
	for _, id := range good {
		switch seen[id] {
		case 0:
			lost++
		case 1:
		default:
			dup++
		}
	}
	reason := e.deadLetterError(bad, 30*time.Second)
	select {
	case <-p.done:
		t.Fatalf("rows %d good + 1 not UTF-8: relay exited (%v); lost %d, dead letter %q\n%s", len(good), p.err, lost, reason, tail(p.out.String(), 30))
	default:
	}
	view := e.operatorView(p)
	code, _ := get(t, "http://"+p.httpAddr()+"/metrics")
	t.Logf("rows %d good + 1 not UTF-8: lost %d, duplicates %d, relay running, %s, /metrics %d; dead letter: %q", len(good), lost, dup, view, code, reason)
	if lost != 0 || dup != 0 || seen[bad] != 0 || len(got) != len(good) {
		t.Errorf("the broker holds %d messages for %d good rows: %d lost, %d repeated, bad row delivered %d times", len(got), len(good), lost, dup, seen[bad])
	}
	if !strings.Contains(view, "/readyz 200") || code != 200 {
		t.Errorf("after the dead letter: %s, /metrics %d; want the relay ready and its metrics served", view, code)
	}
	return reason
}

// TestInvalidUTF8DestinationNATS: in a SQL_ASCII database, a row whose
// aggregate_type is not UTF-8 renders a NATS subject that is not UTF-8. It
// is dead-lettered with the reason, and the relay goes on. Before, the
// stream stored it, then the messages_published_total label made
// client_golang panic, and every restart published it again and panicked.
func TestInvalidUTF8DestinationNATS(t *testing.T) {
	pgservertest.RequireTCP(t, "127.0.0.1:4222", "nats-server with JetStream (nats-server -js)")
	e := newSQLASCIIEnv(t)
	id := extraID()
	stream, prefix := "ASCII_"+strings.ToUpper(id), "ascii"+id
	nc, err := natsgo.Connect("nats://127.0.0.1:4222")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	p := e.startSinkRelay("nats", fmt.Sprintf(`  nats:
    url: nats://127.0.0.1:4222
    subject: "%s.{aggregate_type}"
    stream: %s
    create_stream: true
relay:
  max_attempts: 2`, prefix, stream))

	good := e.insert("public.outbox", "order", "1", 5)
	bad := e.insertInvalidUTF8()
	good = append(good, e.insert("public.outbox", "order", "2", 5)...)
	waitNATS(t, js, stream, uint64(len(good)))
	e.deadLetterError(bad, 30*time.Second)
	good = append(good, e.insert("public.outbox", "order", "3", 5)...)
	waitNATS(t, js, stream, uint64(len(good)))

	c, err := js.OrderedConsumer(t.Context(), stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.FetchNoWait(len(good) + 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for m := range batch.Messages() {
		got = append(got, m.Headers().Get("message_id"))
	}
	checkContainedUTF8(t, e, p, bad, good, got)
	p.stop()
}

// TestInvalidUTF8DestinationRedis is TestInvalidUTF8DestinationNATS with a
// Redis stream key template.
func TestInvalidUTF8DestinationRedis(t *testing.T) {
	pgservertest.RequireTCP(t, "127.0.0.1:6379", "Redis")
	e := newSQLASCIIEnv(t)
	prefix := "outboxrelay-ascii:" + extraID() + ":"
	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	key := prefix + "order"
	t.Cleanup(func() { rdb.Del(context.Background(), key, prefix+"ord\xe9r") })
	p := e.startSinkRelay("redis", fmt.Sprintf(`  redis:
    url: redis://127.0.0.1:6379/0
    stream: "%s{aggregate_type}"
relay:
  max_attempts: 2`, prefix))

	waitLen := func(n int) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			got, err := rdb.XLen(t.Context(), key).Result()
			if err == nil && got >= int64(n) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("stream %s holds %d entries (%v), want %d\n%s", key, got, err, n, tail(p.out.String(), 30))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	good := e.insert("public.outbox", "order", "1", 5)
	bad := e.insertInvalidUTF8()
	good = append(good, e.insert("public.outbox", "order", "2", 5)...)
	waitLen(len(good))
	e.deadLetterError(bad, 30*time.Second)
	good = append(good, e.insert("public.outbox", "order", "3", 5)...)
	waitLen(len(good))

	entries, err := rdb.XRange(t.Context(), key, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, x := range entries {
		got = append(got, fmt.Sprint(x.Values["message_id"]))
	}
	if n, _ := rdb.Exists(t.Context(), prefix+"ord\xe9r").Result(); n != 0 {
		t.Errorf("the relay wrote the stream %q", prefix+"ord\xe9r")
	}
	checkContainedUTF8(t, e, p, bad, good, got)
	p.stop()
}

// TestInvalidUTF8KeyKafka: in a SQL_ASCII database, a row whose
// aggregate_id is not UTF-8 is dead-lettered rather than produced with the
// raw bytes as its record key while its envelope shows U+FFFD: a record's
// key and envelope always agree.
func TestInvalidUTF8KeyKafka(t *testing.T) {
	e := newSQLASCIIEnv(t)
	c := e.consume("outbox.order")
	p := e.start("OUTBOXRELAY_RELAY_MAX_ATTEMPTS=2")
	p.waitLog(`"streaming"`, 30*time.Second)
	good := e.insert("public.outbox", "order", "1", 5)
	var bad string
	if err := e.db.QueryRow(t.Context(), `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', E'caf\xe9', 'order.created', '{}') RETURNING id::text`).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	good = append(good, e.insert("public.outbox", "order", "2", 5)...)
	c.waitIDs(good, 60*time.Second)
	e.deadLetterError(bad, 30*time.Second)
	var got []string
	for _, r := range c.records() {
		got = append(got, r.Headers["message_id"])
	}
	checkContainedUTF8(t, e, p, bad, good, got)
	p.stop()
}

// insertInvalidBody commits, in a SQL_ASCII database, a row of aggregate
// aggID whose payload holds the bytes FF FE inside a JSON string, and one
// of aggID+"h" whose row header tenant is the byte FF, and returns their
// ids: a jsonb column there stores them as they came.
func (e *env) insertInvalidBody(aggID string) (payload, header string) {
	e.t.Helper()
	if err := e.db.QueryRow(e.t.Context(), `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', $1, 'order.created', E'{"note":"\xff\xfe"}') RETURNING id::text`, aggID).Scan(&payload); err != nil {
		e.t.Fatal(err)
	}
	if err := e.db.QueryRow(e.t.Context(), `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ('order', $1, 'order.created', '{}', E'{"tenant":"\xff"}') RETURNING id::text`, aggID+"h").Scan(&header); err != nil {
		e.t.Fatal(err)
	}
	return payload, header
}

// brokerMessage is one message as a broker holds it: its id, its aggregate,
// its body and its header values.
type brokerMessage struct {
	id, aggregate string
	body          []byte
	headers       []string
}

// checkContainedBody is the end of the invalid body scenario on any sink:
// the rows whose payload or row header is not UTF-8 are dead-lettered with
// the reason and never delivered; every good row arrived once, in order
// per aggregate; every body and header delivered is UTF-8; the relay runs.
func checkContainedBody(t *testing.T, e *env, p *proc, badPayload, badHeader string, good map[string][]string, got []brokerMessage) {
	t.Helper()
	var goodIDs, gotIDs []string
	for _, ids := range good {
		goodIDs = append(goodIDs, ids...)
	}
	perAggregate := map[string][]string{}
	invalid := 0
	for _, d := range got {
		gotIDs = append(gotIDs, d.id)
		perAggregate[d.aggregate] = append(perAggregate[d.aggregate], d.id)
		ok := utf8.Valid(d.body)
		for _, h := range d.headers {
			ok = ok && utf8.ValidString(h) && !strings.ContainsRune(h, utf8.RuneError)
		}
		if !ok {
			invalid++
			t.Errorf("message %s was delivered with a body or header that is not UTF-8 or holds U+FFFD: body %q, headers %q", d.id, d.body, d.headers)
		}
	}
	outOfOrder := 0
	for agg, ids := range good {
		if !slices.Equal(perAggregate[agg], ids) {
			outOfOrder++
			t.Errorf("aggregate %s arrived as %v, want %v", agg, perAggregate[agg], ids)
		}
	}
	payloadReason := e.deadLetterError(badPayload, 30*time.Second)
	headerReason := e.deadLetterError(badHeader, 30*time.Second)
	t.Logf("invalid bodies delivered %d, aggregates out of order %d; payload row's dead letter %q; header row's dead letter %q",
		invalid, outOfOrder, payloadReason, headerReason)
	if !strings.Contains(payloadReason, "column payload is not valid UTF-8 (byte 0xFF at offset 10)") {
		t.Errorf("dead letter of the row whose payload is not UTF-8: %q, want the reason naming the column and the byte", payloadReason)
	}
	if !strings.Contains(headerReason, "column headers is not valid UTF-8 (byte 0xFF at offset 12)") {
		t.Errorf("dead letter of the row whose header is not UTF-8: %q, want the reason naming the column and the byte", headerReason)
	}
	for _, bad := range []string{badPayload, badHeader} {
		checkContained(t, e, p, bad, goodIDs, gotIDs)
	}
}

// TestInvalidUTF8BodyKafka: in a SQL_ASCII database, a row whose payload
// holds FF FE, and one whose row header is FF, are dead-lettered with the
// reason, and the rows around them arrive once and in order. Before, the
// first was produced with the raw bytes in its envelope (not UTF-8), and
// the second with U+FFFD in its Kafka header while its envelope kept FF.
func TestInvalidUTF8BodyKafka(t *testing.T) {
	e := newSQLASCIIEnv(t)
	c := e.consume("outbox.order")
	p := e.start("OUTBOXRELAY_RELAY_MAX_ATTEMPTS=2")
	p.waitLog(`"streaming"`, 30*time.Second)
	good, all := insertAround(e, func() (string, string) { return e.insertInvalidBody("bad") })
	c.waitIDs(all, 60*time.Second)
	var got []brokerMessage
	for _, r := range c.records() {
		d := brokerMessage{id: r.Headers["message_id"], aggregate: r.Key, body: r.Value}
		for _, v := range r.Headers {
			d.headers = append(d.headers, v)
		}
		got = append(got, d)
	}
	checkContainedBody(t, e, p, good.badPayload, good.badHeader, good.ids, got)
	p.stop()
}

// TestInvalidUTF8BodyNATS is TestInvalidUTF8BodyKafka on NATS JetStream.
func TestInvalidUTF8BodyNATS(t *testing.T) {
	pgservertest.RequireTCP(t, "127.0.0.1:4222", "nats-server with JetStream (nats-server -js)")
	e := newSQLASCIIEnv(t)
	id := extraID()
	stream, prefix := "ASCIIBODY_"+strings.ToUpper(id), "asciibody"+id
	nc, err := natsgo.Connect("nats://127.0.0.1:4222")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	p := e.startSinkRelay("nats", fmt.Sprintf(`  nats:
    url: nats://127.0.0.1:4222
    subject: "%s.{aggregate_type}"
    stream: %s
    create_stream: true
relay:
  max_attempts: 2`, prefix, stream))
	good, all := insertAround(e, func() (string, string) { return e.insertInvalidBody("bad") })
	waitNATS(t, js, stream, uint64(len(all)))
	c, err := js.OrderedConsumer(t.Context(), stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.FetchNoWait(len(all) + 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []brokerMessage
	for m := range batch.Messages() {
		d := brokerMessage{id: m.Headers().Get("message_id"), aggregate: m.Headers().Get("aggregate_id"), body: m.Data()}
		for _, vs := range m.Headers() {
			d.headers = append(d.headers, vs...)
		}
		got = append(got, d)
	}
	checkContainedBody(t, e, p, good.badPayload, good.badHeader, good.ids, got)
	p.stop()
}

// aroundRows are the rows insertAround committed: the good ones by
// aggregate, in commit order, and the two bad ones.
type aroundRows struct {
	ids                   map[string][]string
	badPayload, badHeader string
}

// insertAround commits good rows of aggregates 1, 2 and 3, then the bad
// rows bad commits, then more good rows, and returns them with every good
// id in one list.
func insertAround(e *env, bad func() (string, string)) (aroundRows, []string) {
	r := aroundRows{ids: map[string][]string{}}
	add := func() {
		for _, agg := range []string{"1", "2", "3"} {
			r.ids[agg] = append(r.ids[agg], e.insert("public.outbox", "order", agg, 5)...)
		}
	}
	add()
	r.badPayload, r.badHeader = bad()
	add()
	var all []string
	for _, ids := range r.ids {
		all = append(all, ids...)
	}
	return r, all
}
