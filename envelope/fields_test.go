package envelope

import (
	"encoding/json"
	"strings"
	"testing"
)

func fieldsMessage() *Message {
	m := ceMessage()
	m.Fields = []Field{{Name: "tenant", Value: "acme \"eu\""}, {Name: "region", Null: true}}
	return &m
}

// TestFieldsInEnvelope: postgres.envelope_columns are top-level string
// fields of the version 1 envelope, after source and before the payload; a
// NULL column is null; the envelope's own fields are untouched.
func TestFieldsInEnvelope(t *testing.T) {
	m := fieldsMessage()
	out := m.AppendJSON(nil)
	var env map[string]any
	if err := json.Unmarshal(out, &env); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if env["tenant"] != `acme "eu"` {
		t.Errorf("tenant = %v in %s", env["tenant"], out)
	}
	if v, ok := env["region"]; !ok || v != nil {
		t.Errorf("region = %v (present %v), want null", v, ok)
	}
	if env["envelope_version"] != float64(1) || env["payload"].(map[string]any)["order_id"] != float64(42) || env["message_id"] != m.MessageID {
		t.Errorf("the envelope's own fields changed: %s", out)
	}
	if !strings.Contains(string(out), `},"tenant":"acme \"eu\"","region":null,"payload":`) {
		t.Errorf("fields not between source and payload: %s", out)
	}
	if len(out) > m.SizeHint()+len(m.Fields)*16 {
		t.Errorf("%d bytes, size hint %d", len(out), m.SizeHint())
	}
}

// TestFieldsInCloudEvents: in structured mode each field is an extension
// attribute of its name with a string value, a NULL one left out (the JSON
// event format reads null as absent); in binary mode each is an attribute
// the bindings prefix.
func TestFieldsInCloudEvents(t *testing.T) {
	m := fieldsMessage()
	out := m.AppendCloudEvent(nil, "/outboxrelay/shop")
	var ce map[string]any
	if err := json.Unmarshal(out, &ce); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if _, ok := ce["region"]; ok || ce["tenant"] != `acme "eu"` || ce["data"] == nil || ce["id"] != m.MessageID {
		t.Errorf("structured CloudEvent %s: want tenant, no region, the data", out)
	}
	attrs := map[string]string{}
	for _, h := range m.CloudEventAttributes("/outboxrelay/shop") {
		attrs[h.Key] = h.Value
	}
	if _, ok := attrs["region"]; ok || attrs["tenant"] != `acme "eu"` || attrs["id"] != m.MessageID {
		t.Errorf("binary attributes %v: want tenant, no region", attrs)
	}
}

// TestFieldsInDebezium: as Debezium's router with additional placement
// envelope, the value is an object with the payload as "payload" and each
// field that is not NULL next to it; a text payload that is not JSON is a
// string there, a binary one base64; without fields the value is the
// payload alone, as before.
func TestFieldsInDebezium(t *testing.T) {
	m := fieldsMessage()
	d := m.Debezium()
	var v map[string]any
	if err := json.Unmarshal(d.Value, &v); err != nil {
		t.Fatalf("%s: %v", d.Value, err)
	}
	if v["payload"].(map[string]any)["order_id"] != float64(42) || v["tenant"] != `acme "eu"` || d.ContentType != "application/json" || d.Key != "42" {
		t.Errorf("value %s, content type %q", d.Value, d.ContentType)
	}
	if _, ok := v["region"]; ok {
		t.Errorf("a NULL field in %s", d.Value)
	}
	m.Payload, m.PayloadFormat = []byte("plain text"), PayloadText
	if d := m.Debezium(); string(d.Value) != `{"payload":"plain text","tenant":"acme \"eu\""}` {
		t.Errorf("text payload: %s", d.Value)
	}
	m.Payload, m.PayloadFormat = []byte{0xff, 0x00}, PayloadBinary
	if d := m.Debezium(); string(d.Value) != `{"payload":"/wA=","tenant":"acme \"eu\""}` {
		t.Errorf("binary payload: %s", d.Value)
	}
	m.Payload = nil
	if d := m.Debezium(); d.Value != nil {
		t.Errorf("a NULL payload: value %q, want the tombstone's none", d.Value)
	}
	m = fieldsMessage()
	m.Fields = nil
	if d := m.Debezium(); string(d.Value) != string(m.Payload) {
		t.Errorf("no fields: value %s, want the payload %s", d.Value, m.Payload)
	}
}

func TestFieldNameError(t *testing.T) {
	for _, c := range []struct {
		name string
		ce   bool
		want string
	}{
		{"tenant", false, ""},
		{"tenant_id", false, ""},
		{"tenant2", true, ""},
		{"", false, "an empty name"},
		{"payload", false, `"payload" is a field of the envelope`},
		{"source", true, `"source" is a field of the envelope`},
		{"subject", false, ""},
		{"subject", true, `"subject" is a CloudEvents attribute`},
		{"tenant_id", true, `"tenant_id" is not a CloudEvents attribute name`},
		{"Tenant", true, `"Tenant" is not a CloudEvents attribute name`},
	} {
		err := FieldNameError(c.name, c.ce)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("FieldNameError(%q, %v) = %v, want %q", c.name, c.ce, err, c.want)
		}
	}
}
