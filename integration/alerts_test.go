package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// needTool returns the path of a command the test needs. Without it the
// test is skipped, except in CI (CI=true), where .ci/services installs it and a
// missing tool fails the test.
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		for _, dir := range []string{"/usr/bin", "/usr/local/bin"} {
			if _, serr := os.Stat(filepath.Join(dir, name)); serr == nil {
				return filepath.Join(dir, name)
			}
		}
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed (Debian package %s; .ci/services installs it)", name, pkg)
		}
		t.Skipf("%s is not installed (apt-get install %s)", name, pkg)
	}
	return path
}

// TestAlertRulesPromtool checks deploy/prometheus/alerts.yaml and runs its
// unit tests (alerts_test.yaml) with promtool: each rule fires on its fault
// and stays quiet on a healthy relay and a healthy standby.
func TestAlertRulesPromtool(t *testing.T) {
	promtool := needTool(t, "promtool", "prometheus")
	dir := filepath.Join(deployDir, "prometheus")
	for _, args := range [][]string{
		{"check", "rules", "alerts.yaml"},
		{"test", "rules", "alerts_test.yaml"},
	} {
		cmd := exec.CommandContext(t.Context(), promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			continue
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// ruleGroups decodes the groups of a rules file or of a PrometheusRule's spec.
func ruleGroups(t *testing.T, path string, inSpec bool) any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Kind   string `yaml:"kind"`
		Groups any    `yaml:"groups"`
		Spec   struct {
			Groups any `yaml:"groups"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if inSpec {
		if doc.Kind != "PrometheusRule" {
			t.Fatalf("%s: kind %q, want PrometheusRule", path, doc.Kind)
		}
		return doc.Spec.Groups
	}
	return doc.Groups
}

// TestPrometheusRuleMatchesAlerts: the PrometheusRule of deploy/kubernetes
// and the Helm chart's copy of the rules are deploy/prometheus/alerts.yaml.
func TestPrometheusRuleMatchesAlerts(t *testing.T) {
	want := ruleGroups(t, filepath.Join(deployDir, "prometheus", "alerts.yaml"), false)
	if want == nil {
		t.Fatal("alerts.yaml has no groups")
	}
	if got := ruleGroups(t, filepath.Join(deployDir, "kubernetes", "prometheusrule.yaml"), true); !reflect.DeepEqual(got, want) {
		t.Errorf("deploy/kubernetes/prometheusrule.yaml differs from deploy/prometheus/alerts.yaml; copy the groups over")
	}
	chart, err := os.ReadFile(filepath.Join(deployDir, "helm", "outboxrelay", "files", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile(filepath.Join(deployDir, "prometheus", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if string(chart) != string(rules) {
		t.Errorf("deploy/helm/outboxrelay/files/alerts.yaml differs from deploy/prometheus/alerts.yaml; copy it over")
	}
}
