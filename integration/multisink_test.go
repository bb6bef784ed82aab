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
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// outageReceiver is a webhook receiver that answers 503 while down and
// records the first 2xx arrival of each message, with its time.
type outageReceiver struct {
	srv  *httptest.Server
	down atomic.Bool

	mu       sync.Mutex
	refused  int
	got      []delivered
	firstAt  map[string]time.Time
	dups     int
	badSigns []string
}

func newOutageReceiver(t *testing.T) *outageReceiver {
	r := &outageReceiver{firstAt: map[string]time.Time{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *outageReceiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.WriteHeader(http.StatusNoContent) // the sink's probe at start
		return
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return
	}
	if r.down.Load() {
		r.mu.Lock()
		r.refused++
		r.mu.Unlock()
		http.Error(w, "partner is down", http.StatusServiceUnavailable)
		return
	}
	var env map[string]any
	if err := json.Unmarshal(body, &env); err != nil {
		http.Error(w, "not JSON", http.StatusBadRequest)
		return
	}
	id, _ := env["message_id"].(string)
	agg, _ := env["aggregate_id"].(string)
	r.mu.Lock()
	if err := verifyStandardWebhook(req.Header, body); err != nil {
		r.badSigns = append(r.badSigns, err.Error())
	}
	if _, ok := r.firstAt[id]; ok {
		r.dups++
	} else {
		// Recorded before the 2xx: the relay can confirm past the message
		// only after this time.
		r.firstAt[id] = time.Now()
	}
	r.got = append(r.got, delivered{id: id, key: agg, env: env})
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// receivedAt returns when id first arrived, and whether it has.
func (r *outageReceiver) receivedAt(id string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.firstAt[id]
	return at, ok
}

func (r *outageReceiver) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.firstAt)
}

// slotSample is the slot's confirmed_flush_lsn, read at (just before) at.
type slotSample struct {
	at        time.Time
	confirmed pglogrepl.LSN
}

