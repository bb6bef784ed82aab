package helm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	yamlv2 "go.yaml.in/yaml/v2"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "outboxrelay"

var regexpDocSep = regexp.MustCompile(`(?m)^---\s*$`)

// objects is one rendering of the chart, strictly decoded.
type objects struct {
	deployments     []*appsv1.Deployment
	configMaps      []*corev1.ConfigMap
	hookConfigMaps  []*corev1.ConfigMap // created by a Helm hook (the migrate Job's copy)
	secrets         []*corev1.Secret
	services        []*corev1.Service
	serviceAccounts []*corev1.ServiceAccount
	pdbs            []*policyv1.PodDisruptionBudget
	policies        []*networkingv1.NetworkPolicy
	jobs            []*batchv1.Job
	monitors        []*monitoringv1.ServiceMonitor
	rules           []*monitoringv1.PrometheusRule
}

// decode strictly decodes every YAML document of data, by kind, into the
// Kubernetes API type: an unknown field or a wrong type fails the test.
func decode(t *testing.T, name string, data []byte, into *objects) {
	t.Helper()
	for i, doc := range splitDocs(data) {
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("%s: document %d: %v\n%s", name, i+1, err, doc)
		}
		var target any
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 Deployment":
			o := &appsv1.Deployment{}
			into.deployments, target = append(into.deployments, o), o
		case "v1 ConfigMap":
			o := &corev1.ConfigMap{}
			into.configMaps, target = append(into.configMaps, o), o
		case "v1 Secret":
			o := &corev1.Secret{}
			into.secrets, target = append(into.secrets, o), o
		case "v1 Service":
			o := &corev1.Service{}
			into.services, target = append(into.services, o), o
		case "v1 ServiceAccount":
			o := &corev1.ServiceAccount{}
			into.serviceAccounts, target = append(into.serviceAccounts, o), o
		case "policy/v1 PodDisruptionBudget":
			o := &policyv1.PodDisruptionBudget{}
			into.pdbs, target = append(into.pdbs, o), o
		case "networking.k8s.io/v1 NetworkPolicy":
			o := &networkingv1.NetworkPolicy{}
			into.policies, target = append(into.policies, o), o
		case "batch/v1 Job":
			o := &batchv1.Job{}
			into.jobs, target = append(into.jobs, o), o
		case "monitoring.coreos.com/v1 ServiceMonitor":
			o := &monitoringv1.ServiceMonitor{}
			into.monitors, target = append(into.monitors, o), o
		case "monitoring.coreos.com/v1 PrometheusRule":
			o := &monitoringv1.PrometheusRule{}
			into.rules, target = append(into.rules, o), o
		default:
			t.Fatalf("%s: document %d: unexpected %s %s", name, i+1, meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, target); err != nil {
			t.Errorf("%s: %s: %v", name, meta.Kind, err)
		}
		if cm, ok := target.(*corev1.ConfigMap); ok && cm.Annotations["helm.sh/hook"] != "" {
			into.configMaps = into.configMaps[:len(into.configMaps)-1]
			into.hookConfigMaps = append(into.hookConfigMaps, cm)
		}
	}
}

// splitDocs returns the non-empty YAML documents of data.
func splitDocs(data []byte) [][]byte {
	var docs [][]byte
	for _, part := range regexpDocSep.Split(string(data), -1) {
		var v any
		if err := yaml.Unmarshal([]byte(part), &v); err == nil && v == nil {
			continue // only comments
		}
		if strings.TrimSpace(part) != "" {
			docs = append(docs, []byte(part))
		}
	}
	return docs
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return c
}

// render renders the chart as `helm template outboxrelay` would with the
// values files given (none: the defaults) and decodes the result.
func render(t *testing.T, valueFiles ...string) (objects, error) {
	t.Helper()
	c := loadChart(t)
	vals := map[string]any{}
	for _, f := range valueFiles {
		v, err := chartutil.ReadValuesFile(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		vals = chartutil.CoalesceTables(v.AsMap(), vals)
	}
	return renderValues(t, c, vals)
}

func renderValues(t *testing.T, c *chart.Chart, vals map[string]any) (objects, error) {
	t.Helper()
	opts := chartutil.ReleaseOptions{Name: "outboxrelay", Namespace: "outbox", Revision: 1, IsInstall: true}
	rv, err := chartutil.ToRenderValues(c, vals, opts, chartutil.DefaultCapabilities)
	if err != nil {
		return objects{}, err
	}
	files, err := engine.Render(c, rv)
	if err != nil {
		return objects{}, err
	}
	var o objects
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if strings.HasSuffix(name, ".tpl") || strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		decode(t, name, []byte(files[name]), &o)
	}
	return o, nil
}

