package main

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The relay's series carry a slot label since the slot became one: the
// histogram must still be read, and a quantile it cannot give is missing.
func TestParseLatencyWithSlotLabel(t *testing.T) {
	body := strings.Join([]string{
		`# HELP outboxrelay_end_to_end_latency_seconds Commit to acknowledgement.`,
		`# TYPE outboxrelay_end_to_end_latency_seconds histogram`,
		`outboxrelay_end_to_end_latency_seconds_bucket{slot="outboxrelay",le="0.001"} 10`,
		`outboxrelay_end_to_end_latency_seconds_bucket{slot="outboxrelay",le="0.002"} 60`,
		`outboxrelay_end_to_end_latency_seconds_bucket{le="0.005",slot="outboxrelay"} 99`,
		`outboxrelay_end_to_end_latency_seconds_bucket{slot="outboxrelay",le="+Inf"} 100`,
		`outboxrelay_end_to_end_latency_seconds_sum{slot="outboxrelay"} 0.2`,
		`outboxrelay_end_to_end_latency_seconds_count{slot="outboxrelay"} 100`,
	}, "\n")
	bs, err := parseLatency(body)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 4 {
		t.Fatalf("buckets = %v, want 4", bs)
	}
	p50, p99 := bucketQuantile(bs, 0.5), bucketQuantile(bs, 0.99)
	if p50 == nil || *p50 != 2 {
		t.Fatalf("p50 = %v, want 2 ms", p50)
	}
	if p99 == nil || *p99 != 5 {
		t.Fatalf("p99 = %v, want 5 ms", p99)
	}
	// The 99.9th percentile lies in the +Inf bucket: no upper bound.
	if q := bucketQuantile(bs, 0.999); q != nil {
		t.Fatalf("p99.9 = %v, want missing", *q)
	}
}

// Two slots' series are summed per bound.
func TestParseLatencySumsSeries(t *testing.T) {
	body := `outboxrelay_end_to_end_latency_seconds_bucket{slot="a",le="0.001"} 1
outboxrelay_end_to_end_latency_seconds_bucket{slot="b",le="0.001"} 2
outboxrelay_end_to_end_latency_seconds_bucket{slot="a",le="+Inf"} 3
outboxrelay_end_to_end_latency_seconds_bucket{slot="b",le="+Inf"} 4`
	bs, err := parseLatency(body)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 2 || bs[0].count != 3 || bs[1].count != 7 {
		t.Fatalf("buckets = %v, want [{0.001 3} {+Inf 7}]", bs)
	}
}

// A histogram that is absent or empty yields missing figures, recorded as
// null, never 0.
func TestLatencyMissingIsNull(t *testing.T) {
	if _, err := parseLatency("outboxrelay_build_info{version=\"x\"} 1\n"); err == nil {
		t.Fatal("no histogram parsed without error")
	}
	empty := []bucket{{le: 0.001, count: 0}, {le: math.Inf(1), count: 0}}
	res := latencyResult{RelayP50Le: bucketQuantile(empty, 0.5), RelayP99Le: bucketQuantile(nil, 0.99)}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"relay_histogram_p50_le_ms":null`, `"relay_histogram_p99_le_ms":null`} {
		if !strings.Contains(string(b), key) {
			t.Fatalf("%s not in %s", key, b)
		}
	}
}

// The reference's records are timed from the commit their header carries;
// a record without it, or with an unreadable one, is an error, never a
// latency of 0.
func TestBareReceipt(t *testing.T) {
	commit := time.Date(2026, 12, 6, 22, 0, 0, 123456000, time.UTC)
	r := &kgo.Record{Offset: 7, Headers: []kgo.RecordHeader{{Key: commitHeader, Value: strconv.AppendInt(nil, commit.UnixMicro(), 10)}}}
	l, err := bareReceipt(r, commit.Add(2500*time.Microsecond))
	if err != nil {
		t.Fatal(err)
	}
	if l != 2.5 {
		t.Fatalf("latency = %v ms, want 2.5", l)
	}
	for _, hs := range [][]kgo.RecordHeader{nil, {{Key: commitHeader, Value: []byte("soon")}}} {
		if l, err := bareReceipt(&kgo.Record{Headers: hs}, commit); err == nil {
			t.Fatalf("headers %v: latency %v ms, want an error", hs, l)
		}
	}
}
