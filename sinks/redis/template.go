package redis

import (
	"errors"
	"fmt"
	"strings"

	"github.com/outboxrelay/outboxrelay/relay"
)

type field uint8

const (
	literal field = iota
	aggregateType
	eventType
	table
)

var placeholders = map[string]field{
	"aggregate_type": aggregateType,
	"event_type":     eventType,
	"table":          table,
}

type segment struct {
	field field
	text  string
}

// template is a parsed stream key template.
type template []segment

// parseTemplate parses s; unknown placeholders and unbalanced braces are
// errors, so that a typo fails at start-up instead of writing to a literal
// key.
func parseTemplate(s string) (template, error) {
	if s == "" {
		return nil, errors.New("the stream key template is empty")
	}
	var t template
	rest := s
	for rest != "" {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			t = append(t, segment{text: rest})
			break
		}
		if i > 0 {
			t = append(t, segment{text: rest[:i]})
		}
		if rest[i] == '}' {
			return nil, fmt.Errorf("stream key template %q has a '}' without '{'; placeholders are {aggregate_type}, {event_type} and {table}", s)
		}
		j := strings.IndexAny(rest[i+1:], "{}")
		if j < 0 || rest[i+1+j] == '{' {
			return nil, fmt.Errorf("stream key template %q has an unclosed '{'; placeholders are {aggregate_type}, {event_type} and {table}", s)
		}
		name := rest[i+1 : i+1+j]
		f, ok := placeholders[name]
		if !ok {
			return nil, fmt.Errorf("stream key template %q has unknown placeholder {%s}; use {aggregate_type}, {event_type} or {table}", s, name)
		}
		t = append(t, segment{field: f})
		rest = rest[i+1+j+1:]
	}
	return t, nil
}

// render returns m's stream key.
func (t template) render(m *relay.Message) string {
	if len(t) == 1 && t[0].field == literal {
		return t[0].text
	}
	n := 0
	for _, s := range t {
		switch s.field {
		case literal:
			n += len(s.text)
		case aggregateType:
			n += len(m.AggregateType)
		case eventType:
			n += len(m.EventType)
		case table:
			n += len(m.Table)
		}
	}
	var b strings.Builder
	b.Grow(n)
	for _, s := range t {
		switch s.field {
		case literal:
			b.WriteString(s.text)
		case aggregateType:
			b.WriteString(m.AggregateType)
		case eventType:
			b.WriteString(m.EventType)
		case table:
			b.WriteString(m.Table)
		}
	}
	return b.String()
}
