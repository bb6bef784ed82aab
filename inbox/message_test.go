package inbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The relay's golden envelopes (envelope/testdata in the relay's module)
// are what the inbox must read: the same message in the four formats.
const goldenDir = "../envelope/testdata"

func golden(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(goldenDir, name+".golden"))
	if err != nil {
		t.Fatalf("read the relay's golden file: %v", err)
	}
	return bytes.TrimSuffix(b, []byte("\n"))
}

// debeziumRaw reads a debezium golden file ("key: ", "header id: ",
// "content-type: " lines, a blank line, the body) as a Kafka record.
func debeziumRaw(t *testing.T, name string) Raw {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(goldenDir, "debezium_"+name+".golden"))
	if err != nil {
		t.Fatal(err)
	}
	head, body, ok := bytes.Cut(b, []byte("\n\n"))
	if !ok {
		t.Fatalf("debezium_%s.golden has no blank line", name)
	}
	body = bytes.TrimSuffix(body, []byte("\n")) // the golden writer's own newline
	raw := Raw{Value: body, Headers: map[string]string{"event_type": "order.created"}}
	for _, line := range strings.Split(string(head), "\n") {
		switch {
		case strings.HasPrefix(line, "key: "):
			raw.Key = []byte(strings.TrimPrefix(line, "key: "))
		case strings.HasPrefix(line, "header id: "):
			raw.Headers["id"] = strings.TrimPrefix(line, "header id: ")
		case strings.HasPrefix(line, "content-type: "):
			raw.Headers["content-type"] = strings.TrimPrefix(line, "content-type: ")
		}
	}
	return raw
}

// binaryRaw reads a cloudevents_binary golden file (one attribute per line)
// as a Kafka record with prefix, the body being the debezium case's body
// (the payload as stored, in both formats).
func binaryRaw(t *testing.T, name, prefix string) Raw {
	t.Helper()
	raw := Raw{Value: debeziumRaw(t, name).Value, Headers: map[string]string{}}
	for _, line := range strings.Split(string(golden(t, "cloudevents_binary_"+name)), "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if !ok {
			t.Fatalf("cloudevents_binary_%s.golden: line %q", name, line)
		}
		if k == "datacontenttype" {
			raw.Headers["content-type"] = v
		} else {
			raw.Headers[prefix+k] = v
		}
	}
	return raw
}

var goldenTime = time.Date(2026, 11, 29, 8, 0, 0, 123456000, time.UTC)

const (
	goldenID          = "0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a"
	goldenTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
)

func TestDecodeEnvelopeGolden(t *testing.T) {
	for _, f := range []Format{FormatAuto, FormatEnvelope} {
		m, err := Decode(f, Raw{Value: golden(t, "jsonb_payload")})
		if err != nil {
			t.Fatal(err)
		}
		want := Message{ID: goldenID, AggregateType: "order", AggregateID: "42", EventType: "order.created",
			SchemaVersion: 1, OccurredAt: goldenTime, Traceparent: goldenTraceparent, ContentType: "application/json",
			Format: FormatEnvelope}
		checkMessage(t, m, want, `{"order_id": 42, "total": "99.90"}`)
		if m.Headers["tenant"] != "acme" || len(m.Headers) != 1 {
			t.Errorf("headers = %v, want tenant=acme", m.Headers)
		}
		wantSrc := Source{Database: "shop", Table: "public.outbox", LSN: "0/1A2B3C4", CommitLSN: "0/1A2B400", XID: 1234,
			CommittedAt: time.Date(2026, 11, 29, 8, 0, 0, 130001000, time.UTC)}
		if m.Source != wantSrc {
			t.Errorf("source = %+v, want %+v", m.Source, wantSrc)
		}
	}

	m, err := Decode(FormatEnvelope, Raw{Value: golden(t, "bytea_binary")})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.Payload, []byte{0x00, 0x01, 0xfe, 0xff, 'x'}) || m.ContentType != "application/octet-stream" {
		t.Errorf("bytea payload = %q %q", m.Payload, m.ContentType)
	}
	m, err = Decode(FormatEnvelope, Raw{Value: golden(t, "empty_headers_null_payload")})
	if err != nil {
		t.Fatal(err)
	}
	if m.Payload != nil || len(m.Headers) != 0 {
		t.Errorf("null payload = %q, headers %v; want none", m.Payload, m.Headers)
	}
	m, err = Decode(FormatEnvelope, Raw{Value: golden(t, "headers_values")})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"tenant": "acme", "retries": "3", "sampled": "true", "none": "null", "flags": `{"a": [1, 2]}`} {
		if m.Headers[k] != v {
			t.Errorf("header %s = %q, want %q (non-strings as their JSON text)", k, m.Headers[k], v)
		}
	}
}

