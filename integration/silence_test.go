package integration

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestBrokerStopsAnswering: Kafka keeps its connections open but answers no
// produce request. Within a few seconds /readyz is 503 saying so, the log
// has a warning and outboxrelay_sink_unanswered_seconds shows it; once the
// broker answers again every row arrives.
func TestBrokerStopsAnswering(t *testing.T) {
	e := newEnv(t)
	var silent atomic.Bool
	e.kafka.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.KeepControl()
		// Handled with neither a response nor an error: the request is
		// read and never answered.
		return nil, nil, silent.Load()
	})
	p := e.start()
	base := "http://" + p.httpAddr()
	p.waitLog(`"streaming"`, 30*time.Second)
	c := e.consume("outbox.order")
	ids := e.insert("outbox", "order", "1", 10)
	c.waitIDs(ids, 30*time.Second)
	if code, body := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz = %d %s before the silence", code, body)
	}

	silent.Store(true)
	stopped := time.Now()
	ids = append(ids, e.insert("outbox", "order", "2", 10)...)
	var body string
	waitFor(t, 15*time.Second, "/readyz to report the silent broker", func() bool {
		var code int
		code, body = get(t, base+"/readyz")
		return code == 503 && strings.Contains(body, "answered nothing")
	})
	t.Logf("/readyz 503 after %s: %s", time.Since(stopped).Round(100*time.Millisecond), strings.TrimSpace(body))
	p.waitLog("answers none", 5*time.Second)
	t.Logf("warned after %s", time.Since(stopped).Round(100*time.Millisecond))
	_, metrics := get(t, base+"/metrics")
	if v := metricValues(metrics, "outboxrelay_sink_unanswered_seconds")[`{slot="outboxrelay"}`]; v < 5 {
		t.Errorf("sink_unanswered_seconds = %v while the broker is silent, want at least 5", v)
	}

	silent.Store(false)
	c.waitIDs(ids, 120*time.Second)
	p.waitLog("the broker answers again", 30*time.Second)
	waitFor(t, 30*time.Second, "/readyz 200 once the broker answers", func() bool {
		code, _ := get(t, base+"/readyz")
		return code == 200
	})
	p.stop()
	t.Logf("rows %d, lost 0, duplicates %d", len(ids), duplicates(c.records()))
}
