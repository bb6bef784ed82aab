package sns

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/aws/smithy-go"
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
var ErrClosed = sinks.Closed("sns sink closed before SNS answered the message")

// Sink publishes relay messages to an SNS topic with PublishBatch (or
// Publish, with a batch size of 1). Create it with New, optionally call
// Connect, run Run for as long as it relays and Close it. It is safe for
// concurrent use.
type Sink struct {
	awssink.Base
	cfg    Config
	client *sns.Client
}

// New checks cfg, applies its defaults and returns a Sink. It neither
// connects nor starts goroutines. A nil log means zap.NewNop().
func New(cfg Config, log *zap.Logger) (*Sink, error) {
	common, tmpl, acfg, err := awssink.Prepare(service, cfg.Validate(), cfg.Common, "topic_arn", cfg.TopicARN, parseTopicARN)
	if err != nil {
		return nil, err
	}
	cfg.Common = common
	s := &Sink{cfg: cfg, client: sns.NewFromConfig(acfg)}
	s.Init(service, common, tmpl, log, s.send, ErrClosed)
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
	arn, constant := s.Probe()
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
		s.Log.Warn("the SNS endpoint answered the probe with an error; taking it as reachable", zap.Error(err))
		err = nil
	}
	if err != nil {
		s.Answer(false)
		return fmt.Errorf("cannot reach the SNS topic %s (%w); check sink.sns.topic_arn, region, endpoint and the credentials", arn, err)
	}
	s.Answer(true)
	return nil
}

type entry = awssink.Entry[types.PublishBatchRequestEntry]

// send is the queue's Send: the messages' entries, grouped by topic, in
// requests of at most MaxMessageBytes in all, one outcome per message.
func (s *Sink) send(ctx context.Context, ms []*relay.Message) []error {
	return awssink.Send(ms, s.cfg.MaxMessageBytes, s.entry, func(arn string, es []entry, errs []error) {
		if s.cfg.BatchSize == 1 {
			for _, e := range es {
				errs[e.I] = s.publishOne(ctx, arn, e.In)
			}
			return
		}
		s.publishBatch(ctx, arn, es, errs)
	})
}

// entry builds m's batch entry.
func (s *Sink) entry(m *relay.Message) (entry, error) {
	arn := s.Tmpl.Render(m, nil)
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
		s.Answer(true)
		return nil
	}
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorFault() != smithy.FaultServer && (ae.ErrorCode() == "InvalidParameter" || ae.ErrorCode() == "InvalidParameterValue" || ae.ErrorCode() == "ParameterValueInvalid") {
		return awssink.EntryOutcome("sns topic "+arn, true, ae.ErrorCode(), ae.ErrorMessage())
	}
	s.Answer(false)
	return awssink.RequestOutcome(ctx, "publish to sns topic "+arn, err)
}

// publishBatch publishes es to the topic arn in one PublishBatch and sets
// each one's outcome in errs.
func (s *Sink) publishBatch(ctx context.Context, arn string, es []entry, errs []error) {
	ins := awssink.IDs(es, func(in *types.PublishBatchRequestEntry, id *string) { in.Id = id })
	out, err := s.client.PublishBatch(ctx, &sns.PublishBatchInput{TopicArn: aws.String(arn), PublishBatchRequestEntries: ins})
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
	awssink.Settle(ctx, &s.Base, "publish to", "sns topic "+arn, es, errs, err, ok, failed)
}
