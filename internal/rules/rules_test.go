package rules

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

func order(event string, total float64) *Row {
	return &Row{MessageID: "m-1", AggregateType: "order", AggregateID: "o-1", EventType: event, Table: "public.outbox",
		SchemaVersion: 1, Headers: map[string]string{"tenant": "acme"},
		Payload: []byte(`{"total": ` + strconv.FormatFloat(total, 'f', -1, 64) + `, "region": "eu"}`),
		Columns: map[string]string{"tenant": "acme", "region": "eu"}}
}

func header(m Match, name string) string {
	v, _ := m.Header(name)
	return v
}

func mustCompile(t *testing.T, c Config) *Set {
	t.Helper()
	s, err := Compile(c)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return s
}

func TestFirstMatchWinsUnlessContinue(t *testing.T) {
	s := mustCompile(t, Config{Routes: []Route{
		{Name: "audit", When: `headers["tenant"] == "acme"`, Destination: "audit", Continue: true},
		{Name: "big", When: `event_type == "order.created" && payload.total > 100.0`, Destination: "big-orders",
			Key: `row["region"] + "/" + aggregate_id`, Headers: map[string]string{"x-size": `"big"`}, Format: "cloudevents"},
		{Name: "orders", When: `aggregate_type == "order"`, Destination: "orders"},
		{Name: "never", When: `true`, Destination: "never"},
	}})
	d, err := s.Decide(order("order.created", 250))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Matches) != 2 || d.Matches[0].Route != "audit" || d.Matches[1].Route != "big" {
		t.Fatalf("matches %+v, want audit (continue) then big", d.Matches)
	}
	big := d.Matches[1]
	if big.Destination != "big-orders" || big.Key != "eu/o-1" || header(big, "x-size") != "big" || big.Format != "cloudevents" {
		t.Errorf("big: %+v", big)
	}
	if a := d.Matches[0]; a.Key != "o-1" || len(a.Headers) != 0 {
		t.Errorf("audit keeps the aggregate id and adds no header: %+v", a)
	}
	d, err = s.Decide(order("order.created", 5))
	if err != nil || len(d.Matches) != 2 || d.Matches[1].Route != "orders" {
		t.Fatalf("small order: %+v, %v", d, err)
	}
}

func TestUnmatched(t *testing.T) {
	routes := []Route{{Name: "paid", When: `event_type == "order.paid"`, Destination: "paid"}, {Name: "rest", When: `false`, Destination: "rest"}}
	row := order("order.created", 1)

	s := mustCompile(t, Config{Routes: routes})
	if _, err := s.Decide(row); !errors.Is(err, ErrUnmatched) {
		t.Errorf("default policy: %v, want ErrUnmatched (dead letter)", err)
	}
	s = mustCompile(t, Config{Routes: routes, Unmatched: UnmatchedDrop})
	if d, err := s.Decide(row); err != nil || !d.Dropped || len(d.Matches) != 0 {
		t.Errorf("drop: %+v, %v", d, err)
	}
	s = mustCompile(t, Config{Routes: routes, Unmatched: "rest"})
	if d, err := s.Decide(row); err != nil || len(d.Matches) != 1 || d.Matches[0].Destination != "rest" {
		t.Errorf("default route: %+v, %v", d, err)
	}
}

func TestTransform(t *testing.T) {
	s := mustCompile(t, Config{
		Routes: []Route{{Name: "all", Destination: "all", Headers: map[string]string{"x-route": `"all"`}}},
		Transform: Transform{Key: `headers["tenant"] + ":" + aggregate_id`, Headers: map[string]string{"x-event": `event_type`},
			Payload: map[string]string{"total_cents": `int(payload.total * 100.0)`, "region": `payload.region + "-1"`}},
	})
	d, err := s.Decide(order("order.created", 12.5))
	if err != nil {
		t.Fatal(err)
	}
	m := d.Matches[0]
	if m.Key != "acme:o-1" || header(m, "x-event") != "order.created" || header(m, "x-route") != "all" {
		t.Errorf("match %+v", m)
	}
	if string(d.Payload) != `{"region":"eu-1","total":12.5,"total_cents":1250}` {
		t.Errorf("payload %s", d.Payload)
	}
}

