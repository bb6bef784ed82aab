package envelope

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseEmitted(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Emitted
	}{
		{
			`{"id": "0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a", "aggregate_type": "order", "aggregate_id": "42",
			  "event_type": "order.created", "payload": {"total": "99.90"}, "headers": {"tenant": "acme"},
			  "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "schema_version": 3}`,
			Emitted{ID: "0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a", AggregateType: "order", AggregateID: "42",
				EventType: "order.created", Traceparent: validTP, SchemaVersion: 3,
				Payload: []byte(`{"total": "99.90"}`), Headers: []byte(`{"tenant": "acme"}`)},
		},
		{
			`{"id":"1","aggregate_type":"a","aggregate_id":"b","event_type":"c","payload":[1]}`,
			Emitted{ID: "1", AggregateType: "a", AggregateID: "b", EventType: "c", SchemaVersion: 1, Payload: []byte(`[1]`)},
		},
		{
			` {"id":"1","aggregate_type":"a","aggregate_id":"b","event_type":"c","payload":null,
			  "headers":null,"traceparent":null,"schema_version":null,"extra":{"ignored":true}} `,
			Emitted{ID: "1", AggregateType: "a", AggregateID: "b", EventType: "c", SchemaVersion: 1, Payload: []byte(`null`)},
		},
	} {
		got, err := ParseEmitted([]byte(tc.in))
		if err != nil {
			t.Errorf("ParseEmitted(%q): %v", tc.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseEmitted(%q)\n got %+v\nwant %+v", tc.in, got, tc.want)
		}
	}
}

func TestParseEmittedErrors(t *testing.T) {
	const rest = `"aggregate_type":"a","aggregate_id":"b","event_type":"c","payload":{}`
	for _, tc := range []struct{ in, want string }{
		{``, "message content is empty, want a JSON object"},
		{`[1]`, "message content must be a JSON object, got array"},
		{`"x"`, "message content must be a JSON object, got string"},
		{`null`, "message content must be a JSON object, got null"},
		{`{"id":`, "message content is not valid JSON"},
		{`nope`, "message content is not valid JSON, want a JSON object"},
		{"{\"id\":\"\xff\"}", "message content is not valid UTF-8"},
		{`{` + rest + `}`, "message content has no id"},
		{`{"id":"","aggregate_type":"a","aggregate_id":"b","event_type":"c","payload":{}}`, `message content: id must be a non-empty string, got ""`},
		{`{"id":42,` + rest + `}`, "message content: id must be a non-empty string, got 42"},
		{`{"id":null,` + rest + `}`, "message content: id must be a non-empty string, got null"},
		{`{"id":{"a":1},` + rest + `}`, "message content: id must be a non-empty string, got object"},
		{`{"ID":"1",` + rest + `}`, "message content has no id"},
		{`{"id":"1","aggregate_id":"b","event_type":"c","payload":{}}`, "message content has no aggregate_type"},
		{`{"id":"1","aggregate_type":"a","aggregate_id":7,"event_type":"c","payload":{}}`, "message content: aggregate_id must be a non-empty string, got 7"},
		{`{"id":"1","aggregate_type":"a","aggregate_id":"b","payload":{}}`, "message content has no event_type"},
		{`{"id":"1","aggregate_type":"a","aggregate_id":"b","event_type":"c"}`, "message content has no payload"},
		{`{"id":"1",` + rest + `,"headers":[1]}`, "message content: headers must be a JSON object, got array"},
		{`{"id":"1",` + rest + `,"headers":"a=b"}`, "message content: headers must be a JSON object, got string"},
		{`{"id":"1",` + rest + `,"traceparent":1}`, "message content: traceparent must be a string, got number"},
		{`{"id":"1",` + rest + `,"schema_version":0}`, "message content: schema_version must be an integer from 1 to 2147483647, got 0"},
		{`{"id":"1",` + rest + `,"schema_version":1.5}`, "message content: schema_version must be an integer from 1 to 2147483647, got 1.5"},
		{`{"id":"1",` + rest + `,"schema_version":"2"}`, `message content: schema_version must be an integer from 1 to 2147483647, got "2"`},
		{`{"id":"1",` + rest + `,"schema_version":2147483648}`, "message content: schema_version must be an integer from 1 to 2147483647, got 2147483648"},
	} {
		got, err := ParseEmitted([]byte(tc.in))
		if err == nil {
			t.Errorf("ParseEmitted(%q) = %+v, want error %q", tc.in, got, tc.want)
			continue
		}
		if !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("ParseEmitted(%q) error\n got %q\nwant %q", tc.in, err, tc.want)
		}
	}
}

func FuzzParseEmitted(f *testing.F) {
	f.Add([]byte(`{"id":"1","aggregate_type":"a","aggregate_id":"b","event_type":"c","payload":{"x":1},"headers":{"h":"v"},"schema_version":2}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, content []byte) {
		e, err := ParseEmitted(content)
		if err != nil {
			if msg := err.Error(); !strings.HasPrefix(msg, "message content") {
				t.Fatalf("ParseEmitted(%q) error %q", content, msg)
			}
			return
		}
		if e.ID == "" || e.AggregateType == "" || e.AggregateID == "" || e.EventType == "" || e.SchemaVersion < 1 {
			t.Fatalf("ParseEmitted(%q) = %+v: required field empty", content, e)
		}
		if !json.Valid(e.Payload) || !utf8.Valid(e.Payload) {
			t.Fatalf("ParseEmitted(%q): payload %q is not valid UTF-8 JSON", content, e.Payload)
		}
		if e.Headers != nil && (!json.Valid(e.Headers) || e.Headers[0] != '{') {
			t.Fatalf("ParseEmitted(%q): headers %q are not an object", content, e.Headers)
		}
		if _, err := ParseHeaders(e.Headers); err != nil {
			t.Fatalf("ParseEmitted(%q): headers rejected by ParseHeaders: %v", content, err)
		}
		// What ParseEmitted accepts must make a valid envelope.
		m := Message{MessageID: e.ID, EventType: e.EventType, SchemaVersion: e.SchemaVersion,
			AggregateType: e.AggregateType, AggregateID: e.AggregateID, Headers: e.Headers,
			Payload: e.Payload, PayloadFormat: PayloadJSON}
		m.TraceID, m.Traceparent = Trace(e.Traceparent, e.ID)
		checkAgainstReference(t, &m, m.AppendJSON(nil))
	})
}
