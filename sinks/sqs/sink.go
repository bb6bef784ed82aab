package sqs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/internal/awssink"
	"github.com/outboxrelay/outboxrelay/sinks/internal/batch"
	"github.com/outboxrelay/outboxrelay/sinks/route"
)

var (
	_ relay.Sink      = (*Sink)(nil)
	_ relay.Runner    = (*Sink)(nil)
	_ sinks.Connector = (*Sink)(nil)
)

// Binding is how the sink carries a message's metadata: every header as a
// String message attribute, the aggregate's among them.
var Binding = sinks.Binding{Aggregate: true, CloudEventsPrefix: "ce-"}

// ErrClosed is reported for messages whose outcome was still open when the
// sink stopped; it matches sinks.ErrClosed too. It is retryable.
var ErrClosed = sinks.Closed("sqs sink closed before SQS answered the message")

// Sink sends relay messages to SQS with SendMessageBatch. Create it with
// New, optionally call Connect, run Run for as long as it relays (Publish
// only queues) and Close it. It is safe for concurrent use.
type Sink struct {
	cfg    Config
	log    *zap.Logger
	tmpl   route.Template
	client *sqs.Client
	q      *batch.Queue
	ready  atomic.Bool
}

// New checks cfg, applies its defaults and returns a Sink. It neither
// connects nor starts goroutines. A nil log means zap.NewNop().
func New(cfg Config, log *zap.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	tmpl, err := parseQueueURL(cfg.QueueURL)
	if err != nil {
		return nil, fmt.Errorf("sink.sqs.queue_url: %w", err)
	}
	tlsCfg, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	acfg, err := awssink.Client{
		Region: cfg.Region, Endpoint: cfg.Endpoint, AccessKeyID: cfg.AccessKeyID, SecretAccessKey: cfg.SecretAccessKey,
		SessionToken: cfg.SessionToken, Timeout: cfg.Timeout, TLS: tlsCfg,
	}.Config(context.Background())
	if err != nil {
		return nil, fmt.Errorf("sink.sqs: %w", err)
	}
	s := &Sink{cfg: cfg, log: log.Named("sqs"), tmpl: tmpl, client: sqs.NewFromConfig(acfg)}
	s.q = batch.New(batch.Options{
		Name: "sqs", MaxInFlight: cfg.MaxInFlight, Workers: cfg.MaxConcurrentBatches,
		MaxBatch: cfg.BatchSize, Linger: cfg.Linger, Send: s.send, Closed: ErrClosed,
	})
	return s, nil
}

// Connect asks SQS for the attributes of the configured queue (of a
// sample rendering when the URL is a template, which only checks the
// credentials and the endpoint), so that an unreachable endpoint, refused
// credentials or a missing queue at start is one clear error.
func (s *Sink) Connect(ctx context.Context) error {
	u, constant := s.tmpl.Constant()
	if !constant {
		u = s.tmpl.Render(&relay.Message{AggregateType: "outboxrelay-probe", EventType: "outboxrelay-probe", Table: "outboxrelay-probe"}, nil)
	}
	_, err := s.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(u), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	var missing *types.QueueDoesNotExist
	if err != nil && (constant || !errors.As(err, &missing)) {
		s.ready.Store(false)
		return fmt.Errorf("cannot reach the SQS queue %s (%w); check sink.sqs.queue_url, region, endpoint and the credentials", u, err)
	}
	s.ready.Store(!s.q.Lifecycle().Stopped())
	return nil
}

// Publish queues m for Run; done is called exactly once, from one of
// Run's goroutines once SQS has answered m's batch, or before Publish
// returns when ctx ends or the sink is closed first (ctx.Err() or
// ErrClosed, both retryable). done must not block. Messages of one
// aggregate are sent in the order of the Publish calls, each once the one
// before has been answered.
func (s *Sink) Publish(ctx context.Context, m *relay.Message, done func(*relay.Message, error)) {
	s.q.Publish(ctx, m, done)
}

