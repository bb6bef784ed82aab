package kafka

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/route"
)

// maxTopicLen is Kafka's limit on a topic name's length.
const maxTopicLen = 249

// parseTemplate parses a topic template. It rejects unknown placeholders,
// unbalanced braces, literal text that can never be part of a legal topic
// name and templates that address an internal topic (see internalTopic;
// positions is the exactly-once positions topic), so that a configuration
// mistake is reported at start-up rather than as one dead letter per
// message.
func parseTemplate(s, positions string) (route.Template, error) {
	t, err := route.Parse(s)
	// The Kafka sink words unbalanced braces its own way, as it always has.
	var serr *route.SyntaxError
	switch {
	case errors.As(err, &serr) && serr.Brace == '}':
		return route.Template{}, fmt.Errorf("topic template %q has a '}' without '{'", s)
	case errors.As(err, &serr) && serr.Brace == '{':
		return route.Template{}, fmt.Errorf("topic template %q has a '{' without '}'", s)
	case err != nil:
		return route.Template{}, fmt.Errorf("topic %w", err) // "topic template ..."
	}
	// Rendered with empty values, the template is its literal text.
	lit := string(t.Append(nil, &relay.Message{}, nil))
	for i := 0; i < len(lit); i++ {
		if !legalTopicByte(lit[i]) {
			return route.Template{}, fmt.Errorf("topic template %q contains %s, which no Kafka topic name may contain; use only [a-zA-Z0-9._-] outside placeholders", s, sinks.Char(lit, i))
		}
	}
	if c, ok := t.Constant(); ok {
		if err := checkTopic(c, positions); err != nil {
			return route.Template{}, fmt.Errorf("topic template %q: %w", s, err)
		}
	} else if sample := t.Render(&relay.Message{AggregateType: "x", EventType: "x", Table: "x"}, nil); internalTopic(sample, positions) != "" {
		// Every message would be refused: say so at start-up.
		return route.Template{}, fmt.Errorf("topic template %q: %w", s, checkTopic(sample, positions))
	}
	return t, nil
}

func legalTopicByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == '-'
}

// checkTopic applies Kafka's rule for topic names: 1 to 249 characters of
// [a-zA-Z0-9._-], and neither "." nor "..". The broker rejects anything else
// with INVALID_TOPIC_EXCEPTION, so a message whose topic breaks the rule can
// never be delivered. It also refuses the topics no row may address
// (internalTopic), which the broker would take.
func checkTopic(topic, positions string) error {
	if err := sinks.CheckUTF8("kafka topic name", topic); err != nil {
		return err
	}
	switch {
	case topic == "":
		return fmt.Errorf("kafka topic name is empty")
	case len(topic) > maxTopicLen:
		return fmt.Errorf("kafka topic name %.40q... is %d characters long, over the limit of %d", topic, len(topic), maxTopicLen)
	case topic == "." || topic == "..":
		return fmt.Errorf("kafka topic name %q is not allowed", topic)
	}
	for i := 0; i < len(topic); i++ {
		if !legalTopicByte(topic[i]) {
			return fmt.Errorf("kafka topic name %q contains %s; only [a-zA-Z0-9._-] are allowed", topic, sinks.Char(topic, i))
		}
	}
	if whose := internalTopic(topic, positions); whose != "" {
		return sinks.Internal("kafka topic", topic, whose)
	}
	return nil
}

// internalTopic says whose topic is topic when no row may produce to it:
// the exactly-once positions topic (positions), the relay's own names
// (sinks.InternalPrefix), Kafka's internal topics, whose names start
// with "__" (__consumer_offsets, __transaction_state, __cluster_metadata),
// and _schemas, where a Schema Registry keeps its schemas (its default
// kafkastore.topic): a record there, whose key and value a row can choose
// in the debezium format, would register or replace a schema.
// It returns "" for any other topic.
func internalTopic(topic, positions string) string {
	switch {
	case topic == positions:
		return "the relay's exactly-once positions"
	case strings.HasPrefix(topic, sinks.InternalPrefix):
		return "the relay's own use (names starting with " + sinks.InternalPrefix + ")"
	case strings.HasPrefix(topic, "__"):
		return "Kafka's internal topics (names starting with __)"
	case topic == schemasTopic:
		return "the Schema Registry's store of schemas"
	}
	return ""
}

// schemasTopic is the topic a Schema Registry keeps its schemas in by default.
const schemasTopic = "_schemas"

// maxCachedTopics bounds the topic cache: topics normally follow the handful
// of aggregate types, but a template with {event_type} over free-form event
// types must not grow memory without limit.
const maxCachedTopics = 4096

// topicResult is a rendered topic and, when it is illegal, why.
type topicResult struct {
	topic string
	err   error
	state *topicState // nil for illegal topics and when the cache is full
}

// topicState is what the sink tracks per topic at run time.
type topicState struct {
	// purges counts the purges of the topic from the producer, done when
	// the topic was deleted and recreated (see Sink.produced).
	purges atomic.Uint64
}

// topics renders and checks topics, caching the result per rendered name so
// that the steady state costs neither an allocation nor a validation per
// message. It is safe for concurrent use.
type topics struct {
	tmpl      route.Template
	positions string       // the exactly-once positions topic
	constant  *topicResult // when tmpl is constant

	mu    sync.RWMutex
	cache map[string]topicResult
}

func newTopics(t route.Template, positions string) *topics {
	ts := &topics{tmpl: t, positions: positions, cache: map[string]topicResult{}}
	if c, ok := t.Constant(); ok {
		ts.constant = &topicResult{topic: c, state: new(topicState)}
	}
	return ts
}

// render returns m's topic, with an error when the topic is not a legal
// Kafka topic name.
func (ts *topics) render(m *relay.Message) topicResult {
	if ts.constant != nil && m.RouteDestination == "" {
		return *ts.constant
	}
	var buf [128]byte
	b := ts.tmpl.Append(buf[:0], m, nil)
	ts.mu.RLock()
	r, ok := ts.cache[string(b)] // no allocation: the compiler looks up b in place
	ts.mu.RUnlock()
	if ok {
		return r
	}

	r = topicResult{topic: string(b)}
	if r.err = checkTopic(r.topic, ts.positions); r.err != nil {
		r.err = fmt.Errorf("topic template %q: %w", ts.tmpl.String(), r.err)
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if cached, ok := ts.cache[r.topic]; ok {
		return cached // rendered concurrently
	}
	if len(ts.cache) < maxCachedTopics {
		if r.err == nil {
			r.state = new(topicState)
		}
		ts.cache[r.topic] = r
	}
	return r
}
