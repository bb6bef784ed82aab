package schema

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"
)

// FuzzDecode holds decode to encoding/json: for valid UTF-8 it accepts
// exactly the same texts and yields the same values as a json.Decoder
// with UseNumber.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"seq": 1, "data": "abc"}`, `[1, -0.5e+3, true, false, null, {}]`, `"\u00e9\ud83d\ude00\ud800x\/\b\f\n\r\t"`,
		`{"a": {"b": [[]]}, "a": 2}`, `01`, `1.`, `-`, `1e`, `"\x"`, `{"a" 1}`, `[1,]`, `tru`, `"\u12`, ` 3 `, `{"a":1} x`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !utf8.Valid(b) {
			return
		}
		got, gotErr := decode(b)
		var want any
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		wantErr := dec.Decode(&want)
		if wantErr == nil && dec.More() {
			wantErr = errEnd // trailing data
		}
		if wantErr == nil {
			// Decode stops after the value; anything but space after it is an error.
			if rest := bytes.TrimLeft(b[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
				wantErr = errEnd
			}
		}
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("decode(%q): error %v, encoding/json: %v", b, gotErr, wantErr)
		}
		if gotErr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("decode(%q) = %#v, encoding/json: %#v", b, got, want)
		}
	})
}