var relayBin string

// buildRelay builds outboxrelay from the repository once per test binary.
func buildRelay(t *testing.T) string {
	t.Helper()
	if relayBin != "" {
		return relayBin
	}
	out := filepath.Join(os.TempDir(), "outboxrelay-chart-test-"+strings.ReplaceAll(time.Now().Format("150405.000000"), ".", ""))
	cmd := exec.Command("go", "build", "-C", "../..", "-o", out, "./cmd/outboxrelay")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build outboxrelay: %v\n%s", err, b)
	}
	relayBin = out
	return out
}

func TestMain(m *testing.M) {
	code := m.Run()
	if relayBin != "" {
		os.Remove(relayBin)
	}
	os.Exit(code)
}

// checkConfig runs `outboxrelay run --check-config` on the rendered
// config.yaml with the environment the Deployment gives the container.
func checkConfig(t *testing.T, o objects) {
	t.Helper()
	if len(o.configMaps) != 1 || len(o.deployments) != 1 {
		t.Fatalf("want one ConfigMap and one Deployment, have %d and %d", len(o.configMaps), len(o.deployments))
	}
	// The migrate hook reads the same configuration as the relay.
	for _, h := range o.hookConfigMaps {
		if h.Data["config.yaml"] != o.configMaps[0].Data["config.yaml"] {
			t.Errorf("hook ConfigMap %s holds another config.yaml than the relay's", h.Name)
		}
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(o.configMaps[0].Data["config.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{}
	rendered := map[string]bool{}
	for _, s := range o.secrets {
		rendered[s.Name] = true
		for k, v := range s.StringData {
			secrets[s.Name+"/"+k] = v
		}
	}
	// A Secret the operator brings (secret.existingSecret): stand in URLs
	// of the right shape for its keys.
	standIn := map[string]string{
		"postgres-url": "postgres://relay:secret@postgres.database.svc:5432/shop",
		"rabbitmq-url": "amqps://relay:secret@rabbitmq.messaging.svc:5671/",
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	for _, e := range o.deployments[0].Spec.Template.Spec.Containers[0].Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := secrets[ref.Name+"/"+ref.Key]
			if !rendered[ref.Name] {
				v, ok = standIn[ref.Key]
			}
			switch {
			case ok:
				env = append(env, e.Name+"="+v)
			case ref.Optional == nil || !*ref.Optional:
				t.Errorf("env %s refers to key %s of Secret %s, which the chart does not render", e.Name, ref.Key, ref.Name)
			}
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, buildRelay(t), "run", "--check-config", "--config", path)
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("outboxrelay run --check-config on the rendered config: %v\n%s\nconfig:\n%s", err, out, o.configMaps[0].Data["config.yaml"])
	}
}

func container(t *testing.T, o objects) corev1.Container {
	t.Helper()
	if len(o.deployments) != 1 || len(o.deployments[0].Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("want one Deployment with one container")
	}
	return o.deployments[0].Spec.Template.Spec.Containers[0]
}

func TestChartDefaults(t *testing.T) {
	o, err := render(t)
	if err != nil {
		t.Fatal(err)
	}
	d := o.deployments[0]
	if *d.Spec.Replicas != 2 {
		t.Errorf("replicas = %d, want 2 (active and standby)", *d.Spec.Replicas)
	}
	c := container(t, o)
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz?standby=ok" {
		t.Errorf("readiness probe %+v, want /readyz?standby=ok", c.ReadinessProbe)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe %+v, want /healthz", c.LivenessProbe)
	}
	if c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Cpu().IsZero() {
		t.Errorf("resources %+v", c.Resources)
	}
	if d.Spec.Template.Spec.Affinity == nil || d.Spec.Template.Spec.Affinity.PodAntiAffinity == nil {
		t.Errorf("no pod anti-affinity: the standby may share the active replica's node")
	}
	if len(o.pdbs) != 1 || o.pdbs[0].Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget: %+v", o.pdbs)
	}
	if len(o.secrets) != 2 || len(o.jobs) != 1 || o.jobs[0].Annotations["helm.sh/hook"] != "pre-install,pre-upgrade" {
		t.Errorf("want the Secret, the migrate hook's Secret and the migrate hook Job; have %d Secrets and %d Jobs", len(o.secrets), len(o.jobs))
	}
	if len(o.monitors)+len(o.rules)+len(o.policies) != 0 {
		t.Errorf("ServiceMonitor, PrometheusRule and NetworkPolicy are off by default")
	}
	if got := o.services[0].Annotations["prometheus.io/scrape"]; got != "true" {
		t.Errorf("Service prometheus.io/scrape = %q", got)
	}
	checkConfig(t, o)
}

