package kinesis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

var (
	_ relay.Sink      = (*Sink)(nil)
	_ relay.Runner    = (*Sink)(nil)
	_ sinks.Connector = (*Sink)(nil)
)

// ErrClosed is reported for messages whose outcome was still open when the
// sink stopped; it matches sinks.ErrClosed too. It is retryable.
var ErrClosed = sinks.Closed("kinesis sink closed before Kinesis answered the message")

// Limits Kinesis sets on PutRecords.
const (
	maxBatchRecords = 500
	maxBatchBytes   = 5 << 20
	maxRecordBytes  = 1 << 20 // data and partition key
	maxPartitionKey = 256     // Unicode characters
)

// Sink puts relay messages into Kinesis streams. Create it with New,
// optionally call Connect, run Run for as long as it relays (Publish only
// queues) and Close it. It is safe for concurrent use.
type Sink struct {
	cfg    Config
	log    *zap.Logger
	stream streamTemplate
	client *kinesis.Client

	slots    chan struct{} // one per message queued or in flight (MaxInFlight)
	queue    chan *item    // aggregates' heads, ready to put
	requests chan struct{} // one per PutRecords call (MaxRequests)

	mu       sync.Mutex            // guards chains and retrying; orders Publish against Close
	chains   map[aggregate][]*item // an entry per aggregate with a message queued or in flight: the ones behind it
	retrying map[*item]bool        // heads waiting to be put again

	run   *sinks.Lifecycle
	ready atomic.Bool
}

type aggregate struct{ stream, key string }

type item struct {
	m        *relay.Message
	done     func(*relay.Message, error)
	key      aggregate
	attempts int
}

// New checks cfg, applies its defaults and creates the Kinesis client. It
// neither connects nor starts goroutines. A nil log means zap.NewNop().
func New(cfg Config, log *zap.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	st, err := parseStream(cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("sink.kinesis.stream: %w", err)
	}
	client, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Sink{
		cfg: cfg, log: log.Named("kinesis"), stream: st, client: client,
		slots:    make(chan struct{}, cfg.MaxInFlight),
		queue:    make(chan *item, cfg.MaxInFlight),
		requests: make(chan struct{}, cfg.MaxRequests),
		chains:   map[aggregate][]*item{},
		retrying: map[*item]bool{},
		run:      sinks.NewLifecycle("kinesis"),
	}, nil
}

// newClient creates the Kinesis client of cfg, with its defaults applied.
// The SDK does not retry: the relay retries with its own backoff.
func newClient(cfg Config) (*kinesis.Client, error) {
	awsCfg, err := cfg.AWSConfig(service)
	if err != nil {
		return nil, err
	}
	return kinesis.NewFromConfig(awsCfg), nil
}

// Connect finds the credentials and asks Kinesis for the stream (for a
// stream template, for the account's streams) once, so that missing
// credentials, an unreachable endpoint or a missing stream at start is one
// clear error. It is optional. ctx bounds the attempt, as does
// Config.Timeout.
func (s *Sink) Connect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if _, err := s.client.Options().Credentials.Retrieve(ctx); err != nil {
		return fmt.Errorf("no AWS credentials to put records with (%v); set sink.kinesis.access_key_id and sink.kinesis.secret_access_key, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give the instance a role", err)
	}
	var err error
	name, static := s.stream.Constant()
	if static {
		_, err = s.client.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(name)})
	} else {
		name = "the streams"
		_, err = s.client.ListStreams(ctx, &kinesis.ListStreamsInput{Limit: aws.Int32(1)})
	}
	if err != nil {
		s.ready.Store(false)
		var nf *types.ResourceNotFoundException
		if errors.As(err, &nf) {
			return fmt.Errorf("kinesis stream %s does not exist in %s; create it, or check sink.kinesis.stream and sink.kinesis.region", name, s.cfg.Region)
		}
		return fmt.Errorf("cannot reach kinesis for %s (%v); check sink.kinesis.endpoint, sink.kinesis.region, the credentials and the network", name, err)
	}
	s.ready.Store(!s.run.Stopped())
	return nil
}

