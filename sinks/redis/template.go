package redis

import (
	"errors"
	"fmt"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/route"
)

// template is a parsed stream key template.
type template struct {
	route.Template
}

// parseTemplate parses s; unknown placeholders and unbalanced braces are
// errors, so that a typo fails at start-up instead of writing to a literal
// key.
func parseTemplate(s string) (template, error) {
	if s == "" {
		return template{}, errors.New("the stream key template is empty")
	}
	t, err := route.Parse(s)
	if err != nil {
		return template{}, fmt.Errorf("stream key %w", err) // "stream key template ..."
	}
	if sample := t.Render(&relay.Message{AggregateType: "x", EventType: "x", Table: "x"}, nil); sinks.CheckDestination("redis stream key", sample) != nil {
		return template{}, fmt.Errorf("stream key template %q: %w", s, sinks.CheckDestination("redis stream key", sample))
	}
	return template{t}, nil
}

// render returns m's stream key, with an error when no row may write to
// it (see sinks.CheckDestination: not valid UTF-8, or a name of the
// relay's own). Values go in verbatim: a key is one string to Redis, with
// nothing in it a value could break.
func (t template) render(m *relay.Message) (string, error) {
	key := t.Render(m, nil)
	if err := sinks.CheckDestination("redis stream key", key); err != nil {
		return key, fmt.Errorf("stream key template %q for message %s: %w", t.String(), m.ID, err)
	}
	return key, nil
}
