package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"
)

// received is one consumed Kafka record, with the envelope fields the demo shows.
type received struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       string
	MessageID string // the message_id header
	Envelope  struct {
		MessageID   string          `json:"message_id"`
		EventType   string          `json:"event_type"`
		AggregateID string          `json:"aggregate_id"`
		TraceID     string          `json:"trace_id"`
		Payload     json.RawMessage `json:"payload"`
		Source      struct {
			LSN       string `json:"lsn"`
			CommitLSN string `json:"commit_lsn"`
		} `json:"source"`
	}
	lsn, commitLSN pglogrepl.LSN
}

// consumeTimeout bounds the wait for the committed messages.
const consumeTimeout = 30 * time.Second

// consume reads both topics from the start until every wanted message has
// arrived, then polls once more so that a message that should not exist
// would be seen. It fails when the relay stops or the messages do not
// arrive in time.
func consume(ctx context.Context, brokers []string, want []expected, rel *runningRelay) ([]received, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topicOrder, topicCustomer),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond),
		// The topics appear when the relay first produces to them.
		kgo.MetadataMinAge(100*time.Millisecond),
	)
	if err != nil {
		return nil, fmt.Errorf("create consumer: %w", err)
	}
	defer cl.Close()

	wanted := make(map[string]bool, len(want))
	for _, e := range want {
		wanted[e.MessageID] = true
	}
	var got []received
	seen := map[string]bool{}
	deadline := time.Now().Add(consumeTimeout)
	extraPoll := false
	for {
		select {
		case <-rel.failed():
			return nil, rel.exitErr()
		default:
		}
		pollCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		fs := cl.PollFetches(pollCtx)
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("consume: %w", err)
		}
		var decodeErr error
		fs.EachRecord(func(r *kgo.Record) {
			rec, err := decode(r)
			if err != nil {
				decodeErr = errors.Join(decodeErr, err)
				return
			}
			got = append(got, rec)
			seen[rec.MessageID] = true
		})
		if decodeErr != nil {
			return nil, decodeErr
		}
		if extraPoll {
			break
		}
		if countSeen(seen, wanted) == len(wanted) {
			extraPoll = true
			continue
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("only %d of %d committed messages arrived within %s", countSeen(seen, wanted), len(wanted), consumeTimeout)
		}
	}
	// The relay publishes in commit order; showing the records in that order
	// makes the per-aggregate order visible across partitions.
	slices.SortStableFunc(got, func(a, b received) int {
		if c := compareLSN(a.commitLSN, b.commitLSN); c != 0 {
			return c
		}
		return compareLSN(a.lsn, b.lsn)
	})
	return got, nil
}

func countSeen(seen, wanted map[string]bool) int {
	n := 0
	for id := range wanted {
		if seen[id] {
			n++
		}
	}
	return n
}

func compareLSN(a, b pglogrepl.LSN) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func decode(r *kgo.Record) (received, error) {
	rec := received{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: string(r.Key)}
	for _, h := range r.Headers {
		if h.Key == "message_id" {
			rec.MessageID = string(h.Value)
		}
	}
	if err := json.Unmarshal(r.Value, &rec.Envelope); err != nil {
		return rec, fmt.Errorf("record %s/%d@%d is not an envelope: %w", r.Topic, r.Partition, r.Offset, err)
	}
	var err error
	if rec.lsn, err = pglogrepl.ParseLSN(rec.Envelope.Source.LSN); err != nil {
		return rec, fmt.Errorf("record %s/%d@%d: source.lsn: %w", r.Topic, r.Partition, r.Offset, err)
	}
	if rec.commitLSN, err = pglogrepl.ParseLSN(rec.Envelope.Source.CommitLSN); err != nil {
		return rec, fmt.Errorf("record %s/%d@%d: source.commit_lsn: %w", r.Topic, r.Partition, r.Offset, err)
	}
	return rec, nil
}

// printRecords prints one aligned line per record.
func printRecords(p printer, recs []received) {
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "    TOPIC\tPARTITION@OFFSET\tKEY\tEVENT TYPE\tTRACE ID\tPAYLOAD")
	for _, r := range recs {
		payload := string(r.Envelope.Payload)
		var b bytes.Buffer
		if json.Compact(&b, r.Envelope.Payload) == nil {
			payload = b.String()
		}
		fmt.Fprintf(tw, "    %s\t%d@%d\t%s\t%s\t%s\t%s\n", r.Topic, r.Partition, r.Offset, r.Key, r.Envelope.EventType, r.Envelope.TraceID, payload)
	}
	_ = tw.Flush()
	p.line("trace id %s comes from order 1001's traceparent; the other events started new traces", sampleTraceID)
}

// checkRecords verifies what the demo promises: every committed event
// arrived with its key and envelope, the traceparent was honoured, and the
// rolled-back order is absent.
func checkRecords(got []received, want []expected) error {
	byID := map[string]received{}
	for _, r := range got {
		if r.Envelope.AggregateID == rolledBackOrder {
			return fmt.Errorf("the rolled-back order %s was published (message %s)", rolledBackOrder, r.MessageID)
		}
		byID[r.MessageID] = r
	}
	wanted := map[string]bool{}
	for _, e := range want {
		wanted[e.MessageID] = true
		r, ok := byID[e.MessageID]
		switch {
		case !ok:
			return fmt.Errorf("message %s (%s %s) did not arrive", e.MessageID, e.EventType, e.AggregateID)
		case r.Topic != "outbox."+e.AggregateType || r.Key != e.AggregateID || r.Envelope.EventType != e.EventType ||
			r.Envelope.MessageID != e.MessageID:
			return fmt.Errorf("message %s arrived as topic %s key %s event %s, want topic outbox.%s key %s event %s",
				e.MessageID, r.Topic, r.Key, r.Envelope.EventType, e.AggregateType, e.AggregateID, e.EventType)
		case e.AggregateID == "1001" && e.EventType == "order.created" && r.Envelope.TraceID != sampleTraceID:
			return fmt.Errorf("order 1001 has trace id %s, want %s from its traceparent", r.Envelope.TraceID, sampleTraceID)
		}
	}
	for id := range byID {
		if !wanted[id] {
			return fmt.Errorf("unexpected message %s: only committed rows may arrive", id)
		}
	}
	return nil
}

// lastCommit is the newest commit position among the records.
func lastCommit(recs []received) pglogrepl.LSN {
	var last pglogrepl.LSN
	for _, r := range recs {
		last = max(last, r.commitLSN)
	}
	return last
}
