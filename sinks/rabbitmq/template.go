package rabbitmq

import (
	"fmt"
	"strings"

	"github.com/outboxrelay/outboxrelay/relay"
)

// field is a placeholder of a routing key template.
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
	text  string // for literal segments
}

// template is a parsed routing key template.
type template []segment

// parseTemplate parses s. A placeholder is {name} with one of the names in
// placeholders; any other use of '{' or '}' is an error, so a typo such as
// {aggregatetype} fails at startup instead of publishing to a literal key.
func parseTemplate(s string) (template, error) {
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
			return nil, fmt.Errorf("template %q has a '}' without '{'; placeholders are {aggregate_type}, {event_type} and {table}", s)
		}
		j := strings.IndexAny(rest[i+1:], "{}")
		if j < 0 || rest[i+1+j] == '{' {
			return nil, fmt.Errorf("template %q has an unclosed '{'; placeholders are {aggregate_type}, {event_type} and {table}", s)
		}
		name := rest[i+1 : i+1+j]
		f, ok := placeholders[name]
		if !ok {
			return nil, fmt.Errorf("template %q has unknown placeholder {%s}; use {aggregate_type}, {event_type} or {table}", s, name)
		}
		t = append(t, segment{field: f})
		rest = rest[i+1+j+1:]
	}
	return t, nil
}

// render substitutes m's values into t, each escaped with escapeWord.
func (t template) render(m *relay.Message) string {
	var b strings.Builder
	for _, s := range t {
		switch s.field {
		case literal:
			b.WriteString(s.text)
		case aggregateType:
			escapeWord(&b, m.AggregateType)
		case eventType:
			escapeWord(&b, m.EventType)
		case table:
			escapeWord(&b, m.Table)
		}
	}
	return b.String()
}

// escapeWord writes v percent-encoding the characters that have a meaning
// in topic routing: '.' separates words, '*' and '#' are wildcards in
// bindings, and '%' itself so that the encoding can be reversed. A value
// therefore stays inside the word the template puts it in.
func escapeWord(b *strings.Builder, v string) {
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '.':
			b.WriteString("%2E")
		case '*':
			b.WriteString("%2A")
		case '#':
			b.WriteString("%23")
		case '%':
			b.WriteString("%25")
		default:
			b.WriteByte(c)
		}
	}
}
