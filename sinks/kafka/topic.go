package kafka

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/outboxrelay/outboxrelay/relay"
)

// maxTopicLen is Kafka's limit on a topic name's length.
const maxTopicLen = 249

// A field is a message field a topic template can refer to.
type field uint8

const (
	fieldNone field = iota // a literal segment
	fieldAggregateType
	fieldEventType
	fieldTable
)

var placeholders = map[string]field{
	"aggregate_type": fieldAggregateType,
	"event_type":     fieldEventType,
	"table":          fieldTable,
}

// segment is a literal or a placeholder of a parsed template.
type segment struct {
	lit   string
	field field
}

// template is a parsed topic template.
type template struct {
	segs []segment
	// constant is the topic when the template has no placeholder.
	constant string
	isConst  bool
}

// parseTemplate parses a topic template. It rejects unknown placeholders,
// unbalanced braces and literal text that can never be part of a legal topic
// name, so that a configuration mistake is reported at start-up rather than
// as one dead letter per message.
func parseTemplate(s string) (template, error) {
	var t template
	rest := s
	for rest != "" {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			t.segs = append(t.segs, segment{lit: rest})
			break
		}
		if i > 0 {
			t.segs = append(t.segs, segment{lit: rest[:i]})
		}
		if rest[i] == '}' {
			return template{}, fmt.Errorf("topic template %q has a '}' without '{'", s)
		}
		end := strings.IndexByte(rest[i:], '}')
		if end < 0 {
			return template{}, fmt.Errorf("topic template %q has a '{' without '}'", s)
		}
		name := rest[i+1 : i+end]
		f, ok := placeholders[name]
		if !ok {
			return template{}, fmt.Errorf("topic template %q has unknown placeholder {%s}; use {aggregate_type}, {event_type} or {table}", s, name)
		}
		t.segs = append(t.segs, segment{field: f})
		rest = rest[i+end+1:]
	}
	for _, sg := range t.segs {
		if sg.field != fieldNone {
			continue
		}
		for j := 0; j < len(sg.lit); j++ {
			if !legalTopicByte(sg.lit[j]) {
				return template{}, fmt.Errorf("topic template %q contains %q, which no Kafka topic name may contain; use only [a-zA-Z0-9._-] outside placeholders", s, sg.lit[j])
			}
		}
	}
	if len(t.segs) == 0 || len(t.segs) == 1 && t.segs[0].field == fieldNone {
		c := ""
		if len(t.segs) == 1 {
			c = t.segs[0].lit
		}
		if err := checkTopic(c); err != nil {
			return template{}, fmt.Errorf("topic template %q: %w", s, err)
		}
		t.constant, t.isConst = c, true
	}
	return t, nil
}

// appendTo appends the topic rendered for m to dst.
func (t *template) appendTo(dst []byte, m *relay.Message) []byte {
	for i := range t.segs {
		switch t.segs[i].field {
		case fieldNone:
			dst = append(dst, t.segs[i].lit...)
		case fieldAggregateType:
			dst = append(dst, m.AggregateType...)
		case fieldEventType:
			dst = append(dst, m.EventType...)
		case fieldTable:
			dst = append(dst, m.Table...)
		}
	}
	return dst
}

func legalTopicByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == '-'
}

// checkTopic applies Kafka's rule for topic names: 1 to 249 characters of
// [a-zA-Z0-9._-], and neither "." nor "..". The broker rejects anything else
// with INVALID_TOPIC_EXCEPTION, so a message whose topic breaks the rule can
// never be delivered.
func checkTopic(topic string) error {
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
			return fmt.Errorf("kafka topic name %q contains %q; only [a-zA-Z0-9._-] are allowed", topic, topic[i])
		}
	}
	return nil
}

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
	raw      string
	tmpl     template
	constant topicResult // when tmpl.isConst

	mu    sync.RWMutex
	cache map[string]topicResult
}

func newTopics(raw string, t template) *topics {
	ts := &topics{raw: raw, tmpl: t, cache: map[string]topicResult{}}
	if t.isConst {
		ts.constant = topicResult{topic: t.constant, state: new(topicState)}
	}
	return ts
}

// render returns m's topic, with an error when the topic is not a legal
// Kafka topic name.
func (ts *topics) render(m *relay.Message) topicResult {
	if ts.tmpl.isConst {
		return ts.constant
	}
	var buf [128]byte
	b := ts.tmpl.appendTo(buf[:0], m)
	ts.mu.RLock()
	r, ok := ts.cache[string(b)] // no allocation: the compiler looks up b in place
	ts.mu.RUnlock()
	if ok {
		return r
	}

	r = topicResult{topic: string(b)}
	if r.err = checkTopic(r.topic); r.err != nil {
		r.err = fmt.Errorf("topic template %q: %w", ts.raw, r.err)
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
