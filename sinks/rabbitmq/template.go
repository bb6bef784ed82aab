package rabbitmq

import (
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/route"
)

// wordEscape holds the bytes percent-encoded in values because they have a
// meaning in topic routing: '.' separates words, '*' and '#' are wildcards
// in bindings, and '%' itself so that the encoding can be reversed. A value
// therefore stays inside the word the template puts it in.
var wordEscape = route.EscapeFunc(func(c byte) bool {
	return c == '.' || c == '*' || c == '#' || c == '%'
})

// template is a parsed routing key template.
type template struct {
	route.Template
}

// parseTemplate parses s; see [route.Parse].
func parseTemplate(s string) (template, error) {
	t, err := route.Parse(s)
	return template{t}, err
}

// render substitutes m's values into t, each escaped with wordEscape.
func (t template) render(m *relay.Message) string {
	return t.Render(m, wordEscape)
}
