package pubsub

import (
	"errors"
	"fmt"
	"strings"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/route"
)

// topicTemplate is a parsed topic id template.
type topicTemplate struct{ route.Template }

func parseTopic(s string) (topicTemplate, error) {
	if s == "" {
		return topicTemplate{}, errors.New("the topic template is empty; set it to a topic id, for example outbox.{aggregate_type}")
	}
	t, err := route.Parse(s)
	if err != nil {
		return topicTemplate{}, fmt.Errorf("topic %w", err)
	}
	if err := checkTopicID(t.Render(&relay.Message{AggregateType: "abc", EventType: "abc", Table: "abc"}, nil)); err != nil {
		return topicTemplate{}, fmt.Errorf("topic template %q: %w", s, err)
	}
	return topicTemplate{t}, nil
}

// render returns m's topic id, with an error when it is not one.
func (t topicTemplate) render(m *relay.Message) (string, error) {
	id := t.Render(m, nil)
	if err := checkTopicID(id); err != nil {
		return id, fmt.Errorf("topic template %q for message %s: %w", t.String(), m.ID, err)
	}
	return id, nil
}

// checkTopicID applies Pub/Sub's rule for resource ids: 3 to 255
// characters, a letter first, then letters, digits and -_.~+%, not
// starting with goog.
func checkTopicID(id string) error {
	if err := sinks.CheckDestination("pubsub topic", id); err != nil {
		return err
	}
	if strings.HasPrefix(strings.ToLower(id), "goog") {
		return sinks.Internal("pubsub topic", id, "Google (ids starting with goog)")
	}
	if len(id) < 3 || len(id) > 255 {
		return fmt.Errorf("pubsub topic id %q has %d characters; Pub/Sub takes 3 to 255", id, len(id))
	}
	for i, c := range []byte(id) {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if i == 0 && !letter {
			return fmt.Errorf("pubsub topic id %q does not start with a letter", id)
		}
		if !letter && !(c >= '0' && c <= '9') && !strings.ContainsRune("-_.~+%", rune(c)) {
			return fmt.Errorf("pubsub topic id %q has %q; Pub/Sub takes letters, digits and -_.~+%%", id, c)
		}
	}
	return nil
}