// TestDecodeFormatsAgree decodes each golden case in the three formats
// besides the envelope and checks they give the same message.
func TestDecodeFormatsAgree(t *testing.T) {
	for _, name := range []string{"jsonb", "bytea_binary", "text_json", "text_not_json", "unicode", "minimal"} {
		t.Run(name, func(t *testing.T) {
			structured, err := Decode(FormatAuto, Raw{Value: golden(t, "cloudevents_"+name)})
			if err != nil {
				t.Fatal(err)
			}
			if structured.Format != FormatCloudEvents {
				t.Fatalf("structured detected as %v", structured.Format)
			}
			if structured.ID == "" || !structured.OccurredAt.Equal(goldenTime) || structured.Source.URI != "/outboxrelay/shop" {
				t.Errorf("structured = %+v", structured)
			}
			for _, prefix := range []string{"ce_", "ce-", "cloudEvents:"} {
				binary, err := Decode(FormatAuto, binaryRaw(t, name, prefix))
				if err != nil {
					t.Fatalf("%s: %v", prefix, err)
				}
				if binary.Format != FormatCloudEventsBinary {
					t.Fatalf("%s: binary detected as %v", prefix, binary.Format)
				}
				want := structured
				want.Format, want.Headers = binary.Format, binary.Headers
				checkMessage(t, binary, want, string(structured.Payload))
			}
			dbz, err := Decode(FormatAuto, debeziumRaw(t, name))
			if name == "unicode" {
				// Its id header is the id as the golden case stores it,
				// invalid UTF-8 (which the JSON formats replace): no
				// PostgreSQL text column holds it, so the inbox could not
				// record it, and it is undecodable.
				if !errors.Is(err, ErrUndecodable) || !strings.Contains(err.Error(), "message id") {
					t.Fatalf("debezium with an id that is not UTF-8: %v, want undecodable for its message id", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if dbz.Format != FormatDebezium {
				t.Fatalf("debezium detected as %v", dbz.Format)
			}
			// Debezium carries no time, version, trace or source.
			want := Message{ID: debeziumRaw(t, name).Headers["id"], AggregateID: structured.AggregateID, EventType: "order.created",
				ContentType: structured.ContentType, Format: FormatDebezium}
			checkMessage(t, dbz, want, string(structured.Payload))
		})
	}
}

func checkMessage(t *testing.T, got, want Message, payload string) {
	t.Helper()
	if string(got.Payload) != payload {
		t.Errorf("payload = %q, want %q", got.Payload, payload)
	}
	if got.ID != want.ID || got.AggregateType != want.AggregateType || got.AggregateID != want.AggregateID ||
		got.EventType != want.EventType || got.SchemaVersion != want.SchemaVersion || !got.OccurredAt.Equal(want.OccurredAt) ||
		got.Traceparent != want.Traceparent || got.ContentType != want.ContentType || got.Format != want.Format {
		t.Errorf("decoded\n %+v\nwant\n %+v", got, want)
	}
}

func TestDecodeRowHeadersWithoutReserved(t *testing.T) {
	raw := binaryRaw(t, "jsonb", "ce_")
	raw.Headers["tenant"] = "acme"
	raw.Headers["message_id"] = raw.Headers["ce_id"]
	raw.Headers["x-outboxrelay-publish-tag"] = "7"
	m, err := Decode(FormatCloudEventsBinary, raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Headers) != 1 || m.Headers["tenant"] != "acme" {
		t.Errorf("row headers = %v, want only tenant", m.Headers)
	}
}

func TestDecodeErrors(t *testing.T) {
	for name, raw := range map[string]Raw{
		"not JSON":       {Value: []byte("hello")},
		"no id":          {Value: []byte(`{"envelope_version":1,"event_type":"x"}`)},
		"newer envelope": {Value: []byte(`{"envelope_version":2,"message_id":"a"}`)},
		"no version":     {Value: []byte(`{"message_id":"a"}`)},
		"bad time":       {Value: []byte(`{"envelope_version":1,"message_id":"a","occurred_at":"yesterday"}`)},
		"bad base64":     {Value: []byte(`{"envelope_version":1,"message_id":"a","payload_base64":"!!"}`)},
		"ce version":     {Value: []byte(`{"specversion":"0.3","id":"a"}`)},
		"binary no id":   {Value: []byte("{}"), Headers: map[string]string{"ce_specversion": "1.0"}},
		"debezium empty": {Value: []byte("{}"), Headers: map[string]string{"id": ""}},
	} {
		_, err := Decode(FormatAuto, raw)
		if !errors.Is(err, ErrUndecodable) {
			t.Errorf("%s: err = %v, want ErrUndecodable", name, err)
		}
	}
}

func TestEnvelopeOfRoundTrips(t *testing.T) {
	m, err := Decode(FormatEnvelope, Raw{Value: golden(t, "jsonb_payload")})
	if err != nil {
		t.Fatal(err)
	}
	again, err := Decode(FormatAuto, Raw{Value: envelopeOf(m)})
	if err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, m.Payload); err != nil {
		t.Fatal(err)
	}
	checkMessage(t, again, m, compact.String())
	if again.Source != m.Source || again.Headers["tenant"] != "acme" {
		t.Errorf("round trip lost source or headers: %+v", again)
	}
}
