package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/internal/config"
)

const reloadYAML = `sink:
  type: kafka
  kafka:
    brokers: [127.0.0.1:9092]
pipelines:
  - name: a
    postgres: {url: postgres://a@127.0.0.1/a, slot: a}
  - name: b
    postgres: {url: postgres://b@127.0.0.1/b, slot: b}
`

func loadYAML(t *testing.T, text string) config.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestSameUnit: the same file read twice gives the same pipelines, which
// a reload leaves alone; a changed setting, inherited or the pipeline's
// own, makes a pipeline changed, and only that one.
func TestSameUnit(t *testing.T) {
	first := loadYAML(t, reloadYAML).Units()
	again := loadYAML(t, reloadYAML).Units()
	for i := range first {
		if !sameUnit(first[i], again[i]) {
			t.Errorf("pipeline %s read twice counts as changed", first[i].Name)
		}
	}
	changed := loadYAML(t, strings.Replace(reloadYAML, "slot: b}", "slot: b, status_interval: 2s}", 1)).Units()
	if !sameUnit(first[0], changed[0]) || sameUnit(first[1], changed[1]) {
		t.Errorf("a change to b's postgres: a same %v (want true), b same %v (want false)",
			sameUnit(first[0], changed[0]), sameUnit(first[1], changed[1]))
	}
	inherited := loadYAML(t, strings.Replace(reloadYAML, "127.0.0.1:9092", "127.0.0.1:9093", 1)).Units()
	for i := range first {
		if sameUnit(first[i], inherited[i]) {
			t.Errorf("pipeline %s: a changed top-level sink counts as unchanged", first[i].Name)
		}
	}
}

// TestReloadRefusesSinglePipeline: a configuration without a pipelines
// list is refused whole, the pipelines as they were.
func TestReloadRefusesSinglePipeline(t *testing.T) {
	p, err := NewProcess(loadYAML(t, reloadYAML), zap.NewNop(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	single := loadYAML(t, "postgres: {url: postgres://x@127.0.0.1/x}\nsink:\n  type: kafka\n  kafka: {brokers: [127.0.0.1:9092]}\n")
	st := p.apply(t.Context(), single, func(*unit) { t.Error("a refused reload started a pipeline") })
	if !strings.Contains(st.Error, "no pipelines list") || len(p.list()) != 2 {
		t.Errorf("reload to a single pipeline: %+v, %d pipelines left", st, len(p.list()))
	}
	if r := p.LastReload(); r == nil || r.Error == "" {
		t.Errorf("the refusal is not the last reload: %+v", r)
	}
}
