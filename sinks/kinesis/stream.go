package kinesis

import (
	"errors"
	"fmt"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/route"
)

// streamTemplate is a parsed stream name template.
type streamTemplate struct{ route.Template }

func parseStream(s string) (streamTemplate, error) {
	if s == "" {
		return streamTemplate{}, errors.New("the stream template is empty; set it to a stream name, for example outbox-{aggregate_type}")
	}
	t, err := route.Parse(s)
	if err != nil {
		return streamTemplate{}, fmt.Errorf("stream %w", err)
	}
	if err := checkStreamName(t.Render(&relay.Message{AggregateType: "x", EventType: "x", Table: "x"}, nil)); err != nil {
		return streamTemplate{}, fmt.Errorf("stream template %q: %w", s, err)
	}
	return streamTemplate{t}, nil
}

// render returns m's stream name, with an error when it is not one.
func (t streamTemplate) render(m *relay.Message) (string, error) {
	name := t.Render(m, nil)
	if err := checkStreamName(name); err != nil {
		return name, fmt.Errorf("stream template %q for message %s: %w", t.String(), m.ID, err)
	}
	return name, nil
}

// checkStreamName applies Kinesis's rule for stream names: 1 to 128 of
// letters, digits, _, . and -.
func checkStreamName(name string) error {
	if err := sinks.CheckDestination("kinesis stream", name); err != nil {
		return err
	}
	if len(name) < 1 || len(name) > 128 {
		return fmt.Errorf("kinesis stream name %q has %d characters; Kinesis takes 1 to 128", name, len(name))
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return fmt.Errorf("kinesis stream name %q has %q; Kinesis takes letters, digits, _, . and -", name, c)
		}
	}
	return nil
}