// Publish queues m for Run; done is called exactly once, from one of Run's
// goroutines once Kinesis has answered m, or before Publish returns when m
// cannot be put (a permanent error), ctx ends or the sink is closed first
// (ctx.Err() or ErrClosed, both retryable). done must not block. Publish
// blocks while Config.MaxInFlight messages are queued or in flight.
// Messages of one aggregate are put in the order of the Publish calls,
// each once Kinesis has stored the one before: a PutRecords call never
// holds two records of one aggregate, because Kinesis does not keep the
// order of the records of one call.
func (s *Sink) Publish(ctx context.Context, m *relay.Message, done func(*relay.Message, error)) {
	if err := ctx.Err(); err != nil {
		done(m, err)
		return
	}
	stream, err := s.stream.render(m)
	m.Destination = stream
	if err == nil {
		err = checkRecord(m)
	}
	if err != nil {
		done(m, relay.Permanent(err))
		return
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		done(m, ctx.Err())
		return
	case <-s.run.Quit():
		done(m, ErrClosed)
		return
	}
	it := &item{m: m, done: done, key: aggregate{stream, partitionKey(m)}}
	s.mu.Lock()
	if s.run.Stopped() {
		s.mu.Unlock()
		<-s.slots
		done(m, ErrClosed)
		return
	}
	waiting, busy := s.chains[it.key]
	if busy {
		s.chains[it.key] = append(waiting, it)
	} else {
		s.chains[it.key] = nil
		s.queue <- it // never blocks: the queue has room for every slot
	}
	s.mu.Unlock()
}

// partitionKey is m's aggregate_id, or its id when it has none (Kinesis
// takes no empty key).
func partitionKey(m *relay.Message) string {
	if m.AggregateID == "" {
		return m.ID
	}
	return m.AggregateID
}

// checkRecord reports why Kinesis could never take m.
func checkRecord(m *relay.Message) error {
	if err := sinks.CheckUTF8("aggregate_id", m.AggregateID); err != nil {
		return fmt.Errorf("message %s: %w (the Kinesis partition key)", m.ID, err)
	}
	if n := utf8.RuneCountInString(m.AggregateID); n > maxPartitionKey {
		return fmt.Errorf("message %s: aggregate_id has %d characters; a Kinesis partition key takes at most %d", m.ID, n, maxPartitionKey)
	}
	if n := len(m.Envelope) + len(partitionKey(m)); n > maxRecordBytes {
		return fmt.Errorf("message %s has %d bytes; a Kinesis record takes at most %d", m.ID, n, maxRecordBytes)
	}
	return nil
}

// Run puts the queued messages, in PutRecords calls of up to 500 records
// of one stream, at most Config.MaxRequests at once, until ctx is done or
// the sink is closed, then returns nil once its calls have been answered.
// Messages still queued are reported by Close. Run may be called once.
func (s *Sink) Run(ctx context.Context) error {
	if err := s.run.Enter(); err != nil {
		return err
	}
	defer s.run.Exit()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		var first *item
		select {
		case first = <-s.queue:
		case <-ctx.Done():
			return nil
		case <-s.run.Quit():
			return nil
		}
		select {
		case s.requests <- struct{}{}:
		case <-ctx.Done():
			s.queue <- first // never blocks: it holds a slot
			return nil
		case <-s.run.Quit():
			s.queue <- first
			return nil
		}
		batches := s.batch(first)
		for i, b := range batches {
			if i > 0 {
				s.requests <- struct{}{} // batches beyond the first wait for room
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-s.requests }()
				s.put(ctx, b)
			}()
		}
	}
}

// batch takes what the queue holds beside first, up to the limits of one
// PutRecords call per stream.
func (s *Sink) batch(first *item) [][]*item {
	byStream := map[string][]*item{first.key.stream: {first}}
	bytes := map[string]int{first.key.stream: recordSize(first)}
	order := []string{first.key.stream}
	for n := 1; n < maxBatchRecords; n++ {
		var it *item
		select {
		case it = <-s.queue:
		default:
		}
		if it == nil {
			break
		}
		st := it.key.stream
		if len(byStream[st]) >= maxBatchRecords || bytes[st]+recordSize(it) > maxBatchBytes {
			s.queue <- it // the next call takes it; it holds a slot
			break
		}
		if _, ok := byStream[st]; !ok {
			order = append(order, st)
		}
		byStream[st] = append(byStream[st], it)
		bytes[st] += recordSize(it)
	}
	out := make([][]*item, 0, len(order))
	for _, st := range order {
		out = append(out, byStream[st])
	}
	return out
}

func recordSize(it *item) int { return len(it.m.Envelope) + len(it.key.key) }

