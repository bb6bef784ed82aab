package envelope

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// Emitted is the content of a table-less outbox message, emitted with
// pg_logical_emit_message(true, 'outboxrelay', '{...}'). Its fields are the
// outbox columns of the same name.
type Emitted struct {
	ID            string // message_id, never empty
	AggregateType string // never empty
	AggregateID   string // never empty
	EventType     string // never empty
	Traceparent   string // "" when absent; not validated, see Trace
	SchemaVersion int    // 1 when absent, else 1 to 2147483647
	// Payload is the payload value as JSON text; it may be null.
	Payload []byte
	// Headers is a JSON object, or nil when absent or null.
	Headers []byte
}

// ParseEmitted parses the content of a table-less outbox message (README
// "Table-less outbox"): a UTF-8 JSON object with the string keys id,
// aggregate_type, aggregate_id and event_type (all required and non-empty),
// payload (required, any JSON value), and optionally headers (an object),
// traceparent (a string) and schema_version (an integer ≥ 1, default 1).
// An optional key set to null counts as absent; unknown keys are ignored so
// that producers can add fields.
//
// On success Payload and Headers are valid UTF-8 JSON, fit to embed in an
// envelope as PayloadJSON and Message.Headers. Otherwise the error is one
// sentence naming the first problem found; the caller dead-letters the
// message with it.
func ParseEmitted(content []byte) (Emitted, error) {
	if !utf8.Valid(content) {
		return Emitted{}, errors.New("message content is not valid UTF-8")
	}
	trimmed := trimSpace(content)
	if len(trimmed) == 0 {
		return Emitted{}, errors.New("message content is empty, want a JSON object")
	}
	if trimmed[0] != '{' {
		if !json.Valid(trimmed) {
			return Emitted{}, errors.New("message content is not valid JSON, want a JSON object")
		}
		return Emitted{}, fmt.Errorf("message content must be a JSON object, got %s", jsonKind(trimmed[0]))
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &fields); err != nil {
		return Emitted{}, fmt.Errorf("message content is not valid JSON: %w", err)
	}

	var e Emitted
	for _, f := range []struct {
		key string
		dst *string
	}{
		{"id", &e.ID},
		{"aggregate_type", &e.AggregateType},
		{"aggregate_id", &e.AggregateID},
		{"event_type", &e.EventType},
	} {
		raw, ok := fields[f.key]
		if !ok {
			return Emitted{}, fmt.Errorf("message content has no %s", f.key)
		}
		if err := json.Unmarshal(raw, f.dst); err != nil || *f.dst == "" {
			return Emitted{}, fmt.Errorf("message content: %s must be a non-empty string, got %s", f.key, describe(raw))
		}
	}

	payload, ok := fields["payload"]
	if !ok {
		return Emitted{}, errors.New("message content has no payload")
	}
	e.Payload = payload

	if raw, ok := fields["headers"]; ok && !isNull(raw) {
		if raw[0] != '{' {
			return Emitted{}, fmt.Errorf("message content: headers must be a JSON object, got %s", jsonKind(raw[0]))
		}
		e.Headers = raw
	}
	if raw, ok := fields["traceparent"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &e.Traceparent); err != nil {
			return Emitted{}, fmt.Errorf("message content: traceparent must be a string, got %s", jsonKind(raw[0]))
		}
	}
	e.SchemaVersion = 1
	if raw, ok := fields["schema_version"]; ok && !isNull(raw) {
		v, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil || v < 1 || v > math.MaxInt32 {
			return Emitted{}, fmt.Errorf("message content: schema_version must be an integer from 1 to %d, got %s", math.MaxInt32, describe(raw))
		}
		e.SchemaVersion = int(v)
	}
	return e, nil
}

func isNull(raw json.RawMessage) bool {
	return bytes.Equal(raw, []byte("null"))
}

// describe names a wrong JSON value for an error message: its text when it
// is short, else its kind.
func describe(raw json.RawMessage) string {
	if len(raw) <= 32 && raw[0] != '{' && raw[0] != '[' {
		return string(raw)
	}
	return jsonKind(raw[0])
}