// TestSeveralSinksOneSlot: one slot feeds Kafka (kfake) and a webhook
// receiver through two routes (orders to both, payments to Kafka only),
// through the relay binary, while the receiver answers 503 for 20 s.
// Checked against the ledger of committed rows: Kafka keeps receiving rows
// during the outage; after it the webhook gets every order in
// per-aggregate order; 0 lost on either sink, duplicates counted; and the
// slot's confirmed_flush_lsn, sampled throughout, never passes the LSN of
// the oldest order the webhook had not received yet. /status shows the
// webhook's own watermark behind Kafka's during the outage.
func TestSeveralSinksOneSlot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	recv := newOutageReceiver(t)
	cfgText := fmt.Sprintf(`postgres:
  url: %s
  status_interval: 200ms
  heartbeat_interval: 0s
sinks:
  analytics:
    type: kafka
    kafka:
      brokers: [%s]
      topic: "ms.{aggregate_type}"
  partner:
    type: webhook
    webhook:
      url: "%s/hooks/{aggregate_type}"
      secret: %s
      timeout: 2s
routes:
  - name: to-partner
    when: 'aggregate_type == "order"'
    sink: partner
    continue: true
  - name: everything
    sink: analytics
http:
  listen: 127.0.0.1:0
log:
  level: info
`, e.dbURL, e.brokers, recv.srv.URL, e2eWebhookSecret)
	bad := e.writeConfig(strings.Replace(cfgText, "sink: partner", "sink: partnr", 1))
	if out, code := e.cli("run", "--config", bad, "--check-config"); code != 2 || !strings.Contains(out, `routes[0] (to-partner).sink "partnr" is not a sink; sinks are analytics, partner`) {
		t.Fatalf("a route naming an unknown sink: exit %d: %s; want exit 2 naming the route and the sink", code, out)
	}
	p := e.startConfig(cfgText)
	p.waitLog(`"streaming"`, 30*time.Second)

	// Kafka's side of the ledger, with arrival times.
	type arrival struct {
		id, agg string
		lsn     pglogrepl.LSN
		at      time.Time
	}
	var kmu sync.Mutex
	var kafkaGot []arrival
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers), kgo.ConsumeTopics("ms.order", "ms.payment"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	consumeCtx, stopConsume := context.WithCancel(ctx)
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for consumeCtx.Err() == nil {
			fs := cl.PollFetches(consumeCtx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				var env struct {
					MessageID   string `json:"message_id"`
					AggregateID string `json:"aggregate_id"`
					Source      struct {
						LSN string `json:"lsn"`
					} `json:"source"`
				}
				if err := json.Unmarshal(r.Value, &env); err != nil {
					t.Errorf("kafka record: %v", err)
					return
				}
				lsn, _ := pglogrepl.ParseLSN(env.Source.LSN)
				kmu.Lock()
				kafkaGot = append(kafkaGot, arrival{id: env.MessageID, agg: env.AggregateID, lsn: lsn, at: now})
				kmu.Unlock()
			})
		}
	}()

	// The slot's confirmed position, sampled every 100 ms on a connection
	// of its own.
	var smu sync.Mutex
	var samples []slotSample
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
			err := conn.QueryRow(sampleCtx, `SELECT coalesce(confirmed_flush_lsn, '0/0')::text FROM pg_replication_slots WHERE slot_name = 'outboxrelay'`).Scan(&lsn)
			at := time.Now() // after the read: a message received later was not received when it was read
			if err == nil {
				l, _ := pglogrepl.ParseLSN(lsn)
				smu.Lock()
				samples = append(samples, slotSample{at: at, confirmed: l})
				smu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()

	// The producer: a transaction every 50 ms with an order (to both sinks)
	// and a payment (Kafka only), for 26 s; the receiver is down from 3 s
	// to 23 s.
	orders := map[string][]string{}
	all := map[string][]string{}
	orderIDs := map[string]bool{}
	var outageStart, outageEnd time.Time
	var statusDuring, cliStatusDuring string
	start := time.Now()
	for i := 0; time.Since(start) < 26*time.Second; i++ {
		el := time.Since(start)
		if outageStart.IsZero() && el >= 3*time.Second {
			recv.down.Store(true)
			outageStart = time.Now()
		}
		if !outageStart.IsZero() && outageEnd.IsZero() && time.Since(outageStart) >= 20*time.Second {
			recv.down.Store(false)
			outageEnd = time.Now()
		}
		if statusDuring == "" && !outageStart.IsZero() && time.Since(outageStart) >= 15*time.Second {
			_, statusDuring = get(t, "http://"+p.httpAddr()+"/status")
			cliStatusDuring, _ = e.cli("status", "--database-url", e.dbURL, "--relay", "http://"+p.httpAddr())
		}
		oAgg, pAgg := fmt.Sprint("o", i%5), fmt.Sprint("p", i%3)
		tx, err := e.db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var oid, pid string
		if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'order.created', $2::jsonb) RETURNING id::text`,
			oAgg, fmt.Sprintf(`{"n":%d}`, i)).Scan(&oid); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', $1, 'payment.made', $2::jsonb) RETURNING id::text`,
			pAgg, fmt.Sprintf(`{"n":%d}`, i)).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		orders[oAgg] = append(orders[oAgg], oid)
		orderIDs[oid] = true
		all[oAgg] = append(all[oAgg], oid)
		all[pAgg] = append(all[pAgg], pid)
		time.Sleep(50 * time.Millisecond)
	}
	if outageEnd.IsZero() {
		recv.down.Store(false)
		outageEnd = time.Now()
	}
	total := 0
	for _, ids := range all {
		total += len(ids)
	}

	// Wait for both sinks to hold every one of their rows (the webhook's
	// retries back off up to 30 s after the outage).
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		kmu.Lock()
		kseen := map[string]bool{}
		for _, a := range kafkaGot {
			kseen[a.id] = true
		}
		kmu.Unlock()
		if len(kseen) >= total && recv.distinct() >= len(orderIDs) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // a last sample of the slot after the catch-up
	stopSample()
	<-sampled
	_, metricsText := get(t, "http://"+p.httpAddr()+"/metrics")
	p.stop()
	stopConsume()
	<-consumed

	// Kafka: 0 lost, duplicates counted, per-aggregate order, and rows that
	// arrived while the webhook was down.
	kmu.Lock()
	defer kmu.Unlock()
	lsnOf := map[string]pglogrepl.LSN{}
	var kafkaDelivered []delivered
	kafkaDups, duringOutage := 0, 0
	seen := map[string]bool{}
	for _, a := range kafkaGot {
		if seen[a.id] {
			kafkaDups++
			continue
		}
		seen[a.id] = true
		lsnOf[a.id] = a.lsn
		kafkaDelivered = append(kafkaDelivered, delivered{id: a.id, key: a.agg, env: map[string]any{"message_id": a.id}})
		if a.at.After(outageStart.Add(2*time.Second)) && a.at.Before(outageEnd) {
			duringOutage++
		}
	}
	kafkaLost := 0
	for _, ids := range all {
		for _, id := range ids {
			if !seen[id] {
				kafkaLost++
			}
		}
	}
	checkCommitOrder(t, all, kafkaDelivered)

	// The webhook: every order, 0 lost, per-aggregate order.
	recv.mu.Lock()
	hookGot := append([]delivered(nil), recv.got...)
	hookDups, refused, badSigns := recv.dups, recv.refused, recv.badSigns
	recv.mu.Unlock()
	hookLost := 0
	for id := range orderIDs {
		if _, ok := recv.receivedAt(id); !ok {
			hookLost++
		}
	}
	checkCommitOrder(t, orders, hookGot)

	// The slot never passed the oldest order the webhook lacked.
	smu.Lock()
	defer smu.Unlock()
	violations, outageSamples := 0, 0
	for _, s := range samples {
		if s.at.After(outageStart) && s.at.Before(outageEnd) {
			outageSamples++
		}
		for id := range orderIDs {
			at, ok := recv.receivedAt(id)
			if ok && !at.After(s.at) {
				continue // received before the position was read
			}
			if l, known := lsnOf[id]; known && s.confirmed > l {
				violations++
				if violations <= 3 {
					t.Errorf("at %s the slot was confirmed to %s, past order %s at %s, which the webhook had not received",
						s.at.Sub(start).Round(time.Millisecond), s.confirmed, id, l)
				}
			}
		}
	}

	var status struct {
		Sinks []struct {
			Name         string `json:"name"`
			ConfirmedLSN string `json:"confirmed_lsn"`
		} `json:"sinks"`
	}
	if err := json.Unmarshal([]byte(statusDuring), &status); err != nil {
		t.Fatalf("status during the outage: %v: %s", err, statusDuring)
	}
	watermark := map[string]pglogrepl.LSN{}
	for _, s := range status.Sinks {
		watermark[s.Name], _ = pglogrepl.ParseLSN(s.ConfirmedLSN)
	}
	partnerLag := metricValues(metricsText, "outboxrelay_sink_lag_bytes")

	outage := outageEnd.Sub(outageStart)
	t.Logf("rows %d (%d orders to both sinks, %d payments to Kafka only); kafka lost %d, duplicates %d, %d arrived during the outage; "+
		"webhook lost %d, duplicates %d, %d requests refused during a %s outage; slot samples %d (%d during the outage), violations %d; "+
		"status during the outage: analytics %s, partner %s; sink_lag_bytes %v",
		total, len(orderIDs), total-len(orderIDs), kafkaLost, kafkaDups, duringOutage, hookLost, hookDups, refused, outage.Round(time.Millisecond),
		len(samples), outageSamples, violations, watermark["analytics"], watermark["partner"], partnerLag)
	if kafkaLost != 0 || hookLost != 0 {
		t.Errorf("lost: kafka %d, webhook %d; want 0", kafkaLost, hookLost)
	}
	if len(badSigns) > 0 {
		t.Errorf("%d webhook requests with a bad signature: %s", len(badSigns), badSigns[0])
	}
	// The minimums the test must have exercised.
	if outage < 20*time.Second {
		t.Errorf("the outage lasted %s, want 20 s", outage)
	}
	if len(orderIDs) < 200 || total-len(orderIDs) < 200 {
		t.Errorf("%d orders and %d payments, want at least 200 of each", len(orderIDs), total-len(orderIDs))
	}
	if duringOutage < 100 {
		t.Errorf("%d rows reached Kafka during the webhook's outage, want at least 100: Kafka must keep flowing", duringOutage)
	}
	if refused < 1 {
		t.Errorf("the receiver refused no request: the outage was not exercised")
	}
	if outageSamples < 50 {
		t.Errorf("%d samples of the slot during the outage, want at least 50", outageSamples)
	}
	if a, w := watermark["analytics"], watermark["partner"]; a == 0 || w == 0 || w >= a {
		t.Errorf("status during the outage: analytics watermark %s, partner %s; want the partner's behind", a, w)
	}
	// `outboxrelay status --relay` prints each sink's own line: the
	// partner's lag in bytes and seconds is known, and it is retrying.
	cliSinks := map[string]string{}
	for _, line := range strings.Split(cliStatusDuring, "\n") {
		if name, rest, ok := strings.Cut(line, " "); ok && name == "sink" {
			sink, rest, _ := strings.Cut(rest, " ")
			cliSinks[sink] = strings.TrimSpace(rest)
		}
	}
	t.Logf("status --relay during the outage: analytics %q, partner %q", cliSinks["analytics"], cliSinks["partner"])
	if a, w := cliSinks["analytics"], cliSinks["partner"]; !strings.HasPrefix(a, "confirmed ") || strings.HasPrefix(a, "confirmed -") ||
		!strings.Contains(w, "lag_bytes ") || strings.Contains(w, "lag_bytes -") || strings.Contains(w, "lag_seconds -") || !strings.Contains(w, ", retrying") {
		t.Errorf("status --relay during the outage:\n%s\nwant a line for each sink, the partner's with its lag and retrying", cliStatusDuring)
	}
	if !strings.Contains(metricsText, `outboxrelay_sink_lag_bytes{sink="partner"`) {
		t.Errorf("no outboxrelay_sink_lag_bytes series for the partner sink")
	}
}
