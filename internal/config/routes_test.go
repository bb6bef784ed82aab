package config

import (
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/internal/rules"
)

// TestRoutesLoad: routes, unmatched and transform are keys of the file;
// they reach RelayConfig, and a rule that does not compile, a bad
// destination template or a reserved header name fails the load naming the
// rule.
func TestRoutesLoad(t *testing.T) {
	ok := minimal + `
routes:
  - name: orders
    when: 'aggregate_type == "order"'
    destination: 'orders.{event_type}'
    headers: {x-kind: '"order"'}
unmatched: drop
transform:
  key: 'aggregate_type + ":" + aggregate_id'
`
	cfg, err := Load(writeTemp(t, "c.yaml", ok), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	rc := cfg.RelayConfig()
	if len(rc.Rules.Routes) != 1 || rc.Rules.Routes[0].Destination != "orders.{event_type}" || rc.Rules.Unmatched != rules.UnmatchedDrop || rc.Rules.Transform.Key == "" {
		t.Fatalf("the rules did not reach RelayConfig: %+v", rc.Rules)
	}
	// With pipelines, the rules apply to every pipeline.
	cfg, err = Load(writeTemp(t, "c.yaml", ok+"pipelines:\n  - name: a\n  - name: b\n    postgres:\n      slot: b_slot\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range cfg.Units() {
		if rc := u.Config.RelayConfig(); len(rc.Rules.Routes) != 1 || rc.Rules.Unmatched != rules.UnmatchedDrop {
			t.Errorf("pipeline %s: rules %+v, want the file's", u.Name, rc.Rules)
		}
	}
	for _, tc := range []struct{ body, want string }{
		{"routes:\n  - name: big\n    when: 'evnt_type == \"x\"'\n", "rule routes[0] (big).when: ERROR: routes[0] (big).when:1:1: undeclared reference to 'evnt_type'"},
		{"routes:\n  - name: big\n    when: 'aggregate_id'\n", `routes[0] (big).when: "aggregate_id" is of type string, want bool`},
		{"routes:\n  - name: t\n    destination: 'orders.{aggregate}'\n", "routes[0] (t).destination: template"},
		{"routes:\n  - name: t\n    headers: {message_id: '\"x\"'}\n", `routes[0] (t).headers: "message_id" is a header name the relay owns`},
		{"routes:\n  - name: t\n    format: avro\n", "routes[0] (t).format"},
		{"unmatched: drop\n", "unmatched and transform apply to routed rows: add routes"},
		{"routes:\n  - name: t\nunmatched: elsewhere\n", `unmatched "elsewhere" is not deadletter, drop or the name of a route`},
	} {
		_, err := Load(writeTemp(t, "c.yaml", minimal+tc.body), env(nil))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error with %q", tc.body, err, tc.want)
		}
	}
}
