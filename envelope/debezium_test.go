package envelope

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
)

// TestDebeziumGolden checks the debezium format of every CloudEvents case
// against testdata/debezium_<case>.golden: the key, the id header, the
// content type, a blank line and the value, as Debezium's outbox event
// router with expand-JSON would emit them. go test -update rewrites them.
func TestDebeziumGolden(t *testing.T) {
	for name, m := range ceCases() {
		t.Run(name, func(t *testing.T) {
			d := m.Debezium()
			got := fmt.Appendf(nil, "key: %s\nheader %s: %s\ncontent-type: %s\n\n%s\n", d.Key, DebeziumIDHeader, d.ID, d.ContentType, d.Value)
			checkGolden(t, filepath.Join("testdata", "debezium_"+name+".golden"), got)
		})
	}
}

// TestDebeziumExpandsJSON checks that a JSON payload of any stored format is
// the value itself, an object a consumer decodes directly, never a JSON
// string that holds it (what the router sends without expand-JSON).
func TestDebeziumExpandsJSON(t *testing.T) {
	for _, f := range []PayloadFormat{PayloadJSON, PayloadText, PayloadBinary} {
		m := ceMessage()
		m.PayloadFormat = f
		d := m.Debezium()
		var v map[string]any
		if err := json.Unmarshal(d.Value, &v); err != nil {
			t.Fatalf("format %v: value %q is not a JSON object: %v", f, d.Value, err)
		}
		if v["order_id"] != float64(42) || d.ContentType != "application/json" {
			t.Errorf("format %v: value %s, content type %q", f, d.Value, d.ContentType)
		}
		if d.Key != "42" || d.ID != m.MessageID {
			t.Errorf("format %v: key %q id %q", f, d.Key, d.ID)
		}
	}
}
