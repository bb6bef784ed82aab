package envelope

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
)

const ceSource = "/outboxrelay/shop"

// ceMessage is the message the CloudEvents cases vary.
func ceMessage() Message {
	return Message{
		MessageID:     "0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a",
		EventType:     "order.created",
		SchemaVersion: 1,
		AggregateType: "order",
		AggregateID:   "42",
		OccurredAt:    time.Date(2026, 11, 29, 9, 0, 0, 123456789, time.FixedZone("CET", 3600)),
		TraceID:       "4bf92f3577b34da6a3ce929d0e0e4736",
		Traceparent:   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Headers:       []byte(`{"tenant": "acme"}`),
		Source:        Source{Database: "shop", Table: "public.outbox", LSN: 0x1A2B3C4, CommitLSN: 0x1A2B400, XID: 1234},
		Payload:       []byte(`{"order_id": 42, "total": "99.90"}`),
		PayloadFormat: PayloadJSON,
	}
}

func ceCases() map[string]Message {
	cases := map[string]Message{"jsonb": ceMessage()}

	m := ceMessage()
	m.PayloadFormat = PayloadText
	m.Payload = []byte("hello, world: not JSON")
	cases["text_not_json"] = m

	m = ceMessage()
	m.PayloadFormat = PayloadText
	m.Payload = []byte(" [1, 2, \"three\"]\n")
	cases["text_json"] = m

	m = ceMessage()
	m.PayloadFormat = PayloadBinary
	m.Payload = []byte{0x00, 0x01, 0xfe, 0xff, 'x'}
	cases["bytea_binary"] = m

	m = ceMessage()
	m.Payload = nil
	m.Traceparent = ""
	m.AggregateID = ""
	m.SchemaVersion = 7
	cases["minimal"] = m

	m = ceMessage()
	m.EventType = "naïve.事件.🚀"
	m.AggregateID = "html <a href='x'>&amp;</a> \u2028 \"q\" \\"
	m.MessageID = "bad utf8 \xff \xe2\x82 end"
	m.Payload = []byte(`{"text": "é \u00e9 \ud83d\ude80 <>&"}`)
	cases["unicode"] = m
	return cases
}

// TestCloudEventGolden checks both content modes of every case against
// testdata/cloudevents_<case>.golden (structured) and
// testdata/cloudevents_binary_<case>.golden (one "name: value" line per
// attribute). go test -update rewrites them.
func TestCloudEventGolden(t *testing.T) {
	for name, m := range ceCases() {
		t.Run(name, func(t *testing.T) {
			structured := m.AppendCloudEvent(nil, ceSource)
			var binary []byte
			for _, h := range m.CloudEventAttributes(ceSource) {
				binary = fmt.Appendf(binary, "%s: %s\n", h.Key, h.Value)
			}
			checkGolden(t, filepath.Join("testdata", "cloudevents_"+name+".golden"), append(structured, '\n'))
			checkGolden(t, filepath.Join("testdata", "cloudevents_binary_"+name+".golden"), binary)
		})
	}
}

func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s\n got: %s\nwant: %s", path, got, want)
	}
}

// TestCloudEventSDK decodes our structured events with the CloudEvents Go
// SDK, validates them and checks every attribute and the data.
func TestCloudEventSDK(t *testing.T) {
	for name, m := range ceCases() {
		t.Run(name, func(t *testing.T) {
			raw := m.AppendCloudEvent(nil, ceSource)
			var e event.Event
			if err := json.Unmarshal(raw, &e); err != nil {
				t.Fatalf("sdk-go cannot decode %s: %v", raw, err)
			}
			if err := e.Validate(); err != nil {
				t.Fatalf("sdk-go rejects %s: %v", raw, err)
			}
			want := sdkView(t, &m)
			got := map[string]any{
				"specversion": e.SpecVersion(), "id": e.ID(), "source": e.Source(), "type": e.Type(),
				"subject": e.Subject(), "time": e.Time().Format(time.RFC3339Nano),
				"datacontenttype": e.DataContentType(), "data": string(e.Data()),
			}
			for k, v := range e.Extensions() {
				if k == "schemaversion" {
					n, err := types.ToInteger(v)
					if err != nil {
						t.Errorf("schemaversion %v (%T) is not an integer: %v", v, v, err)
					}
					got[k] = int(n)
					continue
				}
				got[k] = v
			}
			for k, w := range want {
				if g := got[k]; fmt.Sprint(g) != fmt.Sprint(w) {
					t.Errorf("%s = %q, want %q", k, g, w)
				}
			}
			for k := range e.Extensions() {
				if _, ok := want[k]; !ok {
					t.Errorf("unexpected extension %s", k)
				}
			}
		})
	}
}

// sdkView is what the SDK must see for m: attribute values, extensions
// and the decoded data.
func sdkView(t *testing.T, m *Message) map[string]any {
	t.Helper()
	payload, inline, ct := m.data()
	data := string(payload)
	if !inline {
		data = string(m.Payload)
	}
	v := map[string]any{
		"specversion": "1.0", "id": validUTF8(m.MessageID), "source": ceSource, "type": m.EventType,
		"subject": m.AggregateID, "time": m.OccurredAt.UTC().Truncate(time.Microsecond).Format(time.RFC3339Nano),
		"datacontenttype": ct, "data": data, "schemaversion": m.SchemaVersion,
	}
	if m.Traceparent != "" {
		v["traceparent"] = m.Traceparent
	}
	if m.AggregateID != "" {
		v["partitionkey"] = m.AggregateID
	}
	return v
}

