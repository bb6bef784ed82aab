package sns

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/aws/smithy-go"
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
var ErrClosed = sinks.Closed("sns sink closed before SNS answered the message")

// Sink publishes relay messages to an SNS topic with PublishBatch (or
// Publish, with a batch size of 1). Create it with New, optionally call
// Connect, run Run for as long as it relays and Close it. It is safe for
// concurrent use.
type Sink struct {
	cfg    Config
	log    *zap.Logger
	tmpl   route.Template
	client *sns.Client
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
	tmpl, err := parseTopicARN(cfg.TopicARN)
	if err != nil {
		return nil, fmt.Errorf("sink.sns.topic_arn: %w", err)
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
		return nil, fmt.Errorf("sink.sns: %w", err)
	}
	s := &Sink{cfg: cfg, log: log.Named("sns"), tmpl: tmpl, client: sns.NewFromConfig(acfg)}
	s.q = batch.New(batch.Options{
		Name: "sns", MaxInFlight: cfg.MaxInFlight, Workers: cfg.MaxConcurrentBatches,
		MaxBatch: cfg.BatchSize, Linger: cfg.Linger, Send: s.send, Closed: ErrClosed,
	})
	return s, nil
}

// probeRefusals are the error codes of SNS's answer to the probe that make
// Connect fail: no such topic, refused credentials.
var probeRefusals = []string{"NotFound", "AuthorizationError", "InvalidClientTokenId", "SignatureDoesNotMatch", "AccessDenied"}

// Connect asks SNS for the configured topic's attributes, so that an
// unreachable endpoint, refused credentials or a missing topic at start is
// one clear error. An endpoint that answers without knowing the call (an
// emulator) counts as reachable.
func (s *Sink) Connect(ctx context.Context) error {
	arn, constant := s.tmpl.Constant()
	if !constant {
		arn = s.tmpl.Render(&relay.Message{AggregateType: "outboxrelay-probe", EventType: "outboxrelay-probe", Table: "outboxrelay-probe"}, nil)
	}
	_, err := s.client.GetTopicAttributes(ctx, &sns.GetTopicAttributesInput{TopicArn: aws.String(arn)})
	var ae smithy.APIError
	var answered *awshttp.ResponseError
	switch {
	case err == nil:
	case errors.As(err, &ae) && slices.Contains(probeRefusals, ae.ErrorCode()):
		if ae.ErrorCode() == "NotFound" && !constant {
			err = nil // a sample rendering of a template
		}
	case errors.As(err, &answered) && answered.HTTPStatusCode() > 0:
		// An answer, if not one SNS gives (an emulator without the call).
		s.log.Warn("the SNS endpoint answered the probe with an error; taking it as reachable", zap.Error(err))
		err = nil
	}
	if err != nil {
		s.ready.Store(false)
		return fmt.Errorf("cannot reach the SNS topic %s (%w); check sink.sns.topic_arn, region, endpoint and the credentials", arn, err)
	}
	s.ready.Store(!s.q.Lifecycle().Stopped())
	return nil
}

// Publish queues m for Run; done is called exactly once, from one of
// Run's goroutines once SNS has answered m, or before Publish returns when
// ctx ends or the sink is closed first (ctx.Err() or ErrClosed, both
// retryable). done must not block. Messages of one aggregate are sent in
// the order of the Publish calls, each once the one before has been
// answered.
func (s *Sink) Publish(ctx context.Context, m *relay.Message, done func(*relay.Message, error)) {
	s.q.Publish(ctx, m, done)
}

// Run sends the queued messages until ctx is done or the sink is closed.
func (s *Sink) Run(ctx context.Context) error { return s.q.Run(ctx) }

type entry = awssink.Entry[types.PublishBatchRequestEntry]

// send is the queue's Send: the messages' entries, grouped by topic, in
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
	awssink.Requests(es, s.cfg.MaxMessageBytes, func(arn string, es []entry) {
		if s.cfg.BatchSize == 1 {
			for _, e := range es {
				errs[e.I] = s.publishOne(ctx, arn, e.In)
			}
			return
		}
		s.publishBatch(ctx, arn, es, errs)
	})
	return errs
}

// entry builds m's batch entry.
func (s *Sink) entry(m *relay.Message) (entry, error) {
	arn := s.tmpl.Render(m, nil)
	m.Destination = arn
	if err := sinks.CheckDestination("sns topic ARN", arn); err != nil {
		return entry{}, err
	}
	if err := checkTopicName(arn); err != nil {
		return entry{}, err
	}
	attrs, size, err := awssink.Check(m, Binding, "sink.sns.max_message_bytes", s.cfg.MaxMessageBytes)
	if err != nil {
		return entry{}, err
	}
	in := types.PublishBatchRequestEntry{
		Message:           aws.String(string(m.Envelope)),
		MessageAttributes: make(map[string]types.MessageAttributeValue, len(attrs)),
	}
	for _, a := range attrs {
		in.MessageAttributes[a.Name] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(a.Value)}
	}
	if strings.HasSuffix(arn, ".fifo") {
		in.MessageGroupId = aws.String(awssink.GroupID(m.AggregateID))
		in.MessageDeduplicationId = aws.String(m.ID)
	}
	return entry{Dest: arn, In: in, Size: size}, nil
}

// publishOne publishes one message with Publish: a refusal SNS blames on
// the request's parameters is permanent, any other failure retryable.
func (s *Sink) publishOne(ctx context.Context, arn string, e types.PublishBatchRequestEntry) error {
	_, err := s.client.Publish(ctx, &sns.PublishInput{TopicArn: aws.String(arn), Message: e.Message, MessageAttributes: e.MessageAttributes,
		MessageGroupId: e.MessageGroupId, MessageDeduplicationId: e.MessageDeduplicationId})
	if err == nil {
		s.ready.Store(!s.q.Lifecycle().Stopped())
		return nil
	}
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorFault() != smithy.FaultServer && (ae.ErrorCode() == "InvalidParameter" || ae.ErrorCode() == "InvalidParameterValue" || ae.ErrorCode() == "ParameterValueInvalid") {
		return awssink.EntryOutcome("sns topic "+arn, true, ae.ErrorCode(), ae.ErrorMessage())
	}
	s.ready.Store(false)
	return awssink.RequestOutcome(ctx, "publish to sns topic "+arn, err)
}

// publishBatch publishes es to the topic arn in one PublishBatch and sets
// each one's outcome in errs.
func (s *Sink) publishBatch(ctx context.Context, arn string, es []entry, errs []error) {
	in := &sns.PublishBatchInput{TopicArn: aws.String(arn), PublishBatchRequestEntries: make([]types.PublishBatchRequestEntry, len(es))}
	for k, e := range es {
		in.PublishBatchRequestEntries[k] = e.In
		in.PublishBatchRequestEntries[k].Id = aws.String(strconv.Itoa(k))
	}
	out, err := s.client.PublishBatch(ctx, in)
	if err != nil {
		s.ready.Store(false)
		err = awssink.RequestOutcome(ctx, "publish to sns topic "+arn, err)
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
			errs[es[k].I] = awssink.EntryOutcome("sns topic "+arn, f.SenderFault, aws.ToString(f.Code), aws.ToString(f.Message))
		}
	}
	awssink.Answered("sns topic "+arn, es, answered, errs)
}

// Ready reports whether SNS answered the latest request; false before the
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
