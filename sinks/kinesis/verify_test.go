package kinesis

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"

	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// TestVerifyReader: what the sink put into a stream of three shards, the
// verify command's reader reads back, each id once.
func TestVerifyReader(t *testing.T) {
	t.Parallel()
	srv := startKinesalite(t)
	createStream(t, testClient(t, srv.Addr()), "verify_orders", 3)
	cfg := testConfig(srv.Addr(), "verify_orders")
	sinktest.CheckVerifyReader(t, startSink(t, cfg), &cfg, sinks.VerifyOptions{}, 60)
}

// TestVerifyReaderWindow: the reader passes the records that arrived at
// or after since and no older one, returns at once for an empty shard, a
// shard with only older records (which kinesalite never answers an
// AT_TIMESTAMP iterator for) and a stream that does not exist, and reads
// a structured CloudEvent's id.
func TestVerifyReaderWindow(t *testing.T) {
	t.Parallel()
	srv := startKinesalite(t)
	c := testClient(t, srv.Addr())
	createStream(t, c, "window", 2)
	createStream(t, c, "empty", 1)
	cfg := testConfig(srv.Addr(), "{aggregate_type}")
	cfg.Timeout = 300 * time.Millisecond
	rd, dest, err := cfg.VerifyReader(sinks.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	old := sinktest.Messages("window", 20, 4)
	if d, err := dest(old[0]); err != nil || d != "window" {
		t.Fatalf("destination of an aggregate_type window: %q, %v", d, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put := func(data ...[]byte) {
		t.Helper()
		for i, d := range data {
			if _, err := c.PutRecord(ctx, &kinesis.PutRecordInput{StreamName: aws.String("window"), Data: d, PartitionKey: aws.String(string(rune('a' + i%4)))}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, m := range old {
		put(m.Envelope)
	}
	time.Sleep(1100 * time.Millisecond) // kinesalite's arrival times have milliseconds, the SDK's requests seconds
	since := time.Now()
	time.Sleep(100 * time.Millisecond)

	read := func() map[string]int {
		t.Helper()
		got := map[string]int{}
		started := time.Now()
		if err := rd.Read(ctx, since, []string{"window", "empty", "missing"}, func(id string) error { got[id]++; return nil }); err != nil {
			t.Fatalf("Read: %v", err)
		}
		t.Logf("read %d ids in %s", len(got), time.Since(started).Round(time.Millisecond))
		return got
	}
	if got := read(); len(got) != 0 {
		t.Errorf("read %v from records older than since, want none", got)
	}

	fresh := sinktest.Messages("window", 10, 4)
	for _, m := range fresh {
		put(m.Envelope)
	}
	put([]byte(`{"specversion":"1.0","id":"ce-0001","type":"order.created","source":"x"}`), []byte("not json"))
	got := read()
	for _, m := range fresh {
		if got[m.ID] != 1 {
			t.Errorf("message %s read %d times, want once", m.ID, got[m.ID])
		}
	}
	if got["ce-0001"] != 1 {
		t.Errorf("the CloudEvent's id was read %d times, want once", got["ce-0001"])
	}
	for _, m := range old {
		if got[m.ID] != 0 {
			t.Errorf("message %s, put before since, was read", m.ID)
		}
	}
	if len(got) != len(fresh)+1 {
		t.Errorf("read %d ids, want %d", len(got), len(fresh)+1)
	}
}

// TestRecordID: the id of each envelope format a Kinesis record carries.
func TestRecordID(t *testing.T) {
	for data, want := range map[string]string{
		`{"envelope_version":1,"message_id":"m1","payload":{"id":"no"}}`: "m1",
		`{"specversion":"1.0","id":"c1","data":{"message_id":"no"}}`:     "c1",
		`{"id":"x"}`: "",
		`[1,2]`:      "",
		``:           "",
	} {
		if got := recordID([]byte(data)); got != want {
			t.Errorf("recordID(%s) = %q, want %q", data, got, want)
		}
	}
}