// Every compile error names its rule and, for an expression, the position.
func TestCompileErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		want []string
	}{
		{"typo", Config{Routes: []Route{{Name: "paid", When: `evnt_type == "order.paid"`}}},
			[]string{"rule routes[0] (paid).when", "routes[0] (paid).when:1:1", "undeclared reference to 'evnt_type'"}},
		{"syntax", Config{Routes: []Route{{When: `aggregate_type == `}}},
			[]string{"rule routes[0] (route-0).when", "routes[0] (route-0).when:1:"}},
		{"when not bool", Config{Routes: []Route{{Name: "r", When: `aggregate_id`}}},
			[]string{"rule routes[0] (r).when", "is of type string, want bool"}},
		{"type error", Config{Routes: []Route{{Name: "r", When: `schema_version == "2"`}}},
			[]string{"rule routes[0] (r).when", "no matching overload"}},
		{"key not string", Config{Routes: []Route{{Name: "r", Key: `schema_version`}}},
			[]string{"rule routes[0] (r).key", "is of type int, want string"}},
		{"header", Config{Routes: []Route{{Name: "r", Headers: map[string]string{"x": `row.missing(`}}}},
			[]string{"rule routes[0] (r).headers.x"}},
		{"empty header name", Config{Routes: []Route{{Name: "r", Headers: map[string]string{"": `"v"`}}}},
			[]string{"rule routes[0] (r).headers: has an empty name"}},
		{"empty header expression", Config{Transform: Transform{Headers: map[string]string{"x": ` `}}},
			[]string{"rule transform.headers.x: is empty"}},
		{"duplicate", Config{Routes: []Route{{Name: "a"}, {Name: "a"}}},
			[]string{`routes[1]: the name "a" is used by an earlier route`}},
		{"unmatched", Config{Routes: []Route{{Name: "a"}}, Unmatched: "nowhere"},
			[]string{`unmatched "nowhere" is not deadletter, drop or the name of a route`}},
		{"transform key", Config{Transform: Transform{Key: `1 + `}}, []string{"rule transform.key"}},
		{"transform payload", Config{Transform: Transform{Payload: map[string]string{"f": `nope`}}},
			[]string{"rule transform.payload.f", "undeclared reference to 'nope'"}},
	} {
		_, err := Compile(tc.c)
		if err == nil {
			t.Errorf("%s: Compile succeeded", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not contain %q", tc.name, err, w)
			}
		}
	}
	// Every problem at once, not only the first.
	_, err := Compile(Config{Routes: []Route{{Name: "a", When: `x`}, {Name: "b", When: `y`}}})
	if err == nil || !strings.Contains(err.Error(), "routes[0] (a)") || !strings.Contains(err.Error(), "routes[1] (b)") {
		t.Errorf("two typos: %v", err)
	}
}

