package integration

import (
	"fmt"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// windowSink is a broker that can hold its acknowledgements, as a busy one
// does (a RabbitMQ memory alarm, a Kafka broker behind on its disk).
type windowSink struct {
	env      []string                // for the relay
	hold     func() (release func()) // holds acknowledgements until release
	arrivals func() []arrival
}

// TestFullWindowPublishesEachRowOnce: the broker holds its acknowledgements
// for 3 s while a backlog of transactions of 70 rows streams into a window
// of 100, so the window fills in the middle of a transaction and stays
// full past a second: the relay reads on, drops what it reads, and resumes
// from the slot once the broker has acknowledged what it was handed. Every
// row must arrive once, in order per aggregate. Before, the rows of the
// transaction handed over before the window filled were published again.
func TestFullWindowPublishesEachRowOnce(t *testing.T) {
	const txSize, txs, window = 70, 20, 100
	for _, tc := range []struct {
		name string
		sink func(t *testing.T, e *env) windowSink
	}{
		{"rabbitmq", rabbitWindowSink},
		{"kafka", kafkaWindowSink},
		{"kafka exactly-once", func(t *testing.T, e *env) windowSink {
			s := kafkaWindowSink(t, e)
			s.env = []string{exactlyOnce}
			return s
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.extra = fmt.Sprintf("relay:\n  max_inflight: %d\n", window)
			s := tc.sink(t, e)
			p := e.start(s.env...)
			p.waitLog(`"streaming"`, 30*time.Second)

			release := s.hold()
			held := time.Now()
			var ids, keys []string
			for range txs {
				i, k := e.insertSpread(txSize, 7)
				ids, keys = append(ids, i...), append(keys, k...)
			}
			p.waitLog("dropping the changes received from now on", 30*time.Second)
			time.Sleep(time.Until(held.Add(3 * time.Second)))
			release()
			p.waitLog(`"msg":"resuming from the slot"`, 60*time.Second)

			waitArrivals(t, s.arrivals, ids, 120*time.Second)
			time.Sleep(time.Second) // late repeats
			got := s.arrivals()
			lost, dups, disorder := ledgerCheck(ids, keys, got)
			dropped := regexp.MustCompile(`"changes_dropped":(\d+)`).FindAllStringSubmatch(p.out.String(), -1)
			t.Logf("%s: rows %d in transactions of %d, window %d, acknowledgements held 3s: resumes %d (changes_dropped %v), messages %d, lost %d, duplicates %d, out of order %d",
				tc.name, len(ids), txSize, window, len(dropped), dropped, len(got), lost, dups, disorder)
			if lost != 0 || dups != 0 || disorder != 0 || len(got) != len(ids) {
				t.Errorf("%s: %d messages for %d rows: %d lost, %d duplicates, %d out of order per aggregate; want each row once, in order",
					tc.name, len(got), len(ids), lost, dups, disorder)
			}
			p.stop()
		})
	}
}

// rabbitWindowSink is RabbitMQ behind a proxy that holds the broker's
// publisher confirms.
func rabbitWindowSink(t *testing.T, _ *env) windowSink {
	q, env := rabbitEnv(t, "order.#")
	proxy, err := startTCPProxy("127.0.0.1:5672")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.close)
	for i, kv := range env {
		if kv == "OUTBOXRELAY_SINK_RABBITMQ_URL="+rabbitURL {
			env[i] = "OUTBOXRELAY_SINK_RABBITMQ_URL=amqp://guest:guest@" + proxy.addr() + "/"
		}
	}
	return windowSink{env: env, hold: proxy.hold, arrivals: func() []arrival {
		q.mu.Lock()
		defer q.mu.Unlock()
		out := make([]arrival, len(q.got))
		for i, d := range q.got {
			out[i] = arrival{id: d.MessageId, key: fmt.Sprint(d.Headers["aggregate_id"])}
		}
		return out
	}}
}

// kafkaWindowSink is the test's kfake broker, which holds the answer to a
// produce request, and with it every later answer on that connection.
func kafkaWindowSink(t *testing.T, e *env) windowSink {
	cl := e.kafka
	c := e.consumeCommitted("outbox.order")
	hold := func() func() {
		wake := make(chan struct{})
		cl.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
			cl.DropControl()
			cl.SleepControl(func() { <-wake })
			return nil, nil, false
		})
		return sync.OnceFunc(func() { close(wake) })
	}
	return windowSink{hold: hold, arrivals: func() []arrival {
		recs := c.records()
		out := make([]arrival, len(recs))
		for i, r := range recs {
			out[i] = arrival{id: r.Headers["message_id"], key: r.Key}
		}
		return out
	}}
}

// insertSpread writes n rows in one transaction, spread over aggregates
// aggregates of type order, with 1 KB payloads, and returns their ids and
// aggregate ids in insert order.
func (e *env) insertSpread(n, aggregates int) (ids, keys []string) {
	e.t.Helper()
	rows, err := e.db.Query(e.t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', (g % $2)::text, 'order.created', jsonb_build_object('seq', g, 'pad', repeat('x', 1000))
		FROM generate_series(1, $1) g RETURNING id::text, aggregate_id`, n, aggregates)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, key string
		if err := rows.Scan(&id, &key); err != nil {
			e.t.Fatal(err)
		}
		ids, keys = append(ids, id), append(keys, key)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return ids, keys
}

// waitArrivals waits until every id has arrived and returns the arrivals.
func waitArrivals(t *testing.T, arrivals func() []arrival, ids []string, timeout time.Duration) []arrival {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := arrivals()
		lost, _, _ := ledgerCheck(ids, nil, got)
		if lost == 0 {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rows missing after %s (%d messages)", lost, len(ids), timeout, len(got))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ledgerCheck compares arrivals with the ledger of ids, committed in that
// order, whose aggregates are keys (nil: order not checked): rows that
// never arrived, rows that arrived more than once, and arrivals before an
// earlier row of their aggregate's.
func ledgerCheck(ids, keys []string, got []arrival) (lost, dups, disorder int) {
	at := make(map[string]int, len(ids))
	for i, id := range ids {
		at[id] = i
	}
	seen := make(map[string]int, len(ids))
	last := map[string]int{}
	for _, a := range got {
		i, ok := at[a.id]
		if !ok {
			continue
		}
		if seen[a.id]++; seen[a.id] == 2 {
			dups++
		}
		if keys == nil {
			continue
		}
		if keys[i] != a.key {
			disorder++ // carried under another aggregate: counted as out of order
		}
		if prev, ok := last[a.key]; ok && i < prev {
			disorder++
		}
		last[a.key] = i
	}
	for _, id := range ids {
		if seen[id] == 0 {
			lost++
		}
	}
	return lost, dups, disorder
}
