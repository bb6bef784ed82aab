package envelope

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"testing"
	"time"
	"unicode/utf8"
)

// decoded is what a consumer reads back from an envelope.
type decoded struct {
	MessageID     string          `json:"message_id"`
	EventType     string          `json:"event_type"`
	SchemaVersion int             `json:"schema_version"`
	AggregateType string          `json:"aggregate_type"`
	AggregateID   string          `json:"aggregate_id"`
	OccurredAt    time.Time       `json:"occurred_at"`
	TraceID       string          `json:"trace_id"`
	Traceparent   string          `json:"traceparent"`
	Headers       json.RawMessage `json:"headers"`
	Source        struct {
		Database    string    `json:"database"`
		Table       string    `json:"table"`
		LSN         string    `json:"lsn"`
		CommitLSN   string    `json:"commit_lsn"`
		XID         uint32    `json:"xid"`
		CommittedAt time.Time `json:"committed_at"`
	} `json:"source"`
	Payload       json.RawMessage `json:"payload"`
	PayloadBase64 *string         `json:"payload_base64"`
	ContentType   string          `json:"content_type"`
}

func FuzzAppendJSON(f *testing.F) {
	f.Add("0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a", "order.created", "order", "42", validTP, "shop", "public.outbox",
		uint64(0x1A2B3C4), uint64(0x1A2B400), uint32(1234), int64(1796025600123456789), 1,
		[]byte(`{"tenant": "acme"}`), []byte(`{"order_id": 42}`), uint8(PayloadJSON))
	f.Add("\xff<>&\u2028", "\x00\x1f", "é🚀", "", "bad", "", "", uint64(0), uint64(1<<63), uint32(0), int64(-1), 0,
		[]byte(`[1]`), []byte("\xff\x00binary"), uint8(PayloadBinary))
	f.Fuzz(func(t *testing.T, id, eventType, aggType, aggID, traceparent, database, table string,
		lsn, commitLSN uint64, xid uint32, occurredNanos int64, schemaVersion int,
		headers, payload []byte, format uint8) {
		m := Message{
			MessageID:     id,
			EventType:     eventType,
			SchemaVersion: schemaVersion,
			AggregateType: aggType,
			AggregateID:   aggID,
			OccurredAt:    time.Unix(0, occurredNanos).In(time.FixedZone("", int(occurredNanos%50000))),
			Headers:       headers,
			Source: Source{Database: database, Table: table, LSN: lsn, CommitLSN: commitLSN, XID: xid,
				CommittedAt: time.Unix(0, occurredNanos/3)},
			Payload:       payload,
			PayloadFormat: PayloadFormat(format % 4),
		}
		// Keep to the preconditions the caller guarantees: headers are an
		// object, a PayloadJSON payload is valid UTF-8 JSON.
		if trimmed := bytes.Trim(headers, jsonSpace); len(trimmed) > 0 &&
			(trimmed[0] != '{' || !json.Valid(trimmed) || !utf8.Valid(trimmed)) {
			m.Headers = nil
		}
		if m.PayloadFormat == PayloadJSON && len(bytes.Trim(payload, jsonSpace)) > 0 && !isJSON(payload) {
			m.PayloadFormat = PayloadBinary
		}
		m.TraceID, m.Traceparent = Trace(traceparent, id)

		got := m.AppendJSON([]byte("x"))[1:]
		checkAgainstReference(t, &m, got)

		var d decoded
		if err := json.Unmarshal(got, &d); err != nil {
			t.Fatalf("decode %q: %v", got, err)
		}
		for _, f := range []struct{ got, sent string }{
			{d.MessageID, id}, {d.EventType, eventType}, {d.AggregateType, aggType}, {d.AggregateID, aggID},
			{d.Source.Database, database}, {d.Source.Table, table}, {d.Traceparent, m.Traceparent},
			{d.TraceID, m.TraceID}, {d.Source.LSN, FormatLSN(lsn)}, {d.Source.CommitLSN, FormatLSN(commitLSN)},
		} {
			if f.got != perByteValidUTF8(f.sent) {
				t.Fatalf("field decoded as %q, sent %q", f.got, f.sent)
			}
		}
		if d.SchemaVersion != schemaVersion || d.Source.XID != xid {
			t.Fatalf("numbers decoded as %d, %d; sent %d, %d", d.SchemaVersion, d.Source.XID, schemaVersion, xid)
		}
		if !d.OccurredAt.Equal(m.OccurredAt.Truncate(time.Microsecond)) ||
			!d.Source.CommittedAt.Equal(m.Source.CommittedAt.Truncate(time.Microsecond)) {
			t.Fatalf("times decoded as %v, %v; sent %v, %v", d.OccurredAt, d.Source.CommittedAt,
				m.OccurredAt, m.Source.CommittedAt)
		}
		if d.PayloadBase64 != nil {
			if m.PayloadFormat == PayloadJSON || isJSON(payload) || d.Payload != nil {
				t.Fatalf("payload %q sent as base64", payload)
			}
			raw, err := base64.StdEncoding.DecodeString(*d.PayloadBase64)
			if err != nil || !bytes.Equal(raw, payload) {
				t.Fatalf("payload_base64 decodes to %q, %v; sent %q", raw, err, payload)
			}
			return
		}
		if len(bytes.Trim(payload, jsonSpace)) == 0 {
			if string(d.Payload) != "null" {
				t.Fatalf("empty payload decoded as %q", d.Payload)
			}
			return
		}
		if !bytes.Equal(d.Payload, bytes.Trim(payload, jsonSpace)) {
			t.Fatalf("payload decoded as %q, sent %q", d.Payload, payload)
		}
	})
}
