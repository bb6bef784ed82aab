package config

import (
	"strings"
	"testing"
)

// TestRenamedMaxPending: sink.<name>.max_pending, the old name of
// max_inflight, is still read from the file and the environment, with a
// deprecation warning; set next to a different max_inflight it is one
// error naming both.
func TestRenamedMaxPending(t *testing.T) {
	for _, sink := range []string{"nats", "redis", "webhook"} {
		base := "postgres:\n  url: postgres://relay@127.0.0.1/shop\nsink:\n  type: " + sink + "\n  " + sink + ":\n"
		if sink == "webhook" {
			base += "    url: https://hooks.example.com/outbox\n    secret: whsec_bmV3LXNlY3JldA==\n"
		} else {
			base += "    stream: OUTBOX\n"
		}
		warning := "sink." + sink + ".max_pending is deprecated and will be removed; rename it sink." + sink + ".max_inflight"
		for how, tc := range map[string]struct {
			yml string
			env map[string]string
		}{
			"file":        {base + "    max_pending: 7\n", nil},
			"environment": {base, map[string]string{"OUTBOXRELAY_SINK_" + strings.ToUpper(sink) + "_MAX_PENDING": "7"}},
		} {
			cfg, err := Load(writeTemp(t, "c.yaml", tc.yml), env(tc.env))
			if err != nil {
				t.Errorf("%s, %s: %v", sink, how, err)
				continue
			}
			ws := cfg.Sink.Settings().Warnings()
			if !strings.Contains(strings.Join(ws, "\n"), warning) {
				t.Errorf("%s, %s: warnings %q, want %q", sink, how, ws, warning)
			}
		}
		cfg, err := Load(writeTemp(t, "c.yaml", base), env(nil))
		if err != nil {
			t.Fatalf("%s: %v", sink, err)
		}
		for _, w := range cfg.Sink.Settings().Warnings() {
			if strings.Contains(w, "max_pending") {
				t.Errorf("%s: max_pending unset, but warned: %q", sink, w)
			}
		}
		_, err = Load(writeTemp(t, "c.yaml", base+"    max_pending: 7\n    max_inflight: 9\n"), env(nil))
		if err == nil || !strings.Contains(err.Error(), "sink."+sink+".max_inflight is 9 and its deprecated old name sink."+sink+".max_pending is 7; remove sink."+sink+".max_pending") {
			t.Errorf("%s: both keys set: %v, want one error naming both", sink, err)
		}
	}
}
