package sns

import (
	"errors"
	"fmt"
	"strings"

	"github.com/outboxrelay/outboxrelay/sinks/internal/awssink"
	"github.com/outboxrelay/outboxrelay/sinks/route"
)

// MaxMessageBytesLimit is the largest message SNS accepts, 256 KiB.
const MaxMessageBytesLimit = 256 << 10

// Config configures an SNS [Sink]. The zero value of every field means its
// default; TopicARN is required.
type Config struct {
	// TopicARN is the topic's ARN, or a template of it whose placeholders
	// ({aggregate_type}, {event_type}, {table}) stand only in the topic
	// name, after the last colon. A name ending in .fifo is a FIFO topic.
	TopicARN string `yaml:"topic_arn"`
	// Common is the settings shared with the other AWS sinks.
	awssink.Common `yaml:",inline"`
}

// service is what the shared settings' messages say of this sink.
var service = awssink.Service{Name: "sns", Title: "SNS", BatchCall: "PublishBatch", MaxMessageBytes: MaxMessageBytesLimit, MaxBytesText: "256 KiB", BatchDoc: "1 uses `Publish`"}

// Validate reports every problem with c, each one sentence naming the
// setting to fix.
func (c Config) Validate() error {
	var first error
	if _, err := parseTopicARN(c.TopicARN); err != nil {
		first = fmt.Errorf("sink.sns.topic_arn: %w", err)
	}
	return awssink.Join(first, c.Common.Validate(service))
}

// parseTopicARN parses the topic ARN template: arn:<partition>:sns:
// <region>:<account>:<name>, placeholders only in the name.
func parseTopicARN(s string) (route.Template, error) {
	if s == "" {
		return route.Template{}, errors.New("is empty; set it to the topic's ARN, arn:aws:sns:<region>:<account>:<name>")
	}
	if parts := strings.Split(s, ":"); len(parts) != 6 || parts[0] != "arn" || parts[2] != "sns" {
		return route.Template{}, fmt.Errorf("%q is not an SNS topic ARN, arn:aws:sns:<region>:<account>:<name>", s)
	}
	t, err := route.Parse(s)
	if err != nil {
		return route.Template{}, err
	}
	if i := strings.IndexByte(s, '{'); i >= 0 && i < strings.LastIndexByte(s, ':') {
		return route.Template{}, fmt.Errorf("%q has a placeholder outside the topic name, after the last colon", s)
	}
	return t, nil
}

// checkTopicName reports why the topic name of a rendered ARN is not one
// SNS allows: 1 to 256 letters, digits, - and _, and .fifo for a FIFO
// topic.
func checkTopicName(arn string) error {
	name := arn[strings.LastIndexByte(arn, ':')+1:]
	base := strings.TrimSuffix(name, ".fifo")
	ok := base != "" && len(name) <= 256
	for i := 0; ok && i < len(base); i++ {
		c := base[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
	}
	if !ok {
		return fmt.Errorf("topic name %q is not one SNS allows (1 to 256 letters, digits, - and _, then .fifo for a FIFO topic); change the row's values or sink.sns.topic_arn", name)
	}
	return nil
}
