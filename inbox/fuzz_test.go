package inbox

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fuzzHeaders reads "name: value" lines as a header map.
func fuzzHeaders(s string) map[string]string {
	h := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			h[k] = v
		}
	}
	return h
}

// FuzzDecode: whatever a broker delivers, Decode returns a message with an
// id or an error wrapping ErrUndecodable, in every format, and never
// panics; FormatAuto's answer is the answer of the format it detected; the
// message keeps the delivery it came from (what a dead letter stores). The
// seeds are the relay's golden messages in the four formats (read from the
// relay's module beside this one) and the corpus in testdata/fuzz.
func FuzzDecode(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(goldenDir, "*.golden"))
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		b = bytes.TrimSuffix(b, []byte("\n"))
		name := strings.TrimSuffix(filepath.Base(file), ".golden")
		switch {
		case strings.HasPrefix(name, "debezium_"):
			head, body, _ := bytes.Cut(b, []byte("\n\n"))
			var key []byte
			hs := []string{"event_type: order.created"}
			for _, line := range strings.Split(string(head), "\n") {
				if k, ok := strings.CutPrefix(line, "key: "); ok {
					key = []byte(k)
				} else if v, ok := strings.CutPrefix(line, "header "); ok {
					hs = append(hs, v)
				} else {
					hs = append(hs, line)
				}
			}
			f.Add(key, body, strings.Join(hs, "\n"))
		case strings.HasPrefix(name, "cloudevents_binary_"):
			var hs []string
			for _, line := range strings.Split(string(b), "\n") {
				hs = append(hs, "ce_"+line)
			}
			f.Add([]byte("42"), []byte(`{"order_id": 42}`), strings.Join(hs, "\n"))
		default:
			f.Add([]byte(nil), b, "")
		}
	}
	if len(files) == 0 && os.Getenv("CI") == "true" {
		f.Fatalf("no golden messages in %s", goldenDir)
	}
	f.Fuzz(func(t *testing.T, key, value []byte, headers string) {
		raw := Raw{Key: key, Value: value, Headers: fuzzHeaders(headers)}
		var auto Message
		for _, format := range []Format{FormatAuto, FormatEnvelope, FormatCloudEvents, FormatCloudEventsBinary, FormatDebezium} {
			m, err := Decode(format, raw)
			if err != nil {
				if !errors.Is(err, ErrUndecodable) {
					t.Fatalf("%v: error %v does not wrap ErrUndecodable", format, err)
				}
				if m.ID != "" || m.Raw.Value != nil {
					t.Fatalf("%v: error %v with a message %+v", format, err, m)
				}
				continue
			}
			if m.ID == "" {
				t.Fatalf("%v: a message without an id", format)
			}
			if err := storableText(m); err != nil {
				t.Fatalf("%v: decoded a message the inbox cannot record: %v", format, err)
			}
			if m.Format == FormatAuto || format != FormatAuto && m.Format != format {
				t.Fatalf("decoded in %v, reports format %v", format, m.Format)
			}
			if !bytes.Equal(m.Raw.Value, raw.Value) || !bytes.Equal(m.Raw.Key, raw.Key) || len(m.Raw.Headers) != len(raw.Headers) {
				t.Fatalf("%v: the message does not keep its delivery", format)
			}
			if format == FormatAuto {
				auto = m
			} else if auto.ID != "" && m.Format == auto.Format && (m.ID != auto.ID || m.AggregateID != auto.AggregateID ||
				m.EventType != auto.EventType || !bytes.Equal(m.Payload, auto.Payload)) {
				t.Fatalf("auto and %v disagree: %+v against %+v", format, auto, m)
			}
		}
		if _, err := Decode(auto.Format, raw); auto.ID != "" && err != nil {
			t.Fatalf("auto decoded it as %v, which then fails: %v", auto.Format, err)
		}
	})
}
