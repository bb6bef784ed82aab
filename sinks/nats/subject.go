package nats

import (
	"errors"
	"fmt"
	"strings"

	"github.com/outboxrelay/outboxrelay/relay"
)

// maxSubjectLen bounds a rendered subject. NATS has no subject limit of its
// own, but the server closes a connection whose protocol line is longer
// than its max_control_line (4 KiB by default); a subject far below that
// keeps one message from taking the connection down.
const maxSubjectLen = 1024

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

// template is a parsed subject template.
type template struct {
	segs []segment
	raw  string
}

// parseTemplate parses a subject template. Unknown placeholders, unbalanced
// braces and literal text that cannot be part of a publish subject
// (wildcards, whitespace, empty tokens) are errors, so that a configuration
// mistake is reported at start-up rather than once per message.
func parseTemplate(s string) (template, error) {
	t := template{raw: s}
	rest := s
	for rest != "" {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			t.segs = append(t.segs, segment{text: rest})
			break
		}
		if i > 0 {
			t.segs = append(t.segs, segment{text: rest[:i]})
		}
		if rest[i] == '}' {
			return template{}, fmt.Errorf("subject template %q has a '}' without '{'; placeholders are {aggregate_type}, {event_type} and {table}", s)
		}
		j := strings.IndexAny(rest[i+1:], "{}")
		if j < 0 || rest[i+1+j] == '{' {
			return template{}, fmt.Errorf("subject template %q has an unclosed '{'; placeholders are {aggregate_type}, {event_type} and {table}", s)
		}
		name := rest[i+1 : i+1+j]
		f, ok := placeholders[name]
		if !ok {
			return template{}, fmt.Errorf("subject template %q has unknown placeholder {%s}; use {aggregate_type}, {event_type} or {table}", s, name)
		}
		t.segs = append(t.segs, segment{field: f})
		rest = rest[i+1+j+1:]
	}
	if len(t.segs) == 0 {
		return template{}, errors.New("subject template is empty")
	}
	// Placeholders render to at least one byte of a token in the check:
	// an empty value is the message's problem, not the template's.
	if err := checkSubject(t.sample()); err != nil {
		return template{}, fmt.Errorf("subject template %q: %w", s, err)
	}
	return t, nil
}

// sample renders t with "x" for every placeholder.
func (t template) sample() string {
	var b strings.Builder
	for _, s := range t.segs {
		if s.field == literal {
			b.WriteString(s.text)
		} else {
			b.WriteByte('x')
		}
	}
	return b.String()
}

// render returns m's subject, with an error when it is not a valid publish
// subject.
func (t template) render(m *relay.Message) (string, error) {
	var buf [128]byte
	b := buf[:0]
	for _, s := range t.segs {
		switch s.field {
		case literal:
			b = append(b, s.text...)
		case aggregateType:
			b = appendEscaped(b, m.AggregateType)
		case eventType:
			b = appendEscaped(b, m.EventType)
		case table:
			b = appendEscaped(b, m.Table)
		}
	}
	subject := string(b)
	if err := checkSubject(subject); err != nil {
		return subject, fmt.Errorf("subject template %q for message %s: %w", t.raw, m.ID, err)
	}
	return subject, nil
}

const upperHex = "0123456789ABCDEF"

// appendEscaped appends v percent-encoding the bytes that would change the
// subject's tokens: '.', '*', '>', '%', and whitespace and control bytes.
func appendEscaped(dst []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if needsEscape(c) {
			dst = append(dst, '%', upperHex[c>>4], upperHex[c&0xF])
			continue
		}
		dst = append(dst, c)
	}
	return dst
}

func needsEscape(c byte) bool {
	return c <= ' ' || c == 0x7F || c == '.' || c == '*' || c == '>' || c == '%'
}

// checkSubject applies the rules of the NATS server for publish subjects:
// not empty, no empty token, no wildcard token, no whitespace; and the
// sink's length limit.
func checkSubject(s string) error {
	switch {
	case s == "":
		return errors.New("the subject is empty")
	case len(s) > maxSubjectLen:
		return fmt.Errorf("the subject %.64q... is %d bytes long, over the limit of %d", s, len(s), maxSubjectLen)
	}
	for tok := range strings.SplitSeq(s, ".") {
		switch tok {
		case "":
			return fmt.Errorf("the subject %q has an empty token (an empty value, or '..')", s)
		case "*", ">":
			return fmt.Errorf("the subject %q has the wildcard %q, which cannot be published to", s, tok)
		}
		if i := strings.IndexFunc(tok, func(r rune) bool { return r <= ' ' || r == 0x7F }); i >= 0 {
			return fmt.Errorf("the subject %q contains whitespace or a control character", s)
		}
	}
	return nil
}

// streamSubjects returns the subjects of a stream CreateStream creates for
// t: the literal tokens before the first token with a placeholder followed
// by ">", or, when the first token has one, every token with a placeholder
// as "*" (a stream on ">" would capture every subject of the account).
func (t template) streamSubjects() []string {
	tokens := strings.Split(t.shape(), ".")
	prefix := 0
	for prefix < len(tokens) && tokens[prefix] != "*" {
		prefix++
	}
	switch {
	case prefix == len(tokens):
		return []string{strings.Join(tokens, ".")} // a constant subject
	case prefix > 0:
		return []string{strings.Join(tokens[:prefix], ".") + ".>"}
	default:
		return []string{strings.Join(tokens, ".")}
	}
}

// shape renders t with every token that holds a placeholder as "*".
func (t template) shape() string {
	var b strings.Builder
	for _, s := range t.segs {
		if s.field == literal {
			b.WriteString(s.text)
		} else {
			b.WriteString("\x00")
		}
	}
	tokens := strings.Split(b.String(), ".")
	for i, tok := range tokens {
		if strings.IndexByte(tok, 0) >= 0 {
			tokens[i] = "*"
		}
	}
	return strings.Join(tokens, ".")
}

// subjectMatches reports whether the publish subject (or subject shape with
// "*" tokens) subj is captured by the stream subject filter.
func subjectMatches(filter, subj string) bool {
	ft := strings.Split(filter, ".")
	st := strings.Split(subj, ".")
	for i, f := range ft {
		if f == ">" {
			return len(st) > i
		}
		if i >= len(st) {
			return false
		}
		if f != "*" && f != st[i] {
			return false
		}
	}
	return len(ft) == len(st)
}
