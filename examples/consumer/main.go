// Command consumer is an example Kafka consumer of outboxrelay envelopes.
//
// It shows the two things every consumer of an at-least-once relay needs:
//
//   - Dedupe on message_id. The relay may deliver a message again after a
//     crash (and a consumer group rebalance may replay a few records); a
//     message must take effect once. Here an in-memory LRU of recently
//     processed ids is enough to show the idea. When processing writes to
//     a database, make it exact instead: record the id in the same
//     transaction as the effect, and skip the message when it was there:
//
//     CREATE TABLE processed_messages (message_id uuid PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now());
//     -- in the transaction that applies the message:
//     INSERT INTO processed_messages (message_id) VALUES ($1) ON CONFLICT DO NOTHING;
//     -- 0 rows affected: already processed; roll back and commit the offset.
//
//   - Continue the producer's trace. The envelope and the record's
//     traceparent header carry the trace of the request that wrote the
//     outbox row; the processing span is its child.
//
// Offsets are committed only after the records of a poll are processed, so
// a crash reprocesses rather than loses them, and the dedupe absorbs that.
//
//	go run ./examples/consumer -brokers 127.0.0.1:9092 -topic outbox.order
package main

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "Kafka brokers, comma-separated")
	topic := flag.String("topic", "outbox.order", "topic to consume")
	group := flag.String("group", "order-consumer", "consumer group")
	verbose := flag.Bool("v", false, "log the Kafka client's activity to stderr")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	opts := []kgo.Opt{
		kgo.SeedBrokers(strings.Split(*brokers, ",")...),
		kgo.ConsumerGroup(*group),
		kgo.ConsumeTopics(*topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
	}
	if *verbose {
		opts = append(opts, kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelInfo, nil)))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(2)
	}
	defer cl.Close()

	// A real service installs an SDK TracerProvider with an exporter here;
	// with the default no-op provider the trace context is still carried.
	h := &Handler{Seen: NewLRU(100_000), Tracer: otel.Tracer("examples/consumer"), Out: os.Stdout}
	if err := Run(ctx, cl, h); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

// Run polls until ctx is cancelled, hands every record to h and commits
// the offsets of each poll once all its records are processed.
func Run(ctx context.Context, cl *kgo.Client, h *Handler) error {
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		var errs []error
		fs.EachError(func(topic string, p int32, err error) {
			errs = append(errs, fmt.Errorf("fetch %s[%d]: %w", topic, p, err))
		})
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		var failed error
		fs.EachRecord(func(r *kgo.Record) {
			if failed == nil {
				failed = h.Handle(ctx, r)
			}
		})
		if failed != nil {
			// Do not commit: the records are delivered again after a
			// restart, and the ones already processed are deduped.
			return failed
		}
		// Commit even when ctx was cancelled meanwhile: these records are
		// processed, and a shutdown should not make them come back.
		if err := cl.CommitUncommittedOffsets(context.WithoutCancel(ctx)); err != nil {
			return fmt.Errorf("commit offsets: %w", err)
		}
	}
}

// Envelope is the part of an outboxrelay envelope (version 1) this
// consumer reads. Unknown fields are ignored, as the contract requires.
type Envelope struct {
	EnvelopeVersion int             `json:"envelope_version"`
	MessageID       string          `json:"message_id"`
	EventType       string          `json:"event_type"`
	SchemaVersion   int             `json:"schema_version"`
	AggregateType   string          `json:"aggregate_type"`
	AggregateID     string          `json:"aggregate_id"`
	TraceID         string          `json:"trace_id"`
	Traceparent     string          `json:"traceparent"`
	Payload         json.RawMessage `json:"payload"`
}

// Handler processes one record at a time; it is used by one goroutine.
type Handler struct {
	Seen   *LRU
	Tracer trace.Tracer
	Out    io.Writer
}

var propagator = propagation.TraceContext{}

// Handle processes r once per message_id.
func (h *Handler) Handle(ctx context.Context, r *kgo.Record) error {
	var env Envelope
	if err := json.Unmarshal(r.Value, &env); err != nil || env.MessageID == "" {
		// A poison record: log it and move on rather than block the partition.
		fmt.Fprintf(h.Out, "skipped undecodable record %s[%d]@%d\n", r.Topic, r.Partition, r.Offset)
		return nil
	}
	if h.Seen.Contains(env.MessageID) {
		fmt.Fprintf(h.Out, "duplicate %s\n", env.MessageID)
		return nil
	}

	// The traceparent header makes the producer's span our parent.
	ctx = propagator.Extract(ctx, headerCarrier{r})
	ctx, span := h.Tracer.Start(ctx, "process "+env.EventType,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.destination.name", r.Topic),
			attribute.String("messaging.message.id", env.MessageID),
		))
	defer span.End()

	if err := process(ctx, h.Out, &env); err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return fmt.Errorf("process %s: %w", env.MessageID, err)
	}
	// Remember the id only once the message took effect, so that a failed
	// message is processed again.
	h.Seen.Add(env.MessageID)
	return nil
}

// process is the business logic.
func process(ctx context.Context, out io.Writer, env *Envelope) error {
	fmt.Fprintf(out, "processed %s %s aggregate=%s/%s trace_id=%s payload=%s\n", env.MessageID, env.EventType,
		env.AggregateType, env.AggregateID, trace.SpanContextFromContext(ctx).TraceID(), env.Payload)
	return nil
}

// headerCarrier lets OpenTelemetry propagators read Kafka record headers.
type headerCarrier struct{ r *kgo.Record }

func (c headerCarrier) Get(key string) string {
	for _, h := range c.r.Headers {
		if strings.EqualFold(h.Key, key) {
			return string(h.Value)
		}
	}
	return ""
}

func (c headerCarrier) Set(key, value string) {
	c.r.Headers = append(c.r.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
}

func (c headerCarrier) Keys() []string {
	keys := make([]string, len(c.r.Headers))
	for i, h := range c.r.Headers {
		keys[i] = h.Key
	}
	return keys
}

// LRU remembers the most recently processed message ids. It is safe for
// concurrent use.
type LRU struct {
	mu    sync.Mutex
	size  int
	order *list.List // front: most recent
	items map[string]*list.Element
}

// NewLRU returns an LRU that holds up to size ids.
func NewLRU(size int) *LRU {
	return &LRU{size: size, order: list.New(), items: make(map[string]*list.Element, size)}
}

// Contains reports whether id was added and not yet evicted.
func (l *LRU) Contains(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.items[id]; ok {
		l.order.MoveToFront(e)
		return true
	}
	return false
}

// Add remembers id, evicting the least recently used id when full.
func (l *LRU) Add(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.items[id]; ok {
		l.order.MoveToFront(e)
		return
	}
	l.items[id] = l.order.PushFront(id)
	if l.order.Len() > l.size {
		oldest := l.order.Back()
		l.order.Remove(oldest)
		delete(l.items, oldest.Value.(string))
	}
}
