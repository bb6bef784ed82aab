package rules

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// TestPayloadFieldsAsWholeDecode: the fields payloadFields decodes are
// those json.Unmarshal gives of the whole payload, whatever the other
// fields hold, and a payload that is not a valid JSON object is left to
// the whole decode.
func TestPayloadFieldsAsWholeDecode(t *testing.T) {
	fields := map[string]bool{"seq": true, "priority": true, "é": true, "a\"b": true}
	objects := []string{
		`{"seq": 1, "data": "x"}`,
		` { "data" : {"seq": 9, "l": [1, {"seq": 8}, "]}"]} , "seq" : 2.5e3 } `,
		`{"seq": 1, "seq": {"n": [true, null]}}`,
		`{"s\u0065q": "escaped", "priority": "high", "data": "q\"uo\\te,}"}`,
		`{"\u00e9": 1, "a\"b": [], "other": -0.5}`,
		`{}`,
		`{"data": null, "priority": false, "seq": "\ud83d\ude00"}`,
		"{\"seq\":1,\"bad\xffkey\":2,\"priority\":\"\xff\"}",
		`{"seq": 1, "tiny": 1e-400, "data": [-1e-999], "n": 1.7976931348623157e308}`,
		`{"data": ` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `, "seq": ` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `}`,
	}
	for _, p := range objects {
		got, ok := payloadFields([]byte(p), fields, false)
		if gotValid, okValid := payloadFields([]byte(p), fields, true); okValid != ok || !reflect.DeepEqual(gotValid, got) {
			t.Errorf("%s known valid: got %v (%v), want %v (%v)", p, gotValid, okValid, got, ok)
		}
		var whole map[string]any
		if err := json.Unmarshal([]byte(p), &whole); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		want := map[string]any{}
		for k, v := range whole {
			if fields[k] {
				want[k] = v
			}
		}
		if !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %v (%v), want %v", p, got, ok, want)
		}
	}
	for _, p := range []string{``, `null`, `[1]`, `"seq"`, `3`, `{"seq": 1,}`, `{"seq": 1} x`, "{\"data\": \"\x01\"}"} {
		if got, ok := payloadFields([]byte(p), fields, false); ok {
			t.Errorf("%q: got %v, want it left to the whole decode", p, got)
		}
	}
	// Valid JSON that json.Unmarshal refuses, for a number out of float64's
	// range or nesting deeper than it takes, in a field the expressions do
	// not read: the whole decode gives the error (PostgreSQL's json and
	// jsonb take both).
	deep := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	for _, p := range []string{`{"seq": 1, "data": 1e400}`, `{"data": [{"n": -1E+309}], "seq": 1}`,
		`{"seq": 1, "data": 1` + strings.Repeat("0", 309) + `}`, `{"seq": 1, "data": ` + deep + `}`, `{"seq": ` + deep + `}`} {
		var whole map[string]any
		if err := json.Unmarshal([]byte(p), &whole); err == nil {
			t.Fatalf("%.40s: json.Unmarshal took it", p)
		}
		for _, valid := range []bool{false, true} {
			if got, ok := payloadFields([]byte(p), fields, valid); ok {
				t.Errorf("%.40s (known valid %v): got %d fields, want it left to the whole decode", p, valid, len(got))
			}
		}
	}
	// Told it is valid, a payload that is not still gives up, never panics.
	for _, p := range []string{``, `{`, `{"`, `{"seq"`, `{"seq":`, `{"seq": 1`, `{"seq" 1}`, `{"seq": 1,}`, `{"seq": 1} x`, `{"a": [1, 2}`, `[1]`, `null`, `{} x`} {
		if got, ok := payloadFields([]byte(p), fields, true); ok {
			t.Errorf("%q known valid: got %v, want it left to the whole decode", p, got)
		}
	}
}

// TestPayloadUse: a Set decodes only the payload fields its expressions
// name, unless one reads the payload otherwise.
func TestPayloadUse(t *testing.T) {
	for _, c := range []struct {
		when   string
		whole  bool
		fields []string
	}{
		{`has(payload.a) && payload.b == 1.0 && payload["c"] == "x"`, false, []string{"a", "b", "c"}},
		{`payload.a.b == 1.0`, false, []string{"a"}},
		{`size(payload) > 0`, true, nil},
		{`payload == null`, true, nil},
		{`payload[row["k"]] == "x"`, true, nil},
		{`payload.exists(k, k == "a")`, true, nil},
		{`aggregate_type == "order"`, false, nil},
	} {
		s := mustCompile(t, Config{Routes: []Route{{When: c.when}}})
		var got []string
		for f := range s.payload.fields {
			got = append(got, f)
		}
		if s.payload.whole != c.whole || (!c.whole && len(got) != len(c.fields)) {
			t.Errorf("%s: whole %v fields %v, want %v %v", c.when, s.payload.whole, got, c.whole, c.fields)
		}
		for _, f := range c.fields {
			if !s.payload.fields[f] {
				t.Errorf("%s: fields %v lack %q", c.when, got, f)
			}
		}
	}
}

// FuzzPayloadFields: payloadFields never panics, even told that invalid
// JSON is valid, and on valid JSON gives the whole decode's fields.
func FuzzPayloadFields(f *testing.F) {
	for _, p := range []string{`{"seq": 1, "data": "x"}`, `{"a": [1, {"seq": 2}], "seq": "\"}"}`, `{"seq"`, `[1]`, `{"seq": 1, "n": 2e308}`} {
		f.Add([]byte(p))
	}
	fields := map[string]bool{"seq": true}
	f.Fuzz(func(t *testing.T, p []byte) {
		payloadFields(p, fields, true)
		got, ok := payloadFields(p, fields, false)
		var whole map[string]any
		if json.Unmarshal(p, &whole) != nil || whole == nil {
			if ok {
				t.Fatalf("%q: got %v, want it left to the whole decode", p, got)
			}
			return
		}
		want := map[string]any{}
		if v, found := whole["seq"]; found {
			want["seq"] = v
		}
		if !ok || !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: got %v (%v), want %v", p, got, ok, want)
		}
	})
}

// TestFieldsFailAsWholePayload: a rule that reads only a field of a
// payload json.Unmarshal refuses fails as it does when another rule reads
// the whole payload, instead of deciding on the field.
func TestFieldsFailAsWholePayload(t *testing.T) {
	row := &Row{Payload: []byte(`{"seq": 1, "data": [1e400]}`), PayloadValid: true}
	for _, routes := range [][]Route{
		{{When: `payload.seq == 1.0`}},
		{{When: `payload.seq == 1.0`}, {When: `size(payload) > 0`}},
	} {
		_, err := mustCompile(t, Config{Routes: routes}).Decide(row)
		if err == nil || !strings.Contains(err.Error(), "routes[0]") || !strings.Contains(err.Error(), "1e400") {
			t.Errorf("%d routes: got %v, want routes[0] to fail on the payload", len(routes), err)
		}
	}
}

// payloadFields is readFields into a map: the fields of a JSON object
// payload named in fields, as json.Unmarshal decodes them in the whole
// payload.
func payloadFields(p []byte, fields map[string]bool, valid bool) (obj map[string]any, ok bool) {
	fs, ok := readFields(nil, p, fields, valid)
	if !ok {
		return nil, false
	}
	return fieldMap(fs), true
}
