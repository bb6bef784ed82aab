package metrics

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// SinkLag is one sink's own progress when a relay feeds several
// (Config.SinkLag).
type SinkLag struct {
	// Sink is the sink's name under the sinks section.
	Sink string
	// Confirmed is the sink's own watermark (an LSN; 0: unknown).
	Confirmed uint64
	// Since is the commit time its lag in seconds counts from (zero:
	// unknown), as Config.LagSince is for the slot.
	Since time.Time
	// Behind says the sink fell behind the others; Spilled is how many of
	// its messages wait in outboxrelay.spilled (relay.behind: spill).
	Behind  bool
	Spilled int64
}

// sinkCollector serves sink_lag_bytes and sink_lag_seconds by sink, read
// from Config.SinkLag at each scrape; the bytes count from the server's
// position the last status poll read (currentWAL).
type sinkCollector struct {
	read       func() []SinkLag
	currentWAL *atomic.Uint64
	bytes      *prometheus.Desc
	seconds    *prometheus.Desc
	behind     *prometheus.Desc
	spilled    *prometheus.Desc
}

func newSinkCollector(read func() []SinkLag, currentWAL *atomic.Uint64) *sinkCollector {
	return &sinkCollector{
		read: read, currentWAL: currentWAL,
		bytes: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "sink_lag_bytes"),
			"WAL bytes between the server's current position and the sink's own watermark, with several sinks on one slot; the slot's confirmed position is the lowest watermark, so the slowest sink bounds WAL retention.",
			[]string{"sink"}, nil),
		seconds: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "sink_lag_seconds"),
			"Age of the sink's oldest committed message its broker has not acknowledged, with several sinks on one slot; when it has none pending, time since the newest transaction the relay saw.",
			[]string{"sink"}, nil),
		behind: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "sink_behind"),
			"1 while the sink is behind the others and its messages go to outboxrelay.spilled (relay.behind: spill), else 0.",
			[]string{"sink"}, nil),
		spilled: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "sink_spilled_messages"),
			"Messages of the sink stored in outboxrelay.spilled while it was behind, not delivered yet.",
			[]string{"sink"}, nil),
	}
}

func (c *sinkCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.bytes
	ch <- c.seconds
	ch <- c.behind
	ch <- c.spilled
}

func (c *sinkCollector) Collect(ch chan<- prometheus.Metric) {
	current := c.currentWAL.Load()
	for _, s := range c.read() {
		if current != 0 && s.Confirmed != 0 {
			b := math.Max(0, float64(int64(current)-int64(s.Confirmed)))
			ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, b, s.Sink)
		}
		if !s.Since.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.seconds, prometheus.GaugeValue, math.Max(0, time.Since(s.Since).Seconds()), s.Sink)
		}
		behind := 0.0
		if s.Behind {
			behind = 1
		}
		ch <- prometheus.MustNewConstMetric(c.behind, prometheus.GaugeValue, behind, s.Sink)
		ch <- prometheus.MustNewConstMetric(c.spilled, prometheus.GaugeValue, float64(s.Spilled), s.Sink)
	}
}
