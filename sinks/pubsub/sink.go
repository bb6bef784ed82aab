package pubsub

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"cloud.google.com/go/auth/credentials"
	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"go.uber.org/zap"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

var (
	_ relay.Sink      = (*Sink)(nil)
	_ sinks.Connector = (*Sink)(nil)
)

// ErrClosed is reported for messages published after Close; it matches
// sinks.ErrClosed too. It is retryable.
var ErrClosed = sinks.Closed("pubsub sink closed")

// Limits Pub/Sub sets on a message.
const (
	maxMessageBytes   = 10_000_000
	maxAttributes     = 100
	maxAttributeKey   = 256
	maxAttributeValue = 1024
	maxOrderingKey    = 1024
)

// Sink publishes relay messages to Pub/Sub topics. Create it with New,
// optionally call Connect, and Close it. It is safe for concurrent use.
type Sink struct {
	cfg    Config
	log    *zap.Logger
	topic  topicTemplate
	client *pubsub.Client

	slots chan struct{} // one per message published and not yet answered
	quit  chan struct{} // closed by Close
	wg    sync.WaitGroup

	mu     sync.Mutex                   // guards the fields below; orders Publish against Close
	pubs   map[string]*pubsub.Publisher // by topic id
	paused map[orderingKey]bool         // keys whose publisher paused after a failure
	closed bool

	ready atomic.Bool
}

type orderingKey struct{ topic, key string }

// New checks cfg, applies its defaults and creates the Pub/Sub client,
// which connects lazily. A nil log means zap.NewNop().
func New(cfg Config, log *zap.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	tt, err := parseTopic(cfg.Topic)
	if err != nil {
		return nil, fmt.Errorf("sink.pubsub.topic: %w", err)
	}
	if log == nil {
		log = zap.NewNop()
	}
	var opts []option.ClientOption
	if cfg.CredentialsFile != "" {
		opts = append(opts, option.WithAuthCredentialsFile(option.ServiceAccount, cfg.CredentialsFile))
	}
	if cfg.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(cfg.Endpoint))
	}
	if cfg.CredentialsFile == "" && os.Getenv("PUBSUB_EMULATOR_HOST") == "" {
		// Found now, or the first publish would be the first to say so.
		if _, err := credentials.DetectDefault(&credentials.DetectOptions{Scopes: []string{"https://www.googleapis.com/auth/pubsub"}}); err != nil {
			return nil, noCredentials(err)
		}
	}
	client, err := pubsub.NewClient(context.Background(), cfg.Project, opts...)
	if err != nil {
		if strings.Contains(err.Error(), "credentials") {
			return nil, noCredentials(err)
		}
		return nil, fmt.Errorf("create the Pub/Sub client: %w", err)
	}
	return &Sink{
		cfg: cfg, log: log.Named("pubsub"), topic: tt, client: client,
		slots:  make(chan struct{}, cfg.MaxInFlight),
		quit:   make(chan struct{}),
		pubs:   map[string]*pubsub.Publisher{},
		paused: map[orderingKey]bool{},
	}, nil
}

// Connect asks Pub/Sub for the topic (for a topic template, for the
// project's topics) once, so that an unreachable service, refused
// credentials or a missing topic at start is one clear error. It is
// optional. ctx bounds the attempt, as does Config.Timeout.
func (s *Sink) Connect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var err error
	name := "projects/" + s.cfg.Project
	if id, ok := s.topic.Constant(); ok {
		name += "/topics/" + id
		_, err = s.client.TopicAdminClient.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: name})
	} else {
		_, err = s.client.TopicAdminClient.ListTopics(ctx, &pubsubpb.ListTopicsRequest{Project: name, PageSize: 1}).Next()
		if errors.Is(err, iterator.Done) {
			err = nil
		}
	}
	if err != nil {
		s.ready.Store(false)
		switch status.Code(err) {
		case codes.NotFound:
			return fmt.Errorf("pubsub %s does not exist; create it, or check sink.pubsub.project and sink.pubsub.topic", name)
		case codes.PermissionDenied, codes.Unauthenticated:
			return fmt.Errorf("pubsub refused the credentials for %s (%v); check sink.pubsub.credentials_file and the account's roles (roles/pubsub.publisher, and roles/pubsub.viewer for this check)", name, err)
		}
		if strings.Contains(err.Error(), "credentials") {
			return noCredentials(err)
		}
		return fmt.Errorf("cannot reach pubsub for %s (%v); check sink.pubsub.endpoint (or PUBSUB_EMULATOR_HOST) and the network", name, err)
	}
	s.mu.Lock()
	s.ready.Store(!s.closed)
	s.mu.Unlock()
	return nil
}

func noCredentials(err error) error {
	return fmt.Errorf("no Google credentials to publish with (%v); set sink.pubsub.credentials_file or GOOGLE_APPLICATION_CREDENTIALS, or PUBSUB_EMULATOR_HOST for the emulator", err)
}

