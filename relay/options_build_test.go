package relay_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/rules"
	"github.com/outboxrelay/outboxrelay/relay"
)

// optionsRelation is an outbox table with the columns the router options
// name besides the default ones.
var optionsRelation = &cdc.Relation{ID: 7, Namespace: "public", Name: "outbox", Columns: []cdc.Column{
	{Name: "id", TypeOID: cdc.OIDUUID}, {Name: "aggregate_type", TypeOID: cdc.OIDText},
	{Name: "aggregate_id", TypeOID: cdc.OIDText}, {Name: "event_type", TypeOID: cdc.OIDText},
	{Name: "payload", TypeOID: cdc.OIDJSONB}, {Name: "tenant", TypeOID: cdc.OIDText},
	{Name: "happened", TypeOID: cdc.OIDTimestamptz},
}}

func optionsRow(payload, tenant, happened []byte) *cdc.Insert {
	return &cdc.Insert{Relation: optionsRelation, LSN: 0x100, Values: [][]byte{
		[]byte("0b7e0c4e-8d0e-4b8e-9a57-6e0ae0b3c1f1"), []byte("order"), []byte("o-1"), []byte("OrderPlaced"),
		payload, tenant, happened,
	}}
}

func buildOptions(t *testing.T, cfg relay.Config, ins *cdc.Insert) (*relay.Message, error) {
	t.Helper()
	cfg.Tables = []string{"public.outbox"}
	tx := cdc.Begin{FinalLSN: 0x200, XID: 9, CommitTime: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	return relay.NewBuilder(cfg, relay.Options{}).Row(context.Background(), optionsRelation, ins, tx)
}

// A NULL payload in the debezium format is a tombstone, as Debezium's
// router sends it, where it was dead-lettered as "column payload is null".
func TestDebeziumNullPayloadIsATombstone(t *testing.T) {
	cfg := relay.Config{Envelope: relay.Envelope{Format: relay.FormatDebezium}}
	m, err := buildOptions(t, cfg, optionsRow(nil, nil, nil))
	if err != nil {
		t.Fatalf("a null payload in the debezium format: %v", err)
	}
	if !m.Tombstone || len(m.Envelope) != 0 {
		t.Fatalf("Tombstone %v, body %q; want a tombstone with no body", m.Tombstone, m.Envelope)
	}
	if m.Key != "o-1" {
		t.Fatalf("key %q, want the aggregate id", m.Key)
	}
	m, err = buildOptions(t, cfg, optionsRow([]byte(`{"a":1}`), nil, nil))
	if err != nil || m.Tombstone || string(m.Envelope) != `{"a":1}` {
		t.Fatalf("a payload: tombstone %v, body %q, err %v", m.Tombstone, m.Envelope, err)
	}
	// The envelope format still refuses a null payload.
	if _, err := buildOptions(t, relay.Config{}, optionsRow(nil, nil, nil)); err == nil || !strings.Contains(err.Error(), "column payload is null") {
		t.Fatalf("envelope format, null payload: %v", err)
	}
}

func TestKeyTimestampAndHeaderColumns(t *testing.T) {
	cfg := relay.Config{Outbox: relay.Outbox{HeaderColumns: []string{"tenant"}}}
	cfg.Outbox.Columns = relay.DefaultColumns()
	cfg.Outbox.Columns.Key, cfg.Outbox.Columns.Timestamp = "tenant", "happened"
	m, err := buildOptions(t, cfg, optionsRow([]byte(`{}`), []byte("acme"), []byte("2025-06-07 08:09:10.123456+00")))
	if err != nil {
		t.Fatal(err)
	}
	if m.Key != "acme" {
		t.Errorf("key %q, want acme", m.Key)
	}
	if want := time.Date(2025, 6, 7, 8, 9, 10, 123456000, time.UTC); !m.Timestamp.Equal(want) {
		t.Errorf("timestamp %v, want %v", m.Timestamp, want)
	}
	if !strings.Contains(string(m.Envelope), `"occurred_at":"2025-06-07T08:09:10.123456Z"`) {
		t.Errorf("occurred_at is not the timestamp column: %s", m.Envelope)
	}
	if n := len(m.Headers); n != 1 || m.Headers[0] != (envelope.Header{Key: "tenant", Value: "acme"}) {
		t.Errorf("headers %v, want tenant: acme", m.Headers)
	}

	// A NULL header column sends no header; a NULL key column is a dead letter.
	m, err = buildOptions(t, cfg, optionsRow([]byte(`{}`), nil, []byte("2025-06-07 08:09:10+00")))
	if err == nil || !strings.Contains(err.Error(), "column tenant is null or empty") {
		t.Errorf("null key column: %v", err)
	}
	if m == nil || len(m.Headers) != 0 {
		t.Errorf("null header column: message %v", m)
	}
	// A timestamp the column cannot hold is a dead letter naming the setting.
	if _, err := buildOptions(t, cfg, optionsRow([]byte(`{}`), []byte("acme"), []byte("soon"))); err == nil || !strings.Contains(err.Error(), "postgres.columns.timestamp") {
		t.Errorf("bad timestamp: %v", err)
	}
}

func TestOptionColumnsTheTableLacks(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*relay.Config)
		want string
	}{
		{"key", func(c *relay.Config) { c.Outbox.Columns.Key = "nope" }, "postgres.columns.key"},
		{"timestamp", func(c *relay.Config) { c.Outbox.Columns.Timestamp = "nope" }, "postgres.columns.timestamp"},
		{"header", func(c *relay.Config) { c.Outbox.HeaderColumns = []string{"nope"} }, "postgres.header_columns"},
		{"envelope", func(c *relay.Config) { c.Outbox.EnvelopeColumns = []string{"nope"} }, "postgres.envelope_columns"},
	} {
		cfg := relay.Config{}
		cfg.Outbox.Columns = relay.DefaultColumns()
		tc.set(&cfg)
		_, err := buildOptions(t, cfg, optionsRow([]byte(`{}`), nil, nil))
		var se *cdc.SetupError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"nope"`) {
			t.Errorf("%s: %v, want a setup error naming %s", tc.name, err, tc.want)
		}
	}
}

func TestHeaderColumnsRefuseReservedNames(t *testing.T) {
	o := relay.Outbox{HeaderColumns: []string{"message_id", ""}}.WithDefaults()
	err := o.Validate()
	if err == nil || !strings.Contains(err.Error(), `"message_id" is a header name the relay owns`) || !strings.Contains(err.Error(), "empty column name") {
		t.Fatalf("Validate: %v", err)
	}
}

// TestEnvelopeColumns: postgres.envelope_columns places a column into each
// format's message (a NULL one as each format says), and a name that would
// collide with a field of the envelope, or of a CloudEvent when a
// CloudEvents format is in use (envelope.format or a route's), is refused
// when the configuration is validated.
func TestEnvelopeColumns(t *testing.T) {
	for _, tc := range []struct {
		format relay.Format
		want   string
	}{
		{relay.FormatEnvelope, `"tenant":"acme"`},
		{relay.FormatCloudEvents, `"schemaversion":1,"tenant":"acme"`},
		{relay.FormatDebezium, `{"payload":{"n":1},"tenant":"acme"}`},
	} {
		cfg := relay.Config{Outbox: relay.Outbox{EnvelopeColumns: []string{"tenant"}}, Envelope: relay.Envelope{Format: tc.format}}
		m, err := buildOptions(t, cfg, optionsRow([]byte(`{"n":1}`), []byte("acme"), nil))
		if err != nil || !strings.Contains(string(m.Envelope), tc.want) {
			t.Errorf("%s: %s, %v; want it to contain %s", tc.format, m.Envelope, err, tc.want)
		}
		m, err = buildOptions(t, cfg, optionsRow([]byte(`{"n":1}`), nil, nil))
		if err != nil || strings.Contains(string(m.Envelope), `"tenant":"`) {
			t.Errorf("%s, NULL tenant: %s, %v", tc.format, m.Envelope, err)
		}
	}
	cfg := relay.Config{Outbox: relay.Outbox{EnvelopeColumns: []string{"tenant"}}, Envelope: relay.Envelope{Format: relay.FormatCloudEventsBinary}}
	m, err := buildOptions(t, cfg, optionsRow([]byte(`{"n":1}`), []byte("acme"), nil))
	if err != nil || !slices.Contains(m.Attributes, envelope.Header{Key: "tenant", Value: "acme"}) {
		t.Errorf("binary CloudEvents: attributes %v, %v", m.Attributes, err)
	}

	for _, tc := range []struct {
		name string
		cfg  relay.Config
		want string
	}{
		{"envelope field", relay.Config{Outbox: relay.Outbox{EnvelopeColumns: []string{"payload"}}},
			`postgres.envelope_columns: "payload" is a field of the envelope`},
		{"twice", relay.Config{Outbox: relay.Outbox{EnvelopeColumns: []string{"tenant", "tenant"}}},
			`postgres.envelope_columns: "tenant" is listed twice`},
		{"cloudevents attribute", relay.Config{Outbox: relay.Outbox{EnvelopeColumns: []string{"subject"}}, Envelope: relay.Envelope{Format: relay.FormatCloudEvents}},
			`postgres.envelope_columns: "subject" is a CloudEvents attribute`},
		{"cloudevents name", relay.Config{Outbox: relay.Outbox{EnvelopeColumns: []string{"tenant_id"}}, Envelope: relay.Envelope{Format: relay.FormatCloudEventsBinary}},
			`"tenant_id" is not a CloudEvents attribute name`},
		{"route's cloudevents", relay.Config{Outbox: relay.Outbox{EnvelopeColumns: []string{"tenant_id"}},
			Rules: rules.Config{Routes: []rules.Route{{Name: "ce", Format: "cloudevents"}}}},
			`"tenant_id" is not a CloudEvents attribute name`},
	} {
		err := tc.cfg.WithDefaults().Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// Not a CloudEvents attribute name, but no CloudEvents format: fine.
	if err := (relay.Config{Outbox: relay.Outbox{EnvelopeColumns: []string{"tenant_id"}}}).WithDefaults().Validate(); err != nil {
		t.Errorf("tenant_id in the envelope format: %v", err)
	}
}

// A JSON payload that is not UTF-8, which a SQL_ASCII database stores,
// fails its row in every format, naming the column and the byte: the
// body would embed it as stored. A text payload is not refused: it is
// sent as payload_base64 when it is not UTF-8 JSON.
func TestPayloadNotUTF8(t *testing.T) {
	for _, f := range []relay.Format{relay.FormatEnvelope, relay.FormatCloudEvents, relay.FormatCloudEventsBinary, relay.FormatDebezium} {
		cfg := relay.Config{Envelope: relay.Envelope{Format: f}}
		_, err := buildOptions(t, cfg, optionsRow([]byte("{\"note\": \"\xff\xfe\"}"), nil, nil))
		if err == nil || !strings.Contains(err.Error(), "column payload is not valid UTF-8 (byte 0xFF at offset 10)") {
			t.Errorf("format %s, payload with FF FE: %v, want the column and the byte named", f, err)
		}
	}
	if _, err := buildOptions(t, relay.Config{}, optionsRow([]byte(`{"note": "é"}`), nil, nil)); err != nil {
		t.Errorf("a UTF-8 payload: %v", err)
	}
}
