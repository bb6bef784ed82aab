package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

// sinkLedger records what one sink's broker (or receiver) holds: the first
// arrival of each message and every arrival in order.
type sinkLedger struct {
	mu    sync.Mutex
	first map[string]time.Time
	got   []delivered
	dups  int
}

func newSinkLedger() *sinkLedger { return &sinkLedger{first: map[string]time.Time{}} }

// record notes the arrival of a body (the relay's JSON envelope) now.
func (l *sinkLedger) record(t *testing.T, body []byte) {
	var env struct {
		MessageID   string `json:"message_id"`
		AggregateID string `json:"aggregate_id"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		t.Errorf("not an envelope: %v: %.100s", err, body)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.first[env.MessageID]; ok {
		l.dups++
	} else {
		l.first[env.MessageID] = time.Now()
	}
	l.got = append(l.got, delivered{id: env.MessageID, key: env.AggregateID, env: map[string]any{"message_id": env.MessageID}})
}

func (l *sinkLedger) at(id string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.first[id]
	return at, ok
}

func (l *sinkLedger) distinct() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.first)
}

// outageSink is a sink of the outage test: its section in the sinks
// mapping, the ledger of what its broker holds, and a switch that makes it
// hang (accept and answer nothing) or come back.
type outageSink struct {
	kind    string
	section string
	ledger  *sinkLedger
	hang    func(bool)
	// slow, where set, makes every answer wait d.
	slow func(d time.Duration)
	// lag is how long after the broker holds a message its consumer may
	// first see it: the slot check counts a message seen that much later
	// as held when the slot was read.
	lag time.Duration
}

// outage is a switch between up and down. Safe for concurrent use.
type outage struct {
	mu sync.Mutex
	up chan struct{} // closed when the outage ends; nil while up
}

func newOutage() *outage { return &outage{} }

// set starts (true) or ends (false) the outage.
func (o *outage) set(down bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case down && o.up == nil:
		o.up = make(chan struct{})
	case !down && o.up != nil:
		close(o.up)
		o.up = nil
	}
}

// over returns nil while up, else a channel closed when the outage ends.
func (o *outage) over() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.up == nil {
		return nil
	}
	return o.up
}

// webhookOutageSink is a receiver whose requests hang while it is down,
// until the sink's timeout gives up on them.
func webhookOutageSink(t *testing.T) outageSink {
	l := newSinkLedger()
	down := newOutage()
	var delay atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		time.Sleep(time.Duration(delay.Load()))
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		if wait := down.over(); wait != nil {
			select {
			case <-wait:
			case <-req.Context().Done():
			}
			http.Error(w, "was down", http.StatusServiceUnavailable)
			return
		}
		l.record(t, body)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return outageSink{
		kind: "webhook", ledger: l, slow: func(d time.Duration) { delay.Store(int64(d)) },
		section: fmt.Sprintf(`
    type: webhook
    webhook:
      url: "%s/hooks/{aggregate_type}"
      secret: %s
      timeout: 2s`, srv.URL, e2eWebhookSecret),
		hang: down.set,
	}
}

// rabbitOutageSink reaches RabbitMQ through a proxy that, while down,
// drops the relay's connections and holds new ones without an answer.
func rabbitOutageSink(t *testing.T) outageSink {
	pgservertest.RequireTCP(t, "127.0.0.1:5672", "RabbitMQ")
	l := newSinkLedger()
	name := fmt.Sprintf("outage-%d", time.Now().UnixNano())
	conn, err := amqp.Dial(rabbitURL)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(name, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(name, "#", name, false, nil); err != nil {
		t.Fatal(err)
	}
	msgs, err := ch.Consume(name, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for d := range msgs {
			l.record(t, d.Body)
		}
	}()
	proxy, err := startTCPProxy("127.0.0.1:5672")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		proxy.close()
		_, _ = ch.QueueDelete(name, false, false, false)
		_ = ch.ExchangeDelete(name, false, false)
		conn.Close()
	})
	return outageSink{
		kind: "rabbitmq", ledger: l, hang: proxy.setHang,
		section: fmt.Sprintf(`
    type: rabbitmq
    rabbitmq:
      url: amqp://guest:guest@%s/
      exchange: %s`, proxy.addr(), name),
	}
}

// kafkaOutageSink is a kfake cluster of its own whose produce requests
// hang while it is down (its consumer's fetches go on).
func kafkaOutageSink(t *testing.T) outageSink {
	l := newSinkLedger()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "so.order", "so.invoice"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	down := newOutage()
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if wait := down.over(); wait != nil {
			c.SleepControl(func() { <-wait })
		}
		return nil, nil, false
	})
	addr := c.ListenAddrs()[0]
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("so.order", "so.invoice"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { l.record(t, r.Value) })
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		cl.Close()
	})
	return outageSink{
		kind: "kafka", ledger: l, lag: time.Second,
		section: fmt.Sprintf(`
    type: kafka
    kafka:
      brokers: [%s]
      topic: "so.{aggregate_type}"`, addr),
		hang: down.set,
	}
}

// TestSinkOutageOthersFlow: one slot feeds two sinks, "down" and
// "healthy"; orders go to both, invoices to the healthy one only. Under a
// steady load, the down sink hangs for 20 s, far longer than its share of
// the in-flight bound (relay.max_inflight 400) can hold. Checked against
// the ledger of committed rows: the healthy sink receives every row
// committed during the outage before the outage ends; neither sink loses a
// row and each keeps every aggregate's order; the healthy sink gets no
// duplicate; the slot, sampled every 200 ms together with
// outboxrelay.spilled, is never confirmed past an order that the down sink
// neither received nor holds in the spill store; /status, /readyz, the
// metrics and the log name the down sink as behind; and once it is back it
// gets everything and the spill store is empty. Run with RabbitMQ, the
// webhook and Kafka as the sink that goes down.
func TestSinkOutageOthersFlow(t *testing.T) {
	cases := []struct {
		name          string
		down, healthy func(*testing.T) outageSink
	}{
		{"rabbitmq-down", rabbitOutageSink, webhookOutageSink},
		{"webhook-down", webhookOutageSink, kafkaOutageSink},
		{"kafka-down", kafkaOutageSink, webhookOutageSink},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testSinkOutage(t, strings.ReplaceAll(c.name, "-", "_"), c.down(t), c.healthy(t))
		})
	}
}

func testSinkOutage(t *testing.T, slot string, down, healthy outageSink) {
	e := newEnvWith(t, serverFor(t), "", "--slot", slot) // slots are the server's: one per parallel test
	ctx := t.Context()
	p := e.startConfig(fmt.Sprintf(`postgres:
  url: %s
  slot: %s
  status_interval: 200ms
relay:
  max_inflight: 400
sinks:
  healthy:%s
  down:%s
routes:
  - name: orders-down
    when: 'aggregate_type == "order"'
    sink: down
    continue: true
  - name: all-healthy
    sink: healthy
http:
  listen: 127.0.0.1:0
log:
  level: info
`, e.dbURL, slot, healthy.section, down.section))
	p.waitLog(`"streaming"`, 30*time.Second)

	// The slot's confirmed position and the ids in the spill store, read
	// in one snapshot every 200 ms.
	type sample struct {
		at        time.Time
		confirmed pglogrepl.LSN
		spilled   map[string]bool
	}
	var smu sync.Mutex
	var samples []sample
	sampleCtx, stopSample := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		conn, err := pgx.Connect(sampleCtx, e.dbURL)
		if err != nil {
			t.Errorf("sampler: %v", err)
			return
		}
		defer conn.Close(context.WithoutCancel(ctx))
		for sampleCtx.Err() == nil {
			var lsn string
			var ids []string
			err := conn.QueryRow(sampleCtx, `SELECT coalesce((SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1), '0/0')::text,
				coalesce((SELECT array_agg(message_id) FROM outboxrelay.spilled), '{}')`, slot).Scan(&lsn, &ids)
			at := time.Now()
			if err == nil {
				s := sample{at: at, spilled: map[string]bool{}}
				s.confirmed, _ = pglogrepl.ParseLSN(lsn)
				for _, id := range ids {
					s.spilled[id] = true
				}
				smu.Lock()
				samples = append(samples, s)
				smu.Unlock()
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()

	// The producer: an order and an invoice in one transaction every 20 ms
	// for 28 s; the down sink hangs from 3 s to 23 s.
	orders, all := map[string][]string{}, map[string][]string{}
	lsnOf := map[string]pglogrepl.LSN{}
	committedAt := map[string]time.Time{}
	var outageStart, outageEnd time.Time
	var statusDuring, readyDuring, metricsDuring string
	var readyCode int
	start := time.Now()
	for i := 0; time.Since(start) < 28*time.Second; i++ {
		if outageStart.IsZero() && time.Since(start) >= 3*time.Second {
			down.hang(true)
			outageStart = time.Now()
		}
		if !outageStart.IsZero() && outageEnd.IsZero() && time.Since(outageStart) >= 20*time.Second {
			down.hang(false)
			outageEnd = time.Now()
		}
		if statusDuring == "" && !outageStart.IsZero() && time.Since(outageStart) >= 15*time.Second {
			_, statusDuring = get(t, "http://"+p.httpAddr()+"/status")
			readyCode, readyDuring = get(t, "http://"+p.httpAddr()+"/readyz")
			_, metricsDuring = get(t, "http://"+p.httpAddr()+"/metrics")
		}
		oAgg, iAgg := fmt.Sprint("o", i%7), fmt.Sprint("i", i%5)
		var oid, iid, olsn string
		err := pgx.BeginFunc(ctx, e.db, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'order.created', $2::jsonb) RETURNING id::text`,
				oAgg, fmt.Sprintf(`{"n":%d}`, i)).Scan(&oid); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('invoice', $1, 'invoice.issued', $2::jsonb) RETURNING id::text`,
				iAgg, fmt.Sprintf(`{"n":%d}`, i)).Scan(&iid)
		})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		// The slot delivers a transaction again unless it is confirmed to
		// its commit's end, which is at most the position read just after
		// the commit: a confirmed position above that has passed the row.
		if err := e.db.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&olsn); err != nil {
			t.Fatal(err)
		}
		lsnOf[oid], _ = pglogrepl.ParseLSN(olsn)
		committedAt[oid], committedAt[iid] = now, now
		orders[oAgg] = append(orders[oAgg], oid)
		all[oAgg] = append(all[oAgg], oid)
		all[iAgg] = append(all[iAgg], iid)
		time.Sleep(20 * time.Millisecond)
	}
	total, orderCount := 0, 0
	for _, ids := range all {
		total += len(ids)
	}
	for _, ids := range orders {
		orderCount += len(ids)
	}

	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) && (healthy.ledger.distinct() < total || down.ledger.distinct() < orderCount) {
		time.Sleep(200 * time.Millisecond)
	}
	var leftSpilled int64
	for time.Now().Before(deadline) {
		if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled`).Scan(&leftSpilled); err != nil {
			t.Fatal(err)
		}
		if leftSpilled == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	stopSample()
	<-sampled
	_, statusAfter := get(t, "http://"+p.httpAddr()+"/status")
	p.stop()
	logText := p.out.String()

	// The healthy sink: every row committed during the outage (but its last
	// 2 s) arrived before the outage ended; none lost, no duplicate, order.
	duringOutage, late, healthyLost := 0, 0, 0
	for _, ids := range all {
		for _, id := range ids {
			at, ok := healthy.ledger.at(id)
			if !ok {
				healthyLost++
				continue
			}
			c := committedAt[id]
			if c.After(outageStart) && c.Before(outageEnd.Add(-2*time.Second)) {
				duringOutage++
				if !at.Before(outageEnd) {
					late++
				}
			}
		}
	}
	checkCommitOrder(t, all, healthy.ledger.got)
	downLost := 0
	for id := range lsnOf {
		if _, ok := down.ledger.at(id); !ok {
			downLost++
		}
	}
	checkCommitOrder(t, orders, down.ledger.got)

	// The slot never passed an order the down sink lacked and the spill
	// store did not hold.
	smu.Lock()
	violations, outageSamples, maxSpilled := 0, 0, 0
	for _, s := range samples {
		if s.at.After(outageStart) && s.at.Before(outageEnd) {
			outageSamples++
		}
		maxSpilled = max(maxSpilled, len(s.spilled))
		for id, l := range lsnOf {
			if s.confirmed <= l || s.spilled[id] {
				continue
			}
			if at, ok := down.ledger.at(id); ok && !at.After(s.at.Add(down.lag)) {
				continue
			}
			violations++
			if violations <= 3 {
				t.Errorf("at %s the slot was confirmed to %s, past order %s at %s, which the %s sink had not received and the spill store did not hold",
					s.at.Sub(start).Round(time.Millisecond), s.confirmed, id, l, down.kind)
			}
		}
	}
	smu.Unlock()

	var st struct {
		Sinks []struct {
			Name    string `json:"name"`
			Behind  bool   `json:"behind"`
			Spilled int64  `json:"spilled"`
		} `json:"sinks"`
	}
	behindDuring, spilledDuring := false, int64(0)
	if err := json.Unmarshal([]byte(statusDuring), &st); err != nil {
		t.Fatalf("status during the outage: %v: %s", err, statusDuring)
	}
	for _, s := range st.Sinks {
		if s.Name == "down" {
			behindDuring, spilledDuring = s.Behind, s.Spilled
		}
		if s.Name == "healthy" && s.Behind {
			t.Errorf("status during the outage says the healthy sink is behind: %s", statusDuring)
		}
	}
	behindMetric := metricValues(metricsDuring, "outboxrelay_sink_behind")

	t.Logf("%s down, %s healthy: rows %d (%d orders to both); healthy: lost %d, duplicates %d, %d committed during the %s outage of which %d arrived after it; "+
		"down: lost %d, duplicates %d; slot samples %d (%d during the outage), violations %d; spill store up to %d, %d left; "+
		"status during: behind %v, spilled %d; readyz %d %q",
		down.kind, healthy.kind, total, orderCount, healthyLost, healthy.ledger.dups, duringOutage, outageEnd.Sub(outageStart).Round(time.Millisecond), late,
		downLost, down.ledger.dups, len(samples), outageSamples, violations, maxSpilled, leftSpilled, behindDuring, spilledDuring, readyCode, strings.TrimSpace(readyDuring))
	if healthyLost != 0 || downLost != 0 {
		t.Errorf("lost: healthy %d, down %d; want 0", healthyLost, downLost)
	}
	if late != 0 {
		t.Errorf("%d of the %d rows committed during the outage reached the healthy sink only after it: a sink that is down must not delay the others", late, duringOutage)
	}
	if healthy.ledger.dups != 0 {
		t.Errorf("the healthy sink got %d duplicates, want 0", healthy.ledger.dups)
	}
	if leftSpilled != 0 {
		t.Errorf("outboxrelay.spilled still holds %d messages after the down sink caught up", leftSpilled)
	}
	if !behindDuring || spilledDuring == 0 {
		t.Errorf("status during the outage: %s; want the down sink behind with spilled messages", statusDuring)
	}
	if readyCode == http.StatusOK || !strings.Contains(readyDuring, "sink down is behind") && !strings.Contains(readyDuring, "down sink is not connected") {
		t.Errorf("/readyz during the outage: %d %q; want it to name the down sink as behind", readyCode, readyDuring)
	}
	if behindMetric[`{sink="down",slot="`+slot+`"}`] != 1 || behindMetric[`{sink="healthy",slot="`+slot+`"}`] != 0 || len(behindMetric) != 2 {
		t.Errorf("outboxrelay_sink_behind during the outage: %v; want down 1, healthy 0", behindMetric)
	}
	if !strings.Contains(logText, `"sink":"down"`) || !strings.Contains(logText, "sink is behind") || !strings.Contains(logText, "sink caught up") {
		t.Errorf("the log does not say that sink down fell behind and caught up:\n%s", tail(logText, 3000))
	}
	if strings.Contains(statusAfter, `"behind":true`) {
		t.Errorf("status after the catch-up still says a sink is behind: %s", statusAfter)
	}
	// The minimums the test must have exercised.
	if duringOutage < 500 {
		t.Errorf("%d rows committed during the outage, want at least 500", duringOutage)
	}
	if maxSpilled < 200 {
		t.Errorf("the spill store held at most %d messages, want at least 200: the outage must outlast the sink's share of the in-flight bound", maxSpilled)
	}
	if outageSamples < 50 {
		t.Errorf("%d samples of the slot during the outage, want at least 50", outageSamples)
	}
}

