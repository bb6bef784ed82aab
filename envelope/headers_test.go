package envelope

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseHeaders(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []Header
	}{
		{"", nil},
		{" \n", nil},
		{"{}", nil},
		{" { \t} ", nil},
		{"null", nil},
		{" null\n", nil},
		{`{"tenant": "acme"}`, []Header{{"tenant", "acme"}}},
		{`{"b":"1","a":"2"}`, []Header{{"b", "1"}, {"a", "2"}}},
		{`{"n": 42, "f": -1.5e+3, "t": true, "F": false, "z": null}`,
			[]Header{{"n", "42"}, {"f", "-1.5e+3"}, {"t", "true"}, {"F", "false"}, {"z", "null"}}},
		{`{"nested": {"a": [1, 2, {"b": "x y"}], "c": {}}, "arr": [ ]}`,
			[]Header{{"nested", `{"a":[1,2,{"b":"x y"}],"c":{}}`}, {"arr", "[]"}}},
		{`{"esc\"aped": "line\nbreak \u00e9 \ud83d\ude80 \/"}`, []Header{{`esc"aped`, "line\nbreak é 🚀 /"}}},
		{`{"lone": "\ud800x\udc00"}`, []Header{{"lone", "\ufffdx\ufffd"}}},
		{"{\"bad\xff\": \"utf8\xfe\", \"n\": [\"\xff\"]}", []Header{{"bad\ufffd", "utf8\ufffd"}, {"n", "[\"\ufffd\"]"}}},
		{`{"dup": "1", "other": 2, "dup": "3"}`, []Header{{"dup", "3"}, {"other", "2"}}},
		{`{"empty": ""}`, []Header{{"empty", ""}}},
	} {
		got, err := ParseHeaders([]byte(tc.in))
		if err != nil {
			t.Errorf("ParseHeaders(%q): %v", tc.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseHeaders(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseHeadersManyDuplicates(t *testing.T) {
	var sb strings.Builder
	sb.WriteString("{")
	for i := range 100 {
		if i > 0 {
			sb.WriteString(",")
		}
		sb.WriteString(`"k` + string(rune('a'+i%40)) + `":"` + string(rune('0'+i%10)) + `"`)
	}
	sb.WriteString("}")
	got, err := ParseHeaders([]byte(sb.String()))
	want, _ := refHeaders([]byte(sb.String()))
	if err != nil || !reflect.DeepEqual(got, want) || len(got) != 40 {
		t.Errorf("ParseHeaders = %v, %v; want %v", got, err, want)
	}
}

func TestParseHeadersErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`[1, 2]`, "headers must be a JSON object, got array"},
		{`"x"`, "headers must be a JSON object, got string"},
		{`42`, "headers must be a JSON object, got number"},
		{`true`, "headers must be a JSON object, got boolean"},
		{`[`, "headers are not valid JSON"},
		{`nul`, "headers are not valid JSON"},
		{`{`, "headers are not valid JSON: unexpected end of input at offset 1"},
		{`{"a"}`, "headers are not valid JSON: expected ':' after key"},
		{`{"a": 1,}`, "headers are not valid JSON: expected a string key"},
		{`{a: 1}`, "headers are not valid JSON: expected a string key"},
		{`{"a": 01}`, "headers are not valid JSON"},
		{`{"a": 1.}`, "headers are not valid JSON"},
		{`{"a": -}`, "headers are not valid JSON"},
		{`{"a": 1e}`, "headers are not valid JSON"},
		{`{"a": tru}`, "headers are not valid JSON"},
		{`{"a": "x\q"}`, "headers are not valid JSON: invalid escape"},
		{`{"a": "\u12g4"}`, "headers are not valid JSON: invalid \\u escape"},
		{"{\"a\": \"tab\there\"}", "headers are not valid JSON: control character in string"},
		{`{"a": [1 2]}`, "headers are not valid JSON"},
		{`{"a": {"b" 1}}`, "headers are not valid JSON"},
		{`{} {}`, "headers are not valid JSON: unexpected data after the object"},
		{`{"a": 1} x`, "headers are not valid JSON: unexpected data after the object"},
		{`{"a": "unterminated`, "headers are not valid JSON: unexpected end of input"},
		{`{"a": ` + strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth) + `}`, "headers are not valid JSON: nesting too deep"},
	} {
		got, err := ParseHeaders([]byte(tc.in))
		if err == nil {
			t.Errorf("ParseHeaders(%.40q) = %q, want error %q", tc.in, got, tc.want)
			continue
		}
		if !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("ParseHeaders(%.40q) error %q, want %q", tc.in, err, tc.want)
		}
	}
	// One level less than the limit is fine.
	deep := `{"a": ` + strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1) + `}`
	if _, err := ParseHeaders([]byte(deep)); err != nil {
		t.Errorf("ParseHeaders at maximum depth: %v", err)
	}
}

