package redis

import (
	"errors"
	"fmt"

	"github.com/outboxrelay/outboxrelay/relay"
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
	return template{t}, nil
}

// render returns m's stream key. Values go in verbatim: a key is one
// string to Redis, with nothing in it a value could break.
func (t template) render(m *relay.Message) string {
	return t.Render(m, nil)
}