// TestSpillSurvivesRestart: messages stored for a sink that is behind
// outlive the relay. A webhook hangs while orders are committed, so they
// are stored in outboxrelay.spilled; the relay is stopped with messages
// stored. A start whose configuration lost that sink fails with one error
// naming it and both fixes, and leaves the stored messages alone. A start
// with the sink back publishes every order to it, in per-aggregate order,
// and empties the store.
func TestSpillSurvivesRestart(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, serverFor(t), "", "--slot", "spill_restart")
	ctx := t.Context()
	down, healthy := webhookOutageSink(t), kafkaOutageSink(t)
	const routes = `
routes:
  - name: orders-down
    when: 'aggregate_type == "order"'
    sink: down
    continue: true
  - name: all-healthy
    sink: healthy`
	cfg := func(sinks, routes string) string {
		return fmt.Sprintf(`postgres:
  url: %s
  slot: spill_restart
  status_interval: 200ms
relay:
  max_inflight: 90
  drain_timeout: 3s
sinks:%s%s
http:
  listen: 127.0.0.1:0
`, e.dbURL, sinks, routes)
	}
	both := "\n  healthy:" + healthy.section + "\n  down:" + down.section
	down.hang(true)
	p := e.startConfig(cfg(both, routes))
	p.waitLog(`"streaming"`, 30*time.Second)
	orders := map[string][]string{}
	var ids []string
	for i := 0; i < 300; i++ {
		agg := fmt.Sprint("o", i%6)
		var id string
		if err := e.db.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'order.created', '{}') RETURNING id::text`, agg).Scan(&id); err != nil {
			t.Fatal(err)
		}
		orders[agg] = append(orders[agg], id)
		ids = append(ids, id)
	}
	var stored int64
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled WHERE sink = 'down'`).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if healthy.ledger.distinct() == len(ids) && stored >= 200 {
			break
		}
	}
	// The sink answers again, slowly: the messages it held are taken, the
	// slot passes every order, and the stored ones are being published when
	// the relay stops.
	down.slow(300 * time.Millisecond)
	down.hang(false)
	var lastLSN string
	if err := e.db.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lastLSN); err != nil {
		t.Fatal(err)
	}
	for past, deadline := false, time.Now().Add(60*time.Second); !past; time.Sleep(100 * time.Millisecond) {
		if err := e.db.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'spill_restart'`, lastLSN).Scan(&past); err != nil {
			t.Fatal(err)
		}
		if !past && time.Now().After(deadline) {
			t.Fatalf("the slot did not pass %s once the sink answered again", lastLSN)
		}
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.done
	if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled WHERE sink = 'down'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	down.hang(true)

	// The sink is gone from the configuration, and so is its route; a
	// second sink stays, so that the relay still has several.
	other := webhookOutageSink(t)
	out, code := e.cliConfig(cfg("\n  healthy:"+healthy.section+"\n  other:"+other.section, ""))
	var after int64
	if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled WHERE sink = 'down'`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if code != 2 || !strings.Contains(out, `outboxrelay.spilled holds`) || !strings.Contains(out, `sink "down"`) ||
		!strings.Contains(out, "start with that sink in sinks") || !strings.Contains(out, "DELETE FROM outboxrelay.spilled WHERE slot = 'spill_restart' AND sink = 'down'") || after != stored {
		t.Errorf("a start without the sink that messages are stored for: exit %d, %d stored before and %d after:\n%s\nwant exit 2 naming the sink and both fixes, the messages kept",
			code, stored, after, tail(out, 1500))
	}

	down.slow(0)
	down.hang(false)
	p = e.startConfig(cfg(both, routes))
	p.waitLog("sink has messages stored from an earlier run", 30*time.Second)
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline) && down.ledger.distinct() < len(ids); {
		time.Sleep(100 * time.Millisecond)
	}
	var left int64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
	}
	p.stop()
	lost := 0
	for _, id := range ids {
		if _, ok := down.ledger.at(id); !ok {
			lost++
		}
	}
	checkCommitOrder(t, orders, down.ledger.got)
	t.Logf("%d orders; %d stored when the relay stopped; after the restart: lost %d, duplicates %d, %d left in the store", len(ids), stored, lost, down.ledger.dups, left)
	if lost != 0 || left != 0 {
		t.Errorf("after the restart: %d orders lost, %d left in outboxrelay.spilled; want 0 and 0", lost, left)
	}
	if stored < 50 {
		t.Errorf("%d messages stored when the relay stopped, want at least 50: the restart must start with stored messages", stored)
	}
}