func TestParseHeadersAllocs(t *testing.T) {
	skipUnderRace(t)
	empty := []byte(" {} ")
	if n := testing.AllocsPerRun(100, func() { ParseHeaders(empty) }); n != 0 {
		t.Errorf("ParseHeaders({}) allocates %v times", n)
	}
	typical := []byte(`{"tenant": "acme", "region": "eu-west-1", "priority": 3}`)
	if n := testing.AllocsPerRun(100, func() { ParseHeaders(typical) }); n > 2 {
		t.Errorf("ParseHeaders of a typical object allocates %v times, want at most 2", n)
	}
}

// refHeaders is ParseHeaders written with encoding/json.
func refHeaders(raw []byte) ([]Header, error) {
	trimmed := bytes.Trim(raw, jsonSpace)
	if len(trimmed) == 0 {
		return nil, nil
	}
	if !json.Valid(raw) {
		return nil, errInvalid
	}
	if bytes.Equal(trimmed, []byte("null")) {
		return nil, nil
	}
	if trimmed[0] != '{' {
		return nil, errInvalid
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.Token()
	var hs []Header
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return nil, err
		}
		key := tok.(string)
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return nil, err
		}
		var value string
		if v[0] == '"' {
			json.Unmarshal(v, &value)
		} else {
			var buf bytes.Buffer
			json.Compact(&buf, v)
			value = perByteValidUTF8(buf.String())
		}
		replaced := false
		for i := range hs {
			if hs[i].Key == key {
				hs[i].Value, replaced = value, true
			}
		}
		if !replaced {
			hs = append(hs, Header{key, value})
		}
	}
	return hs, nil
}

var errInvalid = jsonError("invalid")

type jsonError string

func (e jsonError) Error() string { return string(e) }

// perByteValidUTF8 replaces each byte of invalid UTF-8 with U+FFFD, as
// encoding/json does when it decodes a string.
func perByteValidUTF8(s string) string {
	var sb strings.Builder
	for _, r := range s { // range yields RuneError for each invalid byte
		sb.WriteRune(r)
	}
	return sb.String()
}

func FuzzParseHeaders(f *testing.F) {
	for _, s := range []string{`{}`, `{"tenant": "acme", "n": [1, {"a": null}]}`, `[1]`, `{"\ud800": "\xff"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := ParseHeaders(raw)
		want, werr := refHeaders(raw)
		if (err != nil) != (werr != nil) {
			t.Fatalf("ParseHeaders(%q) error %v, encoding/json error %v", raw, err, werr)
		}
		if err != nil {
			if msg := err.Error(); !strings.HasPrefix(msg, "headers ") {
				t.Fatalf("ParseHeaders(%q) error %q", raw, msg)
			}
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("ParseHeaders(%q)\n got %q\nwant %q", raw, got, want)
		}
		for _, h := range got {
			if !utf8.ValidString(h.Key) || !utf8.ValidString(h.Value) {
				t.Fatalf("ParseHeaders(%q) returned invalid UTF-8 %q", raw, h)
			}
		}
	})
}

func BenchmarkParseHeaders(b *testing.B) {
	for _, bc := range []struct{ name, in string }{
		{"empty", "{}"},
		{"typical", `{"tenant": "acme", "region": "eu-west-1", "priority": 3}`},
		{"escaped_nested", `{"tenant": "caf\u00e9", "route": {"zone": "a", "ids": [1, 2, 3]}}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			in := []byte(bc.in)
			b.ReportAllocs()
			b.SetBytes(int64(len(in)))
			for b.Loop() {
				if _, err := ParseHeaders(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
