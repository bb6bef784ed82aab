// Package route parses and renders destination templates: the text with
// the placeholders {aggregate_type}, {event_type} and {table} from which a
// sink makes a message's topic, routing key, subject or stream key.
//
// The package knows the placeholders and the template syntax; what a legal
// destination is, and which bytes of a value must be escaped to keep it in
// its place, is each sink's own business.
package route

import (
	"fmt"
	"strings"
	"sync"

	"github.com/outboxrelay/outboxrelay/relay"
)

// field is what a part of a template renders.
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

type part struct {
	field field
	text  string // for literal parts
}

// A Template is a parsed destination template. The zero Template is the
// empty template. A Template is immutable and safe for concurrent use.
type Template struct {
	text  string
	parts []part // nil when text has no placeholder
}

// A SyntaxError is a template that [Parse] rejects: a brace without its
// pair, or a placeholder with an unknown name.
type SyntaxError struct {
	Template string
	// Brace is '{' for a '{' not closed before the next brace or the end,
	// '}' for a '}' without '{', and 0 for an unknown placeholder.
	Brace byte
	// Name is the unknown placeholder's name, without braces.
	Name string
}

func (e *SyntaxError) Error() string {
	switch e.Brace {
	case '}':
		return fmt.Sprintf("template %q has a '}' without '{'; placeholders are {aggregate_type}, {event_type} and {table}", e.Template)
	case '{':
		return fmt.Sprintf("template %q has an unclosed '{'; placeholders are {aggregate_type}, {event_type} and {table}", e.Template)
	}
	return fmt.Sprintf("template %q has unknown placeholder {%s}; use {aggregate_type}, {event_type} or {table}", e.Template, e.Name)
}

// Parse parses s. A placeholder is {aggregate_type}, {event_type} or
// {table}; any other use of '{' or '}' is a [*SyntaxError], so that a typo
// such as {aggregatetype} fails at start-up instead of sending every
// message to a literal destination. The empty string parses to the empty
// template.
func Parse(s string) (Template, error) {
	var parts []part
	placeholder := false
	rest := s
	for rest != "" {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			parts = append(parts, part{text: rest})
			break
		}
		if i > 0 {
			parts = append(parts, part{text: rest[:i]})
		}
		if rest[i] == '}' {
			return Template{}, &SyntaxError{Template: s, Brace: '}'}
		}
		j := strings.IndexAny(rest[i+1:], "{}")
		if j < 0 || rest[i+1+j] == '{' {
			return Template{}, &SyntaxError{Template: s, Brace: '{'}
		}
		name := rest[i+1 : i+1+j]
		f, ok := placeholders[name]
		if !ok {
			return Template{}, &SyntaxError{Template: s, Name: name}
		}
		parts = append(parts, part{field: f})
		placeholder = true
		rest = rest[i+1+j+1:]
	}
	if !placeholder {
		parts = nil
	}
	return Template{text: s, parts: parts}, nil
}

// String returns the template's text, as given to [Parse].
func (t Template) String() string { return t.text }

// Constant returns the destination t renders for every message, and
// whether t has no placeholder and so renders the same for every message.
func (t Template) Constant() (string, bool) { return t.text, t.parts == nil }

// Append appends t rendered for m to dst and returns the extended buffer:
// the literal text as is, and each placeholder's value escaped with esc
// (verbatim when esc is nil).
//
// A message a routing rule routed (m.RouteDestination set) renders that
// route's template instead of t.
func (t Template) Append(dst []byte, m *relay.Message, esc *Escape) []byte {
	if m.RouteDestination != "" {
		t = routeTemplate(m.RouteDestination)
	}
	if t.parts == nil {
		return append(dst, t.text...)
	}
	for _, p := range t.parts {
		switch p.field {
		case literal:
			dst = append(dst, p.text...)
		case aggregateType:
			dst = esc.Append(dst, m.AggregateType)
		case eventType:
			dst = esc.Append(dst, m.EventType)
		case table:
			dst = esc.Append(dst, m.Table)
		}
	}
	return dst
}

// Render returns t rendered for m as [Template.Append] does. A constant
// template costs no allocation and a destination of up to 128 bytes one.
func (t Template) Render(m *relay.Message, esc *Escape) string {
	if t.parts == nil && m.RouteDestination == "" {
		return t.text
	}
	var buf [128]byte
	return string(t.Append(buf[:0], m, esc))
}

// routes are the parsed destination templates of routing rules, by text:
// a configuration has few, and each is parsed once.
var routes sync.Map

// routeTemplate returns the parsed route destination s. The configuration
// check parses every route's destination first, so s parses;
// if it did not, its text is the destination, which the sink then checks.
func routeTemplate(s string) Template {
	if t, ok := routes.Load(s); ok {
		return t.(Template)
	}
	t, err := Parse(s)
	if err != nil {
		t = Template{text: s}
	}
	routes.Store(s, t)
	return t
}

// An Escape is a set of bytes that are percent-encoded in values, as %XX
// with upper-case hex digits, so that a value cannot be read as a separator
// or wildcard of the destination. The set should hold '%' for the encoding
// to be reversible. A nil *Escape encodes nothing.
type Escape struct {
	set [4]uint64 // bit c%64 of set[c/64] for byte c
}

// EscapeFunc returns the set of the bytes c for which in(c) is true.
func EscapeFunc(in func(c byte) bool) *Escape {
	e := new(Escape)
	for c := range 256 {
		if in(byte(c)) {
			e.set[c>>6] |= 1 << (c & 63)
		}
	}
	return e
}

const upperHex = "0123456789ABCDEF"

// Append appends v to dst, percent-encoding the bytes in e.
func (e *Escape) Append(dst []byte, v string) []byte {
	if e == nil {
		return append(dst, v...)
	}
	start := 0
	for i := 0; i < len(v); i++ {
		if c := v[i]; e.set[c>>6]&(1<<(c&63)) != 0 {
			dst = append(dst, v[start:i]...)
			dst = append(dst, '%', upperHex[c>>4], upperHex[c&0xF])
			start = i + 1
		}
	}
	return append(dst, v[start:]...)
}
