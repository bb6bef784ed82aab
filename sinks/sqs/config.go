package sqs

import (
	"errors"
	"fmt"
	"strings"

	"github.com/outboxrelay/outboxrelay/sinks/internal/awssink"
	"github.com/outboxrelay/outboxrelay/sinks/route"
)

// MaxMessageBytesLimit is the largest message SQS accepts, 1 MiB.
const MaxMessageBytesLimit = 1 << 20

// Config configures an SQS [Sink]. The zero value of every field means its
// default; QueueURL is required.
type Config struct {
	// QueueURL is the queue's URL, or a template of it whose placeholders
	// ({aggregate_type}, {event_type}, {table}) stand only in the queue
	// name, its last path segment. A name ending in .fifo is a FIFO queue.
	QueueURL string `yaml:"queue_url"`
	// Common is the settings shared with the other AWS sinks.
	awssink.Common `yaml:",inline"`
}

// service is what the shared settings' messages say of this sink.
var service = awssink.Service{Name: "sqs", Title: "SQS", BatchCall: "SendMessageBatch", MaxMessageBytes: MaxMessageBytesLimit, MaxBytesText: "1 MiB", BatchDoc: ""}

// Validate reports every problem with c, each one sentence naming the
// setting to fix.
func (c Config) Validate() error {
	var first error
	if _, err := parseQueueURL(c.QueueURL); err != nil {
		first = fmt.Errorf("sink.sqs.queue_url: %w", err)
	}
	return awssink.Join(first, c.Common.Validate(service))
}

// parseQueueURL parses the queue URL template: an http(s) URL whose
// placeholders stand only in its last path segment, the queue name.
func parseQueueURL(s string) (route.Template, error) {
	if s == "" {
		return route.Template{}, errors.New("is empty; set it to the queue's URL, https://sqs.<region>.amazonaws.com/<account>/<name>")
	}
	if !strings.HasPrefix(s, "https://") && !strings.HasPrefix(s, "http://") {
		return route.Template{}, fmt.Errorf("%q is not an http:// or https:// URL", s)
	}
	t, err := route.Parse(s)
	if err != nil {
		return route.Template{}, err
	}
	if i := strings.IndexByte(s, '{'); i >= 0 && i < strings.LastIndexByte(s, '/') {
		return route.Template{}, fmt.Errorf("%q has a placeholder outside the queue name, its last path segment", s)
	}
	return t, nil
}

// checkQueueName reports why the queue name of a rendered URL is not one
// SQS allows: 1 to 80 letters, digits, - and _, and .fifo for a FIFO queue.
func checkQueueName(u string) error {
	name := u[strings.LastIndexByte(u, '/')+1:]
	base := strings.TrimSuffix(name, ".fifo")
	ok := base != "" && len(name) <= 80
	for i := 0; ok && i < len(base); i++ {
		c := base[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
	}
	if !ok {
		return fmt.Errorf("queue name %q is not one SQS allows (1 to 80 letters, digits, - and _, then .fifo for a FIFO queue); change the row's values or sink.sqs.queue_url", name)
	}
	return nil
}