// A rule that fails on one row fails that row only, with the rule's error;
// the next row is decided.
func TestRuntimeErrorFailsOneRow(t *testing.T) {
	s := mustCompile(t, Config{Routes: []Route{
		{Name: "big", When: `payload.total > 100.0`, Destination: "big"},
		{Name: "keyed", When: `true`, Key: `row["customer"]`, Destination: "rest"},
	}, Transform: Transform{Headers: map[string]string{"x-tenant": `headers["tenant"]`}}})

	bad := order("order.created", 1)
	bad.Payload = []byte(`{"region": "eu"}`) // no total
	_, err := s.Decide(bad)
	var re *RuleError
	if !errors.As(err, &re) || re.Rule != "routes[0] (big).when" || !strings.Contains(err.Error(), "no such key: total") {
		t.Errorf("missing field: %v", err)
	}
	_, err = s.Decide(order("order.created", 1)) // no customer column
	if !errors.As(err, &re) || re.Rule != "routes[1] (keyed).key" {
		t.Errorf("missing column: %v", err)
	}
	noTenant := order("order.created", 500)
	noTenant.Headers = nil
	if _, err = s.Decide(noTenant); !errors.As(err, &re) || re.Rule != "transform.headers.x-tenant" {
		t.Errorf("missing header: %v", err)
	}
	notJSON := order("order.created", 1)
	notJSON.Payload = []byte(`not json`)
	if _, err = s.Decide(notJSON); !errors.As(err, &re) || !strings.Contains(err.Error(), "payload is not JSON") {
		t.Errorf("payload not JSON: %v", err)
	}
	d, err := s.Decide(order("order.created", 500))
	if err != nil || d.Matches[0].Route != "big" || header(d.Matches[0], "x-tenant") != "acme" {
		t.Errorf("the next row: %+v, %v", d, err)
	}

	// A transform of the payload needs a JSON object.
	s = mustCompile(t, Config{Routes: []Route{{Name: "a"}}, Transform: Transform{Payload: map[string]string{"f": `1`}}})
	arr := order("x", 1)
	arr.Payload = []byte(`[1]`)
	if _, err := s.Decide(arr); !errors.As(err, &re) || re.Rule != "transform.payload" {
		t.Errorf("array payload: %v", err)
	}
}

// A condition on the dynamic payload that is not a bool on a row fails that
// row, naming the rule.
func TestWhenNotBoolAtRunTime(t *testing.T) {
	s := mustCompile(t, Config{Routes: []Route{{Name: "flag", When: `payload.region`}}})
	_, err := s.Decide(order("order.created", 1))
	var re *RuleError
	if !errors.As(err, &re) || re.Rule != "routes[0] (flag).when" || !strings.Contains(err.Error(), "not a bool") {
		t.Errorf("string condition: %v", err)
	}
}

// DecideTo reuses the decision it is given: each row's decision is the
// one Decide makes of it, whatever the row before left in it (more
// matches, other headers, an error); and a route's headers, which share
// the transform's, never change another match's.
func TestDecideToReuses(t *testing.T) {
	s := mustCompile(t, Config{Routes: []Route{
		{Name: "audit", When: `"tenant" in headers && headers["tenant"] == "acme"`, Destination: "audit", Continue: true, Headers: map[string]string{"x-event": `"audited"`}},
		{Name: "big", When: `payload.total > 100.0`, Destination: "big"},
		{Name: "rest", When: `payload.total >= 0.0`, Destination: "rest"},
	}, Transform: Transform{Headers: map[string]string{"x-event": `event_type`}}})
	small := order("order.paid", 5)
	small.Headers = nil
	broken := order("order.created", 1)
	broken.Payload = []byte(`{"total": "one"}`)
	var d Decision
	for i, row := range []*Row{order("order.created", 250), small, broken, order("order.created", 250), small} {
		want, wantErr := s.Decide(row)
		if i == 1 && (wantErr != nil || len(want.Matches) != 1) {
			t.Fatalf("the small order: %+v, %v; want one route", want, wantErr)
		}
		// audit's header, which replaces the transform's, stays on audit's
		// match.
		if i == 0 && (len(want.Matches) != 2 || header(want.Matches[0], "x-event") != "audited" ||
			len(want.Matches[1].Headers) != 1 || header(want.Matches[1], "x-event") != "order.created") {
			t.Fatalf("the big order: %+v; want audit with its own x-event, then big with the transform's", want.Matches)
		}
		err := s.DecideTo(&d, row)
		if (err == nil) != (wantErr == nil) || len(d.Matches) != len(want.Matches) || d.Dropped != want.Dropped {
			t.Fatalf("row %d: DecideTo %+v, %v; Decide %+v, %v", i, d, err, want, wantErr)
		}
		for j := range want.Matches {
			g, w := d.Matches[j], want.Matches[j]
			if g.Route != w.Route || g.Key != w.Key || fmt.Sprint(g.Headers) != fmt.Sprint(w.Headers) {
				t.Errorf("row %d match %d: DecideTo %+v, Decide %+v", i, j, g, w)
			}
		}
	}
}