// Publish publishes m; done is called exactly once, from a goroutine of the
// sink once Pub/Sub has answered, or before Publish returns when m cannot
// be published (a permanent error), ctx ends or the sink is closed first
// (ctx.Err() or ErrClosed, both retryable). Publish blocks while
// Config.MaxInFlight messages are unanswered. Messages of one aggregate
// reach a topic in the order of the Publish calls.
func (s *Sink) Publish(ctx context.Context, m *relay.Message, done func(*relay.Message, error)) {
	if err := ctx.Err(); err != nil {
		done(m, err)
		return
	}
	topic, err := s.topic.render(m)
	m.Destination = topic
	if err != nil {
		done(m, relay.Permanent(err))
		return
	}
	msg, err := message(m)
	if err != nil {
		done(m, relay.Permanent(err))
		return
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		done(m, ctx.Err())
		return
	case <-s.quit:
		done(m, ErrClosed)
		return
	}
	key := orderingKey{topic, msg.OrderingKey}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.slots
		done(m, ErrClosed)
		return
	}
	p := s.pubs[topic]
	if p == nil {
		p = s.client.Publisher(topic)
		p.EnableMessageOrdering = true
		p.PublishSettings.Timeout = s.cfg.Timeout
		s.pubs[topic] = p
	}
	if s.paused[key] {
		// The message before this one of the aggregate failed and has been
		// reported: this is its retry, or the next one after it was
		// dead-lettered. Every message queued behind the failure has
		// failed with it, so none can overtake it.
		p.ResumePublish(key.key)
		delete(s.paused, key)
	}
	res := p.Publish(ctx, msg)
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		<-res.Ready()
		_, err := res.Get(context.Background())
		err = s.outcome(m, key, err)
		<-s.slots
		done(m, err)
	}()
}

// outcome maps Pub/Sub's answer to m's outcome and records a paused
// ordering key. This is the one place that decides what is retried.
func (s *Sink) outcome(m *relay.Message, key orderingKey, err error) error {
	if err == nil {
		s.ready.Store(true)
		return nil
	}
	if key.key != "" {
		s.mu.Lock()
		s.paused[key] = true
		s.mu.Unlock()
	}
	var paused pubsub.ErrPublishingPaused
	switch code := status.Code(err); {
	case errors.As(err, &paused):
		return fmt.Errorf("not published to pubsub topic %s: a message of aggregate %s before it failed", key.topic, m.AggregateID)
	case errors.Is(err, pubsub.ErrPublisherStopped):
		return ErrClosed
	case code == codes.InvalidArgument:
		return relay.Permanent(fmt.Errorf("pubsub topic %s refused message %s: %w", key.topic, m.ID, err))
	case code == codes.Unavailable || code == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded):
		s.ready.Store(false)
	}
	return fmt.Errorf("publish to pubsub topic %s: %w", key.topic, err)
}

// binding is how Pub/Sub carries the relay's headers: as attributes, with
// the CloudEvents Pub/Sub binding's ce- prefix.
var binding = sinks.PubSub

// message returns the Pub/Sub message for m, or why Pub/Sub could never
// accept it.
func message(m *relay.Message) (*pubsub.Message, error) {
	var own [16]envelope.Header
	hs, _ := binding.Headers(own[:0], m)
	if len(hs) > maxAttributes {
		return nil, fmt.Errorf("message %s has %d headers; Pub/Sub takes at most %d attributes", m.ID, len(hs), maxAttributes)
	}
	attrs := make(map[string]string, len(hs))
	size := len(m.Envelope) + len(m.AggregateID)
	for _, h := range hs {
		switch {
		case h.Key == "" || len(h.Key) > maxAttributeKey:
			return nil, fmt.Errorf("message %s: header name %.40q has %d bytes; Pub/Sub takes 1 to %d", m.ID, h.Key, len(h.Key), maxAttributeKey)
		case len(h.Value) > maxAttributeValue:
			return nil, fmt.Errorf("message %s: header %s has %d bytes; Pub/Sub takes at most %d", m.ID, h.Key, len(h.Value), maxAttributeValue)
		case strings.HasPrefix(strings.ToLower(h.Key), "goog"):
			return nil, fmt.Errorf("message %s: header %s starts with goog, which Pub/Sub reserves", m.ID, h.Key)
		}
		if err := sinks.CheckUTF8("header name "+h.Key, h.Key); err != nil {
			return nil, fmt.Errorf("message %s: %w", m.ID, err)
		}
		if err := sinks.CheckUTF8("header "+h.Key, h.Value); err != nil {
			return nil, fmt.Errorf("message %s: %w", m.ID, err)
		}
		if _, dup := attrs[h.Key]; dup {
			return nil, fmt.Errorf("message %s: header %s appears twice; a Pub/Sub attribute has one value", m.ID, h.Key)
		}
		attrs[h.Key] = h.Value
		size += len(h.Key) + len(h.Value)
	}
	if len(m.AggregateID) > maxOrderingKey {
		return nil, fmt.Errorf("message %s: aggregate_id has %d bytes; a Pub/Sub ordering key takes at most %d", m.ID, len(m.AggregateID), maxOrderingKey)
	}
	if err := sinks.CheckUTF8("aggregate_id", m.AggregateID); err != nil {
		return nil, fmt.Errorf("message %s: %w", m.ID, err)
	}
	if size > maxMessageBytes {
		return nil, fmt.Errorf("message %s has %d bytes; Pub/Sub takes at most %d", m.ID, size, maxMessageBytes)
	}
	return &pubsub.Message{Data: m.Envelope, Attributes: attrs, OrderingKey: m.AggregateID}, nil
}

// Ready reports whether Pub/Sub answered the latest publish (or the probe
// of Connect) as reachable; false before Connect, while publishes time
// out or find the service unavailable, and after Close.
func (s *Sink) Ready() bool { return s.ready.Load() }

// Close stops publishing: it sends what the publishers hold, waits for
// every answer, reports each message and closes the client. Publish calls
// after Close report ErrClosed. Close is idempotent.
func (s *Sink) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.ready.Store(false)
	close(s.quit)
	pubs := s.pubs
	s.mu.Unlock()
	for _, p := range pubs {
		p.Stop()
	}
	s.wg.Wait()
	if err := s.client.Close(); err != nil {
		return fmt.Errorf("close the pubsub client: %w", err)
	}
	return nil
}
