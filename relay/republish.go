package relay

import (
	"context"
	"errors"
)

// Why a message is published again while the broker may already hold it:
// the reason label of outboxrelay_messages_republished_total and the
// reasons of the republished count in status. A fault the relay cannot see
// past (a kill, a takeover) republishes what the old process published past
// the slot's confirmed position; the new process cannot know those, and they
// are not counted (docs/operations.md, "Duplicates").
const (
	// RepublishedRetry: a retry of a message whose last attempt failed with
	// a retryable error (a timeout, a lost connection), which the broker may
	// have stored before the error came back. A retry after the broker
	// refused the message (a permanent error) is not counted: the broker
	// holds no copy of a message it refused.
	RepublishedRetry = "retry"
	// RepublishedReplay: a message `outboxrelay replay` published again.
	RepublishedReplay = "replay"
	// RepublishedRecover: a message `outboxrelay recover` published again
	// after the slot was lost or re-created; the rows it reads back from
	// the table may or may not have been published before the loss.
	RepublishedRecover = "recover"
)

// RepublishedReasons lists the reasons a running relay counts, so that
// each series can exist from the start at 0. replay and recover are
// commands of their own, which count in status, not in the relay's
// metrics.
var RepublishedReasons = []string{RepublishedRetry}

// publishAgain publishes m, whose last attempt failed, from the retry loop.
func (p *publisher) publishAgain(ctx context.Context, m *Message) {
	p.countAgain(m)
	p.publish(ctx, m)
}

// countAgain counts m republished when it goes to the sink after an
// attempt that the broker may have stored (mayHold). That is the retried
// message itself, and with a pipelining sink the aggregate's messages that
// failed behind it, which go out again once it is settled (pipeline.go).
// Call it before m is handed to the sink: after that m may be settled and
// no longer the relay's.
func (p *publisher) countAgain(m *Message) {
	if h := p.cfg.Hooks.Republished; h != nil && m.Attempts > 0 && mayHold(m.LastError) {
		h(m, RepublishedRetry)
	}
}

// mayHold reports whether the broker may hold a message whose publish
// failed with err: a retryable failure (a timeout, a lost connection)
// may come after the broker stored it. A publish the relay cancelled
// itself (the stream's context, ended by a stop) is given up by the sinks
// before they send it, and a refusal (a permanent error) leaves the broker
// without a copy.
func mayHold(err error) bool {
	return Retryable(err) && !errors.Is(err, context.Canceled)
}
