package integration

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// lagReadings are lag_seconds as /metrics, `status --json` and the view
// outboxrelay.status report it.
type lagReadings struct{ metric, status, view float64 }

func (e *env) lagSeconds(base string) lagReadings {
	e.t.Helper()
	var l lagReadings
	_, body := get(e.t, base+"/metrics")
	v, ok := metricValues(body, "outboxrelay_replication_lag_seconds")[`{slot="outboxrelay"}`]
	if !ok {
		e.t.Fatalf("no outboxrelay_replication_lag_seconds{slot=\"outboxrelay\"} in /metrics")
	}
	l.metric = v
	st, _, out := e.statusJSON()
	if !st.Exists {
		e.t.Fatalf("status --json:\n%s", out)
	}
	l.status = st.LagSeconds
	if strings.Contains(out, `"lag_seconds": null`) {
		l.status = -1
	}
	var view *float64
	if err := e.db.QueryRow(e.t.Context(), "SELECT lag_seconds FROM outboxrelay.status WHERE slot = 'outboxrelay'").Scan(&view); err != nil {
		e.t.Fatalf("lag_seconds from the view: %v", err)
	}
	l.view = -1 // null: nothing recorded yet
	if view != nil {
		l.view = *view
	}
	return l
}

// TestLagSecondsBrokerOutage stops the broker for 20 s: lag_seconds grows
// past 20 in /metrics, `status --json` and the view, and drops back near 0
// once the broker is back and the backlog is delivered.
func TestLagSecondsBrokerOutage(t *testing.T) {
	e := newEnv(t)
	newCluster := e.restartableKafka()
	cluster := newCluster()
	e.brokers = cluster.ListenAddrs()[0]
	p := e.start("OUTBOXRELAY_POSTGRES_HEARTBEAT_INTERVAL=1s")
	base := "http://" + p.httpAddr()
	p.waitLog(`"streaming"`, 30*time.Second)
	c := e.consume("outbox.order")
	ids := e.insert("outbox", "order", "1", 10)
	c.waitIDs(ids, 30*time.Second)

	var l lagReadings
	waitFor(t, 15*time.Second, "lag_seconds near 0 on an idle relay", func() bool {
		l = e.lagSeconds(base)
		return l.metric < 3 && l.status >= 0 && l.status < 3 && l.view >= 0 && l.view < 3
	})
	t.Logf("idle: lag_seconds %+v", l)

	cluster.Close()
	stopped := time.Now()
	t.Log("broker stopped")
	ids = append(ids, e.insert("outbox", "order", "2", 5)...)
	waitFor(t, 40*time.Second, "lag_seconds of at least 20 everywhere", func() bool {
		l = e.lagSeconds(base)
		return l.metric >= 20 && l.status >= 20 && l.view >= 20
	})
	t.Logf("broker down for %s: lag_seconds %+v", time.Since(stopped).Round(time.Second), l)

	cluster = newCluster()
	t.Cleanup(cluster.Close)
	t.Log("broker started again")
	c.waitIDs(ids, 90*time.Second)
	waitFor(t, 20*time.Second, "lag_seconds back near 0 everywhere", func() bool {
		l = e.lagSeconds(base)
		return l.metric < 3 && l.status >= 0 && l.status < 3 && l.view >= 0 && l.view < 3
	})
	t.Logf("caught up: lag_seconds %+v", l)
	p.stop()

	// No relay runs: PostgreSQL alone says how old the lag is, and it grows.
	before := e.lagSecondsStopped()
	time.Sleep(2 * time.Second)
	if after := e.lagSecondsStopped(); after < before+1.5 {
		t.Errorf("lag_seconds with the relay stopped went from %.1f to %.1f in 2 s; want it growing", before, after)
	}
}

// lagSecondsStopped is lag_seconds from `status --json` and the view with no relay running.
func (e *env) lagSecondsStopped() float64 {
	e.t.Helper()
	st, _, out := e.statusJSON()
	var view float64
	if err := e.db.QueryRow(e.t.Context(), "SELECT lag_seconds FROM outboxrelay.status WHERE slot = 'outboxrelay'").Scan(&view); err != nil {
		e.t.Fatalf("lag_seconds from the view: %v", err)
	}
	if strings.Contains(out, `"lag_seconds": null`) {
		e.t.Fatalf("status --json has no lag_seconds:\n%s", out)
	}
	if d := view - st.LagSeconds; d > 1 || d < -1 {
		e.t.Errorf("view lag_seconds %.2f, status %.2f", view, st.LagSeconds)
	}
	return st.LagSeconds
}

// TestLagSecondsIdle: an idle relay that is caught up reports lag_seconds
// near 0 in /metrics and its /status all along, not the time since its
// last heartbeat (10 s by default), sampled every 500 ms for 25 s.
func TestLagSecondsIdle(t *testing.T) {
	e := newEnv(t)
	p := e.start()
	base := "http://" + p.httpAddr()
	p.waitLog(`"streaming"`, 30*time.Second)
	c := e.consume("outbox.order")
	c.waitIDs(e.insert("outbox", "order", "1", 5), 30*time.Second)
	waitFor(t, 15*time.Second, "lag_seconds recorded", func() bool {
		_, body := get(t, base+"/status")
		return strings.Contains(body, `"lag_seconds":`) && !strings.Contains(body, `"lag_seconds": null`) && !strings.Contains(body, `"lag_seconds":null`)
	})

	var metricMax, statusMax float64
	for end := time.Now().Add(25 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		_, body := get(t, base+"/metrics")
		m, ok := metricValues(body, "outboxrelay_replication_lag_seconds")[`{slot="outboxrelay"}`]
		if !ok {
			t.Fatalf("no outboxrelay_replication_lag_seconds{slot=\"outboxrelay\"} in /metrics")
		}
		code, body := get(t, base+"/status")
		var st struct {
			LagSeconds *float64 `json:"lag_seconds"`
		}
		if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil || st.LagSeconds == nil {
			t.Fatalf("GET /status = %d (%v), want lag_seconds:\n%s", code, err, body)
		}
		metricMax, statusMax = max(metricMax, m), max(statusMax, *st.LagSeconds)
	}
	t.Logf("idle for 25 s: highest lag_seconds %.2f in /metrics, %.2f in /status", metricMax, statusMax)
	if metricMax >= 2 || statusMax >= 2 {
		t.Errorf("an idle, caught-up relay reported lag_seconds up to %.2f (/metrics) and %.2f (/status); want under 2", metricMax, statusMax)
	}
}