// TestCloudEventAttributesMatchStructured: binary mode carries the same
// attributes as structured mode, and the SDK accepts them as an event.
func TestCloudEventAttributesMatchStructured(t *testing.T) {
	for name, m := range ceCases() {
		t.Run(name, func(t *testing.T) {
			var obj map[string]any
			if err := json.Unmarshal(m.AppendCloudEvent(nil, ceSource), &obj); err != nil {
				t.Fatal(err)
			}
			delete(obj, "data")
			delete(obj, "data_base64")
			e := event.New()
			attrs := m.CloudEventAttributes(ceSource)
			if len(attrs) != len(obj) {
				t.Errorf("%d binary attributes, %d structured ones", len(attrs), len(obj))
			}
			for _, h := range attrs {
				if fmt.Sprint(obj[h.Key]) != h.Value {
					t.Errorf("attribute %s = %q in binary mode, %v in structured mode", h.Key, h.Value, obj[h.Key])
				}
				var err error
				switch h.Key {
				case "specversion":
					e.SetSpecVersion(h.Value)
				case "id":
					e.SetID(h.Value)
				case "source":
					e.SetSource(h.Value)
				case "type":
					e.SetType(h.Value)
				case "subject":
					e.SetSubject(h.Value)
				case "time":
					var tm time.Time
					tm, err = time.Parse(time.RFC3339Nano, h.Value)
					e.SetTime(tm)
				case "datacontenttype":
					e.SetDataContentType(h.Value)
				default:
					e.SetExtension(h.Key, h.Value) // an invalid name fails Validate below
				}
				if err != nil {
					t.Errorf("attribute %s=%q: %v", h.Key, h.Value, err)
				}
			}
			if err := e.Validate(); err != nil {
				t.Errorf("sdk-go rejects the binary attributes: %v", err)
			}
		})
	}
}

func TestCloudEventAppends(t *testing.T) {
	m := ceMessage()
	prefix := []byte("prefix:")
	got := m.AppendCloudEvent(bytes.Clone(prefix), ceSource)
	if !bytes.HasPrefix(got, prefix) || !bytes.Equal(got[len(prefix):], m.AppendCloudEvent(nil, ceSource)) {
		t.Errorf("AppendCloudEvent does not append: %s", got)
	}
	m.Payload = bytes.Repeat([]byte{0xff}, 3000)
	m.PayloadFormat = PayloadBinary
	var obj struct {
		Data string `json:"data_base64"`
	}
	if err := json.Unmarshal(m.AppendCloudEvent(nil, ceSource), &obj); err != nil {
		t.Fatal(err)
	}
	if d, _ := base64.StdEncoding.DecodeString(obj.Data); !bytes.Equal(d, m.Payload) {
		t.Error("data_base64 does not decode to the payload")
	}
}

func TestCloudEventAllocations(t *testing.T) {
	skipUnderRace(t)
	m := ceMessage()
	buf := make([]byte, 0, 4096)
	if n := testing.AllocsPerRun(100, func() { buf = m.AppendCloudEvent(buf[:0], ceSource) }); n != 0 {
		t.Errorf("AppendCloudEvent into a large enough buffer allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = m.AppendCloudEvent(nil, ceSource) }); n > 1 {
		t.Errorf("AppendCloudEvent(nil) allocates %v times, want 1", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = m.CloudEventAttributes(ceSource) }); n > 2 {
		t.Errorf("CloudEventAttributes allocates %v times, want at most 2", n)
	}
}

// ceMessage1KB has a 1 KB JSON payload, as BenchmarkAppendJSON1KB.
func ceMessage1KB() Message {
	m := ceMessage()
	var sb strings.Builder
	sb.WriteString(`{"order_id": 42, "items": [`)
	for i := 0; sb.Len() < 1000; i++ {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, `{"sku": "SKU-%04d", "qty": %d}`, i, i%5+1)
	}
	sb.WriteString(`]}`)
	m.Payload = []byte(sb.String())
	return m
}

func BenchmarkAppendCloudEvent1KB(b *testing.B) {
	m := ceMessage1KB()
	b.Run("structured_reused_buffer", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(m.Payload)))
		var buf []byte
		for b.Loop() {
			buf = m.AppendCloudEvent(buf[:0], ceSource)
		}
	})
	b.Run("structured_new_buffer", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(m.Payload)))
		for b.Loop() {
			_ = m.AppendCloudEvent(nil, ceSource)
		}
	})
	b.Run("binary_attributes", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = m.CloudEventAttributes(ceSource)
		}
	})
	b.Run("sdk_go_marshal", func(b *testing.B) { // the baseline: the SDK's own encoder
		e := event.New()
		e.SetID(m.MessageID)
		e.SetSource(ceSource)
		e.SetType(m.EventType)
		e.SetSubject(m.AggregateID)
		e.SetTime(m.OccurredAt)
		e.SetExtension("traceparent", m.Traceparent)
		e.SetExtension("partitionkey", m.AggregateID)
		e.SetExtension("schemaversion", m.SchemaVersion)
		_ = e.SetData("application/json", json.RawMessage(m.Payload))
		b.ReportAllocs()
		b.SetBytes(int64(len(m.Payload)))
		for b.Loop() {
			_, _ = json.Marshal(e)
		}
	})
}
