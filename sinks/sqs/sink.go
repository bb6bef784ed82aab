package sqs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/internal/awssink"
)

var (
	_ relay.Sink      = (*Sink)(nil)
	_ relay.Runner    = (*Sink)(nil)
	_ sinks.Connector = (*Sink)(nil)
)

// Binding is how the sink carries a message's metadata (awssink.Binding).
var Binding = awssink.Binding

// ErrClosed is reported for messages whose outcome was still open when the
// sink stopped; it matches sinks.ErrClosed too. It is retryable.
var ErrClosed = sinks.Closed("sqs sink closed before SQS answered the message")

// Sink sends relay messages to SQS with SendMessageBatch. Create it with
// New, optionally call Connect, run Run for as long as it relays (Publish
// only queues) and Close it. It is safe for concurrent use.
type Sink struct {
	awssink.Base
	cfg    Config
	client *sqs.Client
}

// New checks cfg, applies its defaults and returns a Sink. It neither
// connects nor starts goroutines. A nil log means zap.NewNop().
func New(cfg Config, log *zap.Logger) (*Sink, error) {
	common, tmpl, acfg, err := awssink.Prepare(service, cfg.Validate(), cfg.Common, "queue_url", cfg.QueueURL, parseQueueURL)
	if err != nil {
		return nil, err
	}
	cfg.Common = common
	s := &Sink{cfg: cfg, client: sqs.NewFromConfig(acfg)}
	s.Init(service, common, tmpl, log, s.send, ErrClosed)
	return s, nil
}

// Connect asks SQS for the attributes of the configured queue (of a
// sample rendering when the URL is a template, which only checks the
// credentials and the endpoint), so that an unreachable endpoint, refused
// credentials or a missing queue at start is one clear error.
func (s *Sink) Connect(ctx context.Context) error {
	u, constant := s.Probe()
	_, err := s.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(u), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	var missing *types.QueueDoesNotExist
	if err != nil && (constant || !errors.As(err, &missing)) {
		s.Answer(false)
		return fmt.Errorf("cannot reach the SQS queue %s (%w); check sink.sqs.queue_url, region, endpoint and the credentials", u, err)
	}
	s.Answer(true)
	return nil
}

type entry = awssink.Entry[types.SendMessageBatchRequestEntry]

// send is the queue's Send: the messages' entries, grouped by queue, in
// requests of at most MaxMessageBytes in all, one outcome per message.
func (s *Sink) send(ctx context.Context, ms []*relay.Message) []error {
	return awssink.Send(ms, s.cfg.MaxMessageBytes, s.entry, func(u string, es []entry, errs []error) { s.sendBatch(ctx, u, es, errs) })
}

// entry builds m's batch entry.
func (s *Sink) entry(m *relay.Message) (entry, error) {
	u := s.Tmpl.Render(m, nil)
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
	ins := awssink.IDs(es, func(in *types.SendMessageBatchRequestEntry, id *string) { in.Id = id })
	out, err := s.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(u), Entries: ins})
	var ok []string
	var failed []awssink.Failure
	if err == nil {
		for _, e := range out.Successful {
			ok = append(ok, aws.ToString(e.Id))
		}
		for _, f := range out.Failed {
			failed = append(failed, awssink.Failure{ID: aws.ToString(f.Id), Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault})
		}
	}
	awssink.Settle(ctx, &s.Base, "send to", "sqs queue "+u, es, errs, err, ok, failed)
}
