package nats

import (
	"errors"
	"fmt"
	"strings"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/route"
)

// maxSubjectLen bounds a rendered subject. NATS has no subject limit of its
// own, but the server closes a connection whose protocol line is longer
// than its max_control_line (4 KiB by default); a subject far below that
// keeps one message from taking the connection down.
const maxSubjectLen = 1024

// tokenEscape holds the bytes percent-encoded in values because they would
// change the subject's tokens: '.', '*', '>', '%', and whitespace and
// control bytes.
var tokenEscape = route.EscapeFunc(func(c byte) bool {
	return c <= ' ' || c == 0x7F || c == '.' || c == '*' || c == '>' || c == '%'
})

// template is a parsed subject template.
type template struct {
	route.Template
}

// parseTemplate parses a subject template. Unknown placeholders, unbalanced
// braces and literal text that cannot be part of a publish subject
// (wildcards, whitespace, empty tokens) are errors, so that a configuration
// mistake is reported at start-up rather than once per message.
func parseTemplate(s string) (template, error) {
	if s == "" {
		return template{}, errors.New("subject template is empty")
	}
	t, err := route.Parse(s)
	if err != nil {
		return template{}, fmt.Errorf("subject %w", err) // "subject template ..."
	}
	// Placeholders render to at least one byte of a token in the check:
	// an empty value is the message's problem, not the template's.
	sample := t.Render(&relay.Message{AggregateType: "x", EventType: "x", Table: "x"}, nil)
	if err := checkSubject(sample); err != nil {
		return template{}, fmt.Errorf("subject template %q: %w", s, err)
	}
	return template{t}, nil
}

// render returns m's subject, with an error when it is not a valid publish
// subject.
func (t template) render(m *relay.Message) (string, error) {
	subject := t.Render(m, tokenEscape)
	if err := checkSubject(subject); err != nil {
		return subject, fmt.Errorf("subject template %q for message %s: %w", t.String(), m.ID, err)
	}
	return subject, nil
}

// checkSubject applies the rules of the NATS server for publish subjects:
// not empty, no empty token, no wildcard token, no whitespace; the sink's
// length limit; valid UTF-8; and none of the subjects no row may publish
// to (internalSubject).
func checkSubject(s string) error {
	if err := sinks.CheckDestination("the subject", s); err != nil {
		return err
	}
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
	if whose := internalSubject(s); whose != "" {
		return sinks.Internal("the subject", s, whose)
	}
	return nil
}

// internalSubject says whose subject s is when no row may publish to it,
// and returns "" otherwise: a first token starting with $ is the server's
// ($SYS, $JS.API, which manages streams, $JS.ACK, which acknowledges
// consumers, $KV, $O), and _INBOX is where requesters, the sink's own
// JetStream publishes among them, wait for their replies, so that a
// message there could pass for an acknowledgement.
func internalSubject(s string) string {
	first, _, _ := strings.Cut(s, ".")
	switch {
	case strings.HasPrefix(first, "$"):
		return "the NATS server (a first token starting with $: system, JetStream API and acknowledgement subjects)"
	case first == "_INBOX":
		return "replies to requests (_INBOX), the JetStream acknowledgements among them"
	}
	return ""
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
	tokens := strings.Split(t.Render(&relay.Message{AggregateType: "\x00", EventType: "\x00", Table: "\x00"}, nil), ".")
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