func TestChartProduction(t *testing.T) {
	o, err := render(t, filepath.Join(chartDir, "ci", "production-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if *o.deployments[0].Spec.Replicas != 3 {
		t.Errorf("replicas = %d, want 3", *o.deployments[0].Spec.Replicas)
	}
	if len(o.secrets) != 0 {
		t.Errorf("with secret.existingSecret the chart must create no Secret, created %d", len(o.secrets))
	}
	for _, e := range container(t, o).Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name != "outboxrelay-credentials" {
			t.Errorf("env %s refers to secret %s, want outboxrelay-credentials", e.Name, e.ValueFrom.SecretKeyRef.Name)
		}
	}
	if len(o.monitors) != 1 || o.monitors[0].Labels["release"] != "prometheus" || o.monitors[0].Spec.Endpoints[0].Port != "http" {
		t.Errorf("ServiceMonitor: %+v", o.monitors)
	}
	if len(o.policies) != 1 {
		t.Fatalf("want a NetworkPolicy, have %d", len(o.policies))
	}
	var ports []int
	for _, r := range o.policies[0].Spec.Egress {
		for _, p := range r.Ports {
			ports = append(ports, p.Port.IntValue())
		}
	}
	if !slices.Equal(ports, []int{53, 53, 5432, 5671}) {
		t.Errorf("NetworkPolicy egress ports %v, want DNS, 5432 and 5671", ports)
	}
	if len(o.rules) != 1 {
		t.Fatalf("want a PrometheusRule, have %d", len(o.rules))
	}
	// The rules are the tested alerts.yaml, unchanged.
	want, err := os.ReadFile(filepath.Join("..", "prometheus", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var wantSpec monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(want, &wantSpec); err != nil {
		t.Fatalf("alerts.yaml as a PrometheusRule spec: %v", err)
	}
	if !reflect.DeepEqual(o.rules[0].Spec, wantSpec) {
		t.Errorf("PrometheusRule spec differs from deploy/prometheus/alerts.yaml")
	}
	checkConfig(t, o)
}

func TestChartSingleReplica(t *testing.T) {
	o, err := render(t, filepath.Join(chartDir, "ci", "single-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if *o.deployments[0].Spec.Replicas != 1 {
		t.Errorf("replicas = %d, want 1", *o.deployments[0].Spec.Replicas)
	}
	if p := container(t, o).ReadinessProbe.HTTPGet.Path; p != "/readyz" {
		t.Errorf("readiness path %q without a standby, want /readyz", p)
	}
	if len(o.pdbs)+len(o.jobs) != 0 {
		t.Errorf("PodDisruptionBudget and migrate Job are disabled, rendered %d and %d", len(o.pdbs), len(o.jobs))
	}
	checkConfig(t, o)
}

// TestChartPipelines: a pipelines list on three replicas, which share the
// pipelines (each streams its share, the others wait as standbys for the
// rest): a Deployment of 3, readiness that counts a standby pipeline as
// ready, a PodDisruptionBudget that lets one replica go at a time, and a
// configuration the relay accepts with its six pipelines.
func TestChartPipelines(t *testing.T) {
	o, err := render(t, filepath.Join(chartDir, "ci", "pipelines-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if *o.deployments[0].Spec.Replicas != 3 {
		t.Errorf("replicas = %d, want 3", *o.deployments[0].Spec.Replicas)
	}
	if p := container(t, o).ReadinessProbe.HTTPGet.Path; p != "/readyz?standby=ok" {
		t.Errorf("readiness path %q, want /readyz?standby=ok: a replica waits as standby for the pipelines past its share", p)
	}
	if len(o.pdbs) != 1 || o.pdbs[0].Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget: %+v, want maxUnavailable 1", o.pdbs)
	}
	if s := o.deployments[0].Spec.Strategy.RollingUpdate; s == nil || s.MaxUnavailable.IntValue() != 1 {
		t.Errorf("rolling update %+v, want one replica at a time", s)
	}
	if cfg := o.configMaps[0].Data["config.yaml"]; strings.Count(cfg, "name: ") != 6 {
		t.Errorf("config.yaml does not hold the six pipelines:\n%s", cfg)
	}
	checkConfig(t, o)
}

// TestChartRefusesBadValues: values that cannot work fail the render with
// one message naming the fix.
func TestChartRefusesBadValues(t *testing.T) {
	c := loadChart(t)
	for _, tt := range []struct {
		vals map[string]any
		want string
	}{
		{map[string]any{"replicaCount": 1}, "standby.enabled needs replicaCount >= 2"},
		{map[string]any{"config": map[string]any{"http": map[string]any{"listen": "127.0.0.1:9187"}}}, "config.http.listen must be 0.0.0.0:9187"},
		{map[string]any{"secret": map[string]any{"postgresURL": ""}}, "secret.postgresURL is required"},
	} {
		_, err := renderValues(t, c, tt.vals)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("values %v: error %v, want %q", tt.vals, err, tt.want)
		}
	}
}

// TestChartMatchesManifests: deploy/kubernetes applies what the chart
// renders with its defaults (release name outboxrelay): the same container,
// configuration, probes, Service and disruption budget, and the same
// migrate container.
func TestChartMatchesManifests(t *testing.T) {
	chartObjs, err := render(t)
	if err != nil {
		t.Fatal(err)
	}
	var plain objects
	for _, f := range []string{"outboxrelay.yaml", "migrate-job.yaml"} {
		data, err := os.ReadFile(filepath.Join("..", "kubernetes", f))
		if err != nil {
			t.Fatal(err)
		}
		decode(t, f, data, &plain)
	}
	pc, cc := container(t, plain), container(t, chartObjs)
	if !reflect.DeepEqual(pc, cc) {
		a, _ := yaml.Marshal(pc)
		b, _ := yaml.Marshal(cc)
		t.Errorf("relay container differs\ndeploy/kubernetes:\n%s\nchart:\n%s", a, b)
	}
	pd, cd := plain.deployments[0].Spec, chartObjs.deployments[0].Spec
	if *pd.Replicas != *cd.Replicas || !reflect.DeepEqual(pd.Strategy, cd.Strategy) ||
		*pd.Template.Spec.TerminationGracePeriodSeconds != *cd.Template.Spec.TerminationGracePeriodSeconds ||
		!reflect.DeepEqual(pd.Template.Spec.SecurityContext, cd.Template.Spec.SecurityContext) ||
		!reflect.DeepEqual(pd.Template.Spec.Volumes, cd.Template.Spec.Volumes) {
		t.Errorf("Deployment spec differs (replicas, strategy, grace period, security context or volumes)")
	}
	var pcfg, ccfg map[string]any
	if err := yamlv2.Unmarshal([]byte(plain.configMaps[0].Data["config.yaml"]), &pcfg); err != nil {
		t.Fatal(err)
	}
	if err := yamlv2.Unmarshal([]byte(chartObjs.configMaps[0].Data["config.yaml"]), &ccfg); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(pcfg, ccfg) {
		t.Errorf("config.yaml differs\ndeploy/kubernetes: %v\nchart: %v", pcfg, ccfg)
	}
	ps, cs := plain.services[0], chartObjs.services[0]
	if ps.Name != cs.Name || !reflect.DeepEqual(ps.Annotations, cs.Annotations) || !reflect.DeepEqual(ps.Spec.Ports, cs.Spec.Ports) {
		t.Errorf("metrics Service differs")
	}
	if plain.pdbs[0].Spec.MaxUnavailable.String() != chartObjs.pdbs[0].Spec.MaxUnavailable.String() {
		t.Errorf("PodDisruptionBudget maxUnavailable differs")
	}
	pj, cj := plain.jobs[0].Spec.Template.Spec.Containers[0], chartObjs.jobs[0].Spec.Template.Spec.Containers[0]
	if !reflect.DeepEqual(pj.Args, cj.Args) || !reflect.DeepEqual(pj.Resources, cj.Resources) || !reflect.DeepEqual(pj.SecurityContext, cj.SecurityContext) ||
		!reflect.DeepEqual(pj.VolumeMounts, cj.VolumeMounts) {
		t.Errorf("migrate container differs")
	}
}
