package nats

import (
	"errors"
	"fmt"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

// ErrClosed is reported for messages whose outcome was still open when the
// sink was closed; it matches sinks.ErrClosed too. It is retryable: the
// relay publishes them again after a restart, and the stream's duplicate
// window drops those already stored.
var ErrClosed = sinks.Closed("nats sink closed before the stream acknowledged the message")

// permanentClient are the errors nats.go returns, before sending, for a
// message no server of this connection would ever take.
var permanentClient = []error{
	natsgo.ErrMaxPayload,          // headers and data over the server's max_payload
	natsgo.ErrBadHeaderMsg,        // a header name NATS cannot carry
	natsgo.ErrBadSubject,          // an invalid subject
	natsgo.ErrInvalidMsg,          // a message nats.go refuses
	natsgo.ErrHeadersNotSupported, // a server without headers, so without Nats-Msg-Id
	jetstream.ErrAsyncPublishReplySubjectSet,
}

// permanent reports whether a publish failure will repeat for this message
// however often it is tried. This is the one place that decides.
//
// JetStream answers a stored message with a PubAck and a refused one with an
// API error carrying an HTTP-like code: 4xx means this message or its
// subject is the problem (message size over max_msg_size, subject captured
// by another stream than Nats-Expected-Stream, header too large), 5xx that
// the server cannot store anything right now (no quorum, insufficient
// resources, store failed). Connection loss, timeouts and no responders are
// retryable: they say nothing about the message.
func permanent(err error) bool {
	var api *jetstream.APIError
	if errors.As(err, &api) {
		return api.Code >= 400 && api.Code < 500
	}
	for _, p := range permanentClient {
		if errors.Is(err, p) {
			return true
		}
	}
	return false
}

// publishError wraps err with the subject, marked relay.Permanent when the
// server will never store the message.
func publishError(subject string, err error) error {
	err = fmt.Errorf("publish to nats subject %q: %w", subject, err)
	if permanent(err) {
		return relay.Permanent(err)
	}
	return err
}
