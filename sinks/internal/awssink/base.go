package awssink

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/internal/batch"
	"github.com/outboxrelay/outboxrelay/sinks/route"
)

// Prepare is the start of an AWS sink's New: validated is the result of
// its Config's Validate, dest the value of its destination key (destKey)
// and parse that key's parser. It returns c with its defaults, the
// destination template and the AWS configuration.
func Prepare(s Service, validated error, c Common, destKey, dest string, parse func(string) (route.Template, error)) (Common, route.Template, aws.Config, error) {
	if validated != nil {
		return Common{}, route.Template{}, aws.Config{}, validated
	}
	c = c.WithDefaults()
	tmpl, err := parse(dest)
	if err != nil {
		return Common{}, route.Template{}, aws.Config{}, fmt.Errorf("sink.%s.%s: %w", s.Name, destKey, err)
	}
	acfg, err := c.AWSConfig(s)
	if err != nil {
		return Common{}, route.Template{}, aws.Config{}, err
	}
	return c, tmpl, acfg, nil
}

// Base is the part of an sqs or sns Sink the service does not change: its
// log, its destination template, its batch queue and whether the service
// answered the latest request. A Sink embeds it and calls Init in New.
type Base struct {
	Log   *zap.Logger
	Tmpl  route.Template
	Q     *batch.Queue
	ready atomic.Bool
}

// Init sets b up for the sink of s with c's batching: send sends a batch,
// closed is the outcome of the messages still open at Close. A nil log
// means zap.NewNop().
func (b *Base) Init(s Service, c Common, tmpl route.Template, log *zap.Logger, send batch.Send, closed error) {
	if log == nil {
		log = zap.NewNop()
	}
	b.Log, b.Tmpl = log.Named(s.Name), tmpl
	b.Q = batch.New(batch.Options{
		Name: s.Name, MaxInFlight: c.MaxInFlight, Workers: c.MaxConcurrentBatches,
		MaxBatch: c.BatchSize, Linger: c.Linger, Send: send, Closed: closed,
	})
}

// Publish queues m; the sink calls done with m's outcome from Run's
// goroutines once the service has answered m, or before Publish returns
// when ctx ends or the sink is closed first (ctx.Err() or the sink's
// ErrClosed, both retryable). done must not block. Messages of one
// aggregate are sent in the order of the Publish calls, each once the one
// before has been answered.
func (b *Base) Publish(ctx context.Context, m *relay.Message, done func(*relay.Message, error)) {
	b.Q.Publish(ctx, m, done)
}

// Run sends the queued messages until ctx is done or the sink is closed.
func (b *Base) Run(ctx context.Context) error { return b.Q.Run(ctx) }

// Ready reports whether the service answered the latest request; false
// before the first one and after Close.
func (b *Base) Ready() bool { return b.ready.Load() }

// Answer records whether the service answered a request.
func (b *Base) Answer(ok bool) { b.ready.Store(ok && !b.Q.Lifecycle().Stopped()) }

// Close stops Run (after the batches in flight) and reports every queued
// message with the sink's ErrClosed. Every done has been called when it
// returns.
func (b *Base) Close() error {
	if b.Q.Close() {
		b.ready.Store(false)
	}
	return nil
}

// Send is a batch.Send: it builds each message's entry with entry (an
// error is the message's permanent failure), groups the entries with
// Requests and sends each request with send, which sets its entries'
// outcomes in errs.
func Send[T any](ms []*relay.Message, maxBytes int, entry func(*relay.Message) (Entry[T], error), send func(dest string, es []Entry[T], errs []error)) []error {
	errs := make([]error, len(ms))
	var es []Entry[T]
	for i, m := range ms {
		e, err := entry(m)
		if err != nil {
			errs[i] = relay.Permanent(err)
			continue
		}
		e.I = i
		es = append(es, e)
	}
	Requests(es, maxBytes, func(dest string, run []Entry[T]) { send(dest, run, errs) })
	return errs
}

// IDs returns the entries' In with their request ids ("0", "1", ... by
// position in es) set by setID.
func IDs[T any](es []Entry[T], setID func(*T, *string)) []T {
	ins := make([]T, len(es))
	for k, e := range es {
		ins[k] = e.In
		setID(&ins[k], aws.String(strconv.Itoa(k)))
	}
	return ins
}

// Failure is one failed entry of a batch answer.
type Failure struct {
	ID, Code, Message string
	SenderFault       bool
}

// Settle sets in errs the outcome of a batch request to what (the
// destination, "sqs queue <url>") for each of es. When the request failed
// as a whole (err), it is every entry's (RequestOutcome, of verb and
// what); otherwise each of failed is its entry's (EntryOutcome), and an
// entry neither in succeeded (request ids) nor in failed gets an error.
// It records in b whether the service answered.
func Settle[T any](ctx context.Context, b *Base, verb, what string, es []Entry[T], errs []error, err error, succeeded []string, failed []Failure) {
	if err != nil {
		b.Answer(false)
		err = RequestOutcome(ctx, verb+" "+what, err)
		for _, e := range es {
			errs[e.I] = err
		}
		return
	}
	b.Answer(true)
	answered := map[string]bool{}
	for _, id := range succeeded {
		answered[id] = true
	}
	for _, f := range failed {
		if k, err := strconv.Atoi(f.ID); err == nil && k >= 0 && k < len(es) {
			answered[f.ID] = true
			errs[es[k].I] = EntryOutcome(what, f.SenderFault, f.Code, f.Message)
		}
	}
	Answered(what, es, answered, errs)
}

// Probe returns the destination Connect asks about: the template's value
// when it has no placeholder (constant), otherwise a sample rendering,
// which only checks the credentials and the endpoint.
func (b *Base) Probe() (dest string, constant bool) {
	dest, constant = b.Tmpl.Constant()
	if !constant {
		dest = b.Tmpl.Render(&relay.Message{AggregateType: "outboxrelay-probe", EventType: "outboxrelay-probe", Table: "outboxrelay-probe"}, nil)
	}
	return dest, constant
}