// Run sends the queued messages until ctx is done or the sink is closed.
func (s *Sink) Run(ctx context.Context) error { return s.q.Run(ctx) }

type entry = awssink.Entry[types.SendMessageBatchRequestEntry]

// send is the queue's Send: the messages' entries, grouped by queue, in
// requests of at most MaxMessageBytes in all, one outcome per message.
func (s *Sink) send(ctx context.Context, ms []*relay.Message) []error {
	errs := make([]error, len(ms))
	var es []entry
	for i, m := range ms {
		e, err := s.entry(m)
		if err != nil {
			errs[i] = relay.Permanent(err)
			continue
		}
		e.I = i
		es = append(es, e)
	}
	awssink.Requests(es, s.cfg.MaxMessageBytes, func(u string, es []entry) { s.sendBatch(ctx, u, es, errs) })
	return errs
}

// entry builds m's batch entry.
func (s *Sink) entry(m *relay.Message) (entry, error) {
	u := s.tmpl.Render(m, nil)
	m.Destination = u
	if err := sinks.CheckDestination("sqs queue URL", u); err != nil {
		return entry{}, err
	}
	if err := checkQueueName(u); err != nil {
		return entry{}, err
	}
	attrs, size, err := awssink.Check(m, Binding, "sink.sqs.max_message_bytes", s.cfg.MaxMessageBytes)
	if err != nil {
		return entry{}, err
	}
	in := types.SendMessageBatchRequestEntry{
		MessageBody:       aws.String(string(m.Envelope)),
		MessageAttributes: make(map[string]types.MessageAttributeValue, len(attrs)),
	}
	for _, a := range attrs {
		in.MessageAttributes[a.Name] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(a.Value)}
	}
	if strings.HasSuffix(u, ".fifo") {
		in.MessageGroupId = aws.String(awssink.GroupID(m.AggregateID))
		in.MessageDeduplicationId = aws.String(m.ID)
	}
	return entry{Dest: u, In: in, Size: size}, nil
}

// sendBatch sends es to the queue u in one SendMessageBatch and sets each
// one's outcome in errs.
func (s *Sink) sendBatch(ctx context.Context, u string, es []entry, errs []error) {
	in := &sqs.SendMessageBatchInput{QueueUrl: aws.String(u), Entries: make([]types.SendMessageBatchRequestEntry, len(es))}
	for k, e := range es {
		in.Entries[k] = e.In
		in.Entries[k].Id = aws.String(strconv.Itoa(k))
	}
	out, err := s.client.SendMessageBatch(ctx, in)
	if err != nil {
		s.ready.Store(false)
		err = awssink.RequestOutcome(ctx, "send to sqs queue "+u, err)
		for _, e := range es {
			errs[e.I] = err
		}
		return
	}
	s.ready.Store(!s.q.Lifecycle().Stopped())
	answered := map[string]bool{}
	for _, ok := range out.Successful {
		answered[aws.ToString(ok.Id)] = true
	}
	for _, f := range out.Failed {
		if k, err := strconv.Atoi(aws.ToString(f.Id)); err == nil && k >= 0 && k < len(es) {
			answered[aws.ToString(f.Id)] = true
			errs[es[k].I] = awssink.EntryOutcome("sqs queue "+u, f.SenderFault, aws.ToString(f.Code), aws.ToString(f.Message))
		}
	}
	awssink.Answered("sqs queue "+u, es, answered, errs)
}

// Ready reports whether SQS answered the latest request; false before the
// first one and after Close.
func (s *Sink) Ready() bool { return s.ready.Load() }

// Close stops Run (after the batches in flight) and reports every queued
// message with ErrClosed. Every done has been called when it returns.
func (s *Sink) Close() error {
	if s.q.Close() {
		s.ready.Store(false)
	}
	return nil
}