// put sends one PutRecords call and settles each record's outcome.
func (s *Sink) put(ctx context.Context, batch []*item) {
	entries := make([]types.PutRecordsRequestEntry, len(batch))
	for i, it := range batch {
		entries[i] = types.PutRecordsRequestEntry{Data: it.m.Envelope, PartitionKey: aws.String(it.key.key)}
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	out, err := s.client.PutRecords(cctx, &kinesis.PutRecordsInput{StreamName: aws.String(batch[0].key.stream), Records: entries})
	cancel()
	if err == nil && len(out.Records) != len(batch) {
		err = fmt.Errorf("kinesis answered %d records for the %d put", len(out.Records), len(batch))
	}
	if err != nil {
		err = s.putError(ctx, batch[0].key.stream, err)
		for _, it := range batch {
			s.settle(it, err)
		}
		return
	}
	s.ready.Store(!s.run.Stopped())
	for i, it := range batch {
		r := out.Records[i]
		if r.ErrorCode == nil {
			s.settle(it, nil)
			continue
		}
		err := fmt.Errorf("kinesis stream %s refused the record of message %s: %s: %s", it.key.stream, it.m.ID, *r.ErrorCode, aws.ToString(r.ErrorMessage))
		it.attempts++
		if it.attempts < s.cfg.RecordAttempts && s.again(it) {
			continue
		}
		s.settle(it, err)
	}
}

// putError is the outcome of a PutRecords call to stream that failed
// with err. A stream that does not exist refuses the messages
// (relay.Permanent), so the relay dead-letters them after
// relay.max_attempts refusals instead of retrying them forever: a stream
// template can render a name for which no stream was made, which the start
// check cannot know. Kinesis answered, so the sink stays ready. Anything
// else is retried.
func (s *Sink) putError(ctx context.Context, stream string, err error) error {
	var nf *types.ResourceNotFoundException
	switch {
	case ctx.Err() != nil:
		s.ready.Store(false)
		return ctx.Err()
	case errors.As(err, &nf):
		s.ready.Store(!s.run.Stopped())
		return relay.Permanent(fmt.Errorf("kinesis stream %s does not exist in %s; create it, or check sink.kinesis.stream, which rendered this name from the row, and sink.kinesis.region", stream, s.cfg.Region))
	default:
		s.ready.Store(false)
		return fmt.Errorf("put records to kinesis stream %s: %w", stream, err)
	}
}

// again puts it back in the queue, ahead of the rest of its aggregate,
// after a pause that grows with its attempts, and reports false when the
// sink is stopping.
func (s *Sink) again(it *item) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.run.Stopped() {
		return false
	}
	s.retrying[it] = true
	time.AfterFunc(time.Duration(it.attempts)*100*time.Millisecond, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.retrying[it] { // Close has not reported it
			delete(s.retrying, it)
			s.queue <- it // never blocks: it holds a slot
		}
	})
	return true
}

// settle reports it's outcome and queues the next message of its
// aggregate, or, after a retryable failure, fails the ones behind it so
// that none overtakes it.
func (s *Sink) settle(it *item, err error) {
	var behind []*item
	s.mu.Lock()
	waiting := s.chains[it.key]
	switch {
	case len(waiting) == 0:
		delete(s.chains, it.key)
	case err != nil && relay.Retryable(err):
		behind = waiting
		delete(s.chains, it.key)
	default:
		next := waiting[0]
		waiting[0] = nil
		s.chains[it.key] = waiting[1:]
		s.queue <- next // never blocks: next holds a slot
	}
	s.mu.Unlock()
	it.done(it.m, err)
	<-s.slots
	for _, b := range behind {
		b.done(b.m, fmt.Errorf("not put: message %s of aggregate %s before it failed: %w", it.m.ID, it.key.key, err))
		<-s.slots
	}
}

// Ready reports whether Kinesis answered the latest call (or the probe of
// Connect); false before the first one, while calls fail, and after
// Close. It does not block.
func (s *Sink) Ready() bool { return s.ready.Load() }

// Close stops Run (after the calls in flight), reports every queued
// message with ErrClosed (retryable). Every done has been called when
// Close returns. Publish calls after Close report ErrClosed. Close is
// idempotent and safe for concurrent use.
func (s *Sink) Close() error {
	if !s.run.Stop(&s.mu) {
		return nil
	}
	s.ready.Store(false)
	s.mu.Lock()
	var left []*item
	for {
		select {
		case it := <-s.queue:
			left = append(left, it)
			continue
		default:
		}
		break
	}
	for it := range s.retrying {
		left = append(left, it)
	}
	clear(s.retrying)
	for _, it := range left {
		left = append(left, s.chains[it.key]...)
	}
	clear(s.chains)
	s.mu.Unlock()
	for _, it := range left {
		it.done(it.m, ErrClosed)
		<-s.slots
	}
	return nil
}
