package relay

import (
	"slices"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/envelope"
)

// brokerHeaders returns the row headers m carries to the broker and the
// tracestate to send with its traceparent.
//
// A row header whose name the relay owns (envelope.Reserved) is dropped,
// logged and counted (Hooks.ReservedHeaderDropped): it would otherwise repeat or override the relay's own header, and
// consumers that take the first or the last value would see different
// messages. The exception is tracestate: it belongs with the row's
// traceparent, so when the row's traceparent is the one the message
// carries, the row's tracestate header becomes the message's Tracestate;
// with a generated traceparent it would describe another trace, and is
// dropped. The envelope body keeps the row's headers as written.
func (b *Builder) brokerHeaders(m *Message, headers []envelope.Header, rowTraceparent string) ([]envelope.Header, string) {
	var tracestate string
	kept, dropped := envelope.WithoutReserved(headers)
	if len(dropped) == 0 {
		return kept, ""
	}
	if rowTraceparent != "" && m.Traceparent == rowTraceparent {
		for _, h := range headers {
			if h.Key == "tracestate" {
				tracestate = h.Value
			}
		}
		if tracestate != "" {
			dropped = slices.DeleteFunc(dropped, func(k string) bool { return k == "tracestate" })
		}
	}
	if h := b.cfg.Hooks.ReservedHeaderDropped; h != nil {
		for _, name := range dropped {
			h(m, envelope.ReservedAs(name))
		}
	}
	if len(dropped) > 0 {
		b.log.Warn("dropped row headers whose names the relay owns; rename them",
			zap.String("message_id", m.ID), zap.Strings("headers", dropped))
	}
	return kept, tracestate
}
