package relay

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestJoinHooks: every kind of hook fans out to each Hooks that sets it, in
// argument order, with the arguments it was called with; a kind nobody sets
// stays nil.
func TestJoinHooks(t *testing.T) {
	var calls []string
	record := func(name string) Hooks {
		return Hooks{
			Published:     func(m *Message, _ time.Time) { calls = append(calls, name+" published "+m.ID) },
			PublishFailed: func(m *Message, err error) { calls = append(calls, name+" failed "+m.ID+" "+err.Error()) },
			DeadLettered:  func(m *Message) { calls = append(calls, name+" dead-lettered "+m.ID) },
			Parked:        func(m *Message) { calls = append(calls, name+" parked "+m.ID) },
			Skipped:       func(table string) { calls = append(calls, name+" skipped "+table) },
			ReservedHeaderDropped: func(m *Message, reserved string) {
				calls = append(calls, name+" dropped "+m.ID+" "+reserved)
			},
		}
	}
	only := Hooks{Skipped: func(table string) { calls = append(calls, "c skipped "+table) }}
	j := JoinHooks(record("a"), Hooks{}, only, record("b"))
	m := &Message{ID: "m1"}
	j.Published(m, time.Now())
	j.PublishFailed(m, errors.New("nack"))
	j.DeadLettered(m)
	j.Parked(m)
	j.Skipped("public.t")
	j.ReservedHeaderDropped(m, "ce_*")
	var want []string
	for _, kind := range []string{"published m1", "failed m1 nack", "dead-lettered m1", "parked m1", "skipped public.t", "dropped m1 ce_*"} {
		for _, name := range []string{"a", "c", "b"} {
			if name == "c" && kind != "skipped public.t" {
				continue
			}
			want = append(want, fmt.Sprintf("%s %s", name, kind))
		}
	}
	if !slices.Equal(calls, want) {
		t.Fatalf("joined hooks called\n%q\nwant\n%q", calls, want)
	}

	none := JoinHooks(Hooks{}, only)
	if none.Published != nil || none.PublishFailed != nil || none.DeadLettered != nil || none.Parked != nil || none.ReservedHeaderDropped != nil {
		t.Fatal("a hook nobody set is not nil after JoinHooks")
	}
	calls = nil
	none.Skipped("public.u")
	if !slices.Equal(calls, []string{"c skipped public.u"}) {
		t.Fatalf("single hook called %q", calls)
	}
}

// TestConfigDefaultsValidate: the zero value with its defaults is valid,
// and each bad value is one problem naming its configuration key.
func TestConfigDefaultsValidate(t *testing.T) {
	if err := (Config{}).WithDefaults().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if o := (Config{}).WithDefaults().Order; o != OrderAggregate {
		t.Fatalf("default order %q, want aggregate", o)
	}
	for _, o := range []Order{OrderAggregate, OrderNone} {
		c := Config{Order: o, DeadLetterOrder: DeadLetterPass}.WithDefaults()
		if err := c.Validate(); err != nil {
			t.Errorf("order %q: %v", o, err)
		}
	}
	for _, tc := range []struct {
		change func(*Config)
		want   string
	}{
		{func(c *Config) { c.MaxInFlight = 0 }, "relay.max_inflight must be at least 1"},
		{func(c *Config) { c.MaxInFlightBytes = 1000 }, "relay.max_inflight_bytes must be at least 1024"},
		{func(c *Config) { c.MaxAttempts = -1 }, "relay.max_attempts must be at least 1"},
		{func(c *Config) { c.DeadLetterOrder = "drop" }, `relay.dead_letter_order "drop" is not one of park, pass`},
		{func(c *Config) { c.Order = "partition" }, `relay.order "partition" is not one of aggregate, none`},
		{func(c *Config) { c.Order = OrderNone }, "relay.order: none cannot hold relay.dead_letter_order: park"},
		{func(c *Config) { c.Columns.AggregateID = "" }, "postgres.columns.aggregate_id must name a column"},
		{func(c *Config) { c.Format = "xml" }, `envelope.format "xml" is not one of`},
		{func(c *Config) { c.Format, c.CloudEventsSource = FormatCloudEventsBinary, "" }, "envelope.source must be a URI reference"},
	} {
		c := (Config{}).WithDefaults()
		tc.change(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Validate() = %v, want one problem: %q", err, tc.want)
		}
	}
}
