package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.yaml.in/yaml/v3"
)

// deployDir holds the Dockerfile, compose file, Kubernetes manifests and
// alert rules; the tests run in integration/.
const deployDir = "../deploy"

// deployDocs decodes every YAML document in path.
func deployDocs(t *testing.T, path string) []*yaml.Node {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []*yaml.Node
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: document %d: %v", path, len(docs)+1, err)
		}
		docs = append(docs, &n)
	}
}

// TestDeployFilesParse: every YAML (and JSON) file under deploy/ parses,
// and holds at least one non-empty document.
func TestDeployFilesParse(t *testing.T) {
	n := 0
	err := filepath.WalkDir(deployDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && path == filepath.Join(deployDir, "helm", "outboxrelay", "templates") {
			return fs.SkipDir // Helm templates; deploy/helm renders and checks them
		}
		if err != nil || d.IsDir() {
			return err
		}
		switch filepath.Ext(path) {
		case ".yaml", ".yml":
			n++
			docs := deployDocs(t, path)
			if len(docs) == 0 {
				t.Errorf("%s: no YAML document", path)
			}
			for i, doc := range docs {
				var v any
				if err := doc.Decode(&v); err != nil || v == nil {
					t.Errorf("%s: document %d is empty or invalid (%v)", path, i+1, err)
				}
			}
		case ".json":
			n++
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if !json.Valid(data) {
				t.Errorf("%s: invalid JSON", path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 6 {
		t.Fatalf("found %d YAML/JSON files under %s; the deploy files are missing", n, deployDir)
	}
}

// checkConfig runs `outboxrelay run --check-config` on path with env (as
// NAME=value) added to a clean environment, and fails the test unless it
// exits 0.
func checkConfig(t *testing.T, path string, env map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, relayBin, "run", "--check-config", "--config", path)
	cmd.Env = cleanEnv()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("outboxrelay run --check-config --config %s: %v\n%s", path, err, out)
	}
}

// relayConfigFile is the part of the configuration file the deploy tests check.
type relayConfigFile struct {
	Postgres struct {
		URL  string `yaml:"url"`
		Slot string `yaml:"slot"`
	} `yaml:"postgres"`
	Sink struct {
		Type     string `yaml:"type"`
		RabbitMQ struct {
			URL string `yaml:"url"`
		} `yaml:"rabbitmq"`
	} `yaml:"sink"`
	HTTP struct {
		Listen string `yaml:"listen"`
	} `yaml:"http"`
}

// checkDeployedConfig checks a configuration that runs in a container: it
// is accepted, listens where probes and Prometheus reach it, and keeps
// passwords out of the file.
func checkDeployedConfig(t *testing.T, path string, env map[string]string) relayConfigFile {
	t.Helper()
	checkConfig(t, path, env)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg relayConfigFile
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if cfg.HTTP.Listen != "0.0.0.0:9187" {
		t.Errorf("%s: http.listen is %q; in a container it must be 0.0.0.0:9187", path, cfg.HTTP.Listen)
	}
	if cfg.Postgres.URL != "" || cfg.Sink.RabbitMQ.URL != "" {
		t.Errorf("%s: URLs (and their passwords) belong in the environment, not the file", path)
	}
	return cfg
}

// composeFile is the part of docker-compose.yml the tests read.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       any               `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Profiles    []string          `yaml:"profiles"`
}

// TestDeployCompose checks the compose file: PostgreSQL with
// wal_level=logical, the brokers, the migrate one-shot, and one relay per
// sink whose mounted configuration, with the service's environment, is
// accepted by the relay.
func TestDeployCompose(t *testing.T) {
	docs := deployDocs(t, filepath.Join(deployDir, "docker-compose.yml"))
	if len(docs) != 1 {
		t.Fatalf("docker-compose.yml has %d documents, want 1", len(docs))
	}
	var c composeFile
	if err := docs[0].Decode(&c); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"postgres", "migrate", "kafka", "rabbitmq", "relay-kafka", "relay-rabbitmq"} {
		if _, ok := c.Services[name]; !ok {
			t.Errorf("docker-compose.yml has no service %s", name)
		}
	}
	pg := c.Services["postgres"]
	if !strings.HasPrefix(pg.Image, "postgres:16") || !slices.Contains(pg.Command, "wal_level=logical") {
		t.Errorf("postgres service: image %q command %q; want postgres:16 with -c wal_level=logical", pg.Image, pg.Command)
	}
	if !strings.HasPrefix(c.Services["kafka"].Image, "apache/kafka:") ||
		c.Services["kafka"].Environment["KAFKA_PROCESS_ROLES"] != "broker,controller" {
		t.Errorf("kafka service must be apache/kafka in KRaft mode (KAFKA_PROCESS_ROLES=broker,controller)")
	}
	if !strings.Contains(c.Services["rabbitmq"].Image, "management") {
		t.Errorf("rabbitmq service: image %q, want a management image", c.Services["rabbitmq"].Image)
	}
	if m := c.Services["migrate"]; len(m.Command) == 0 || m.Command[0] != "migrate" || m.Environment["OUTBOXRELAY_POSTGRES_URL"] == "" {
		t.Errorf("migrate service: command %q, want migrate with OUTBOXRELAY_POSTGRES_URL", m.Command)
	}

	used := map[string]bool{}
	slots := map[string]string{}
	for _, name := range []string{"relay-kafka", "relay-rabbitmq"} {
		svc := c.Services[name]
		t.Run(name, func(t *testing.T) {
			if svc.Build == nil {
				t.Errorf("not built from deploy/Dockerfile")
			}
			i := slices.Index(svc.Command, "--config")
			if len(svc.Command) == 0 || svc.Command[0] != "run" || i < 0 || i+1 >= len(svc.Command) {
				t.Fatalf("command %q, want run --config FILE", svc.Command)
			}
			inContainer := svc.Command[i+1]
			var host string
			for _, v := range svc.Volumes {
				parts := strings.Split(v, ":")
				if len(parts) >= 2 && parts[1] == inContainer {
					host = filepath.Join(deployDir, parts[0])
				}
			}
			if host == "" {
				t.Fatalf("no volume mounts %s", inContainer)
			}
			used[filepath.Clean(host)] = true
			cfg := checkDeployedConfig(t, host, svc.Environment)
			if want := strings.TrimPrefix(name, "relay-"); cfg.Sink.Type != want || !slices.Contains(svc.Profiles, want) {
				t.Errorf("sink.type %q, profiles %q; want %s", cfg.Sink.Type, svc.Profiles, want)
			}
			if other, ok := slots[cfg.Postgres.Slot]; ok {
				t.Errorf("slot %q is also used by %s; relays that run together need their own slots", cfg.Postgres.Slot, other)
			}
			slots[cfg.Postgres.Slot] = name
		})
	}
	configs, err := filepath.Glob(filepath.Join(deployDir, "config", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range configs {
		if !used[filepath.Clean(path)] {
			t.Errorf("%s is not mounted by any relay service", path)
		}
	}
	if len(configs) < 2 {
		t.Errorf("deploy/config has %d configurations, want kafka.yaml and rabbitmq.yaml", len(configs))
	}
}

// k8sObject is the part of a Kubernetes object the tests read; Spec is
// decoded per kind.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name        string            `yaml:"name"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Spec       yaml.Node         `yaml:"spec"`
}

type k8sDeploymentSpec struct {
	Replicas int `yaml:"replicas"`
	Template struct {
		Spec struct {
			SecurityContext struct {
				RunAsNonRoot *bool `yaml:"runAsNonRoot"`
			} `yaml:"securityContext"`
			Containers []k8sContainer `yaml:"containers"`
			Volumes    []struct {
				Name      string `yaml:"name"`
				ConfigMap *struct {
					Name string `yaml:"name"`
				} `yaml:"configMap"`
			} `yaml:"volumes"`
		} `yaml:"spec"`
	} `yaml:"template"`
}

type k8sContainer struct {
	Args []string `yaml:"args"`
	Env  []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name     string `yaml:"name"`
				Key      string `yaml:"key"`
				Optional bool   `yaml:"optional"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		ReadOnlyRootFilesystem *bool `yaml:"readOnlyRootFilesystem"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

// TestDeployKubernetes checks the manifests: two replicas with both probes
// on port 9187, a non-root read-only container with resources, the Secret
// keys the Deployment references, the metrics Service, the
// PodDisruptionBudget, and a ConfigMap configuration the relay accepts
// with the Deployment's environment.
func TestDeployKubernetes(t *testing.T) {
	objects := map[string]k8sObject{}
	for _, doc := range deployDocs(t, filepath.Join(deployDir, "kubernetes", "outboxrelay.yaml")) {
		var o k8sObject
		if err := doc.Decode(&o); err != nil {
			t.Fatal(err)
		}
		objects[o.Kind] = o
	}
	for _, kind := range []string{"Deployment", "ConfigMap", "Secret", "Service", "PodDisruptionBudget"} {
		if _, ok := objects[kind]; !ok {
			t.Fatalf("kubernetes/outboxrelay.yaml has no %s", kind)
		}
	}

	var d k8sDeploymentSpec
	deployment := objects["Deployment"]
	if err := deployment.Spec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	if d.Replicas != 2 {
		t.Errorf("Deployment replicas = %d, want 2 (one active, one standby)", d.Replicas)
	}
	pod := d.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("Deployment has %d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	ports := map[string]string{}
	for _, p := range c.Ports {
		ports[p.Name] = fmt.Sprint(p.ContainerPort)
	}
	probePort := func(p *k8sProbe) string {
		if p == nil || p.HTTPGet == nil {
			return ""
		}
		if named, ok := ports[p.HTTPGet.Port]; ok {
			return named
		}
		return p.HTTPGet.Port
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || probePort(c.LivenessProbe) != "9187" {
		t.Errorf("liveness probe must be GET /healthz on 9187")
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || !strings.HasPrefix(c.ReadinessProbe.HTTPGet.Path, "/readyz") || probePort(c.ReadinessProbe) != "9187" {
		t.Errorf("readiness probe must be GET /readyz on 9187")
	}
	if r := pod.SecurityContext.RunAsNonRoot; r == nil || !*r {
		t.Errorf("pod securityContext.runAsNonRoot must be true")
	}
	if r := c.SecurityContext.ReadOnlyRootFilesystem; r == nil || !*r {
		t.Errorf("container securityContext.readOnlyRootFilesystem must be true")
	}
	for _, res := range []string{"cpu", "memory"} {
		if c.Resources.Requests[res] == "" {
			t.Errorf("no %s request", res)
		}
	}
	if c.Resources.Limits["memory"] == "" {
		t.Errorf("no memory limit")
	}

	// Where the configuration is mounted and what the Deployment passes.
	i := slices.Index(c.Args, "--config")
	if len(c.Args) == 0 || c.Args[0] != "run" || i < 0 || i+1 >= len(c.Args) {
		t.Fatalf("args %q, want run --config FILE", c.Args)
	}
	configPath := c.Args[i+1]
	cm := objects["ConfigMap"]
	mounted := false
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Metadata.Name &&
				filepath.Join(m.MountPath, "config.yaml") == configPath {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Errorf("ConfigMap %s is not mounted so that %s is its config.yaml", cm.Metadata.Name, configPath)
	}
	secret := objects["Secret"]
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := secret.StringData[ref.Key]
			if ref.Name != secret.Metadata.Name || (!ok && !ref.Optional) {
				t.Errorf("env %s refers to secret %s key %s, which the manifest does not define", e.Name, ref.Name, ref.Key)
			}
			if ok {
				env[e.Name] = v
			}
		}
	}
	if env["OUTBOXRELAY_POSTGRES_URL"] == "" {
		t.Errorf("OUTBOXRELAY_POSTGRES_URL is not set from the Secret")
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cm.Data["config.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	checkDeployedConfig(t, path, env)

	svc := objects["Service"]
	if svc.Metadata.Annotations["prometheus.io/scrape"] != "true" || svc.Metadata.Annotations["prometheus.io/port"] != "9187" {
		t.Errorf("Service annotations %v; want prometheus.io/scrape \"true\" and prometheus.io/port \"9187\"", svc.Metadata.Annotations)
	}
}

// TestDeployDockerfile checks the image recipe: a multi-stage build from
// golang:1.26 with a static, trimmed binary, a final stage that runs as a
// non-root user, and a HEALTHCHECK.
func TestDeployDockerfile(t *testing.T) {
	f, err := os.Open(filepath.Join(deployDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Instructions, with continuation lines joined and comments dropped.
	var instrs []string
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		instrs = append(instrs, cur.String())
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}

	var froms, users, healthchecks []string
	var build string
	for _, in := range instrs {
		word, rest, _ := strings.Cut(in, " ")
		switch strings.ToUpper(word) {
		case "FROM":
			froms = append(froms, rest)
			users = nil // USER applies to its stage
			healthchecks = nil
		case "USER":
			users = append(users, strings.TrimSpace(rest))
		case "HEALTHCHECK":
			healthchecks = append(healthchecks, strings.TrimSpace(rest))
		case "RUN":
			if strings.Contains(rest, "go build") {
				build = rest
			}
		}
	}
	if len(froms) < 2 {
		t.Errorf("Dockerfile has %d FROM lines; want a multi-stage build", len(froms))
	}
	if len(froms) > 0 && !strings.HasPrefix(froms[0], "golang:1.26") {
		t.Errorf("builder stage is FROM %s, want golang:1.26", froms[0])
	}
	if last := froms[len(froms)-1]; !strings.Contains(last, "distroless/static") && !strings.HasPrefix(last, "scratch") {
		t.Errorf("final stage is FROM %s; want distroless static or scratch", last)
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-s -w", "./cmd/outboxrelay"} {
		if !strings.Contains(build, want) {
			t.Errorf("go build step %q lacks %s", build, want)
		}
	}
	if len(users) == 0 {
		t.Errorf("final stage sets no USER")
	} else if u, _, _ := strings.Cut(users[len(users)-1], ":"); u == "root" || u == "0" {
		t.Errorf("final stage runs as USER %s", users[len(users)-1])
	}
	if len(healthchecks) == 0 || strings.EqualFold(healthchecks[len(healthchecks)-1], "NONE") {
		t.Errorf("final stage has no HEALTHCHECK")
	}

	// go mod download reads the go.mod of every module that go.mod replaces
	// with a folder (the outbox library): those must be copied first.
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	copied := ""
	for _, in := range instrs {
		if strings.Contains(in, "go mod download") {
			break
		}
		if word, rest, _ := strings.Cut(in, " "); strings.EqualFold(word, "COPY") {
			copied += " " + rest
		}
	}
	for _, line := range strings.Split(string(gomod), "\n") {
		_, dir, ok := strings.Cut(line, "=>")
		if dir = strings.TrimSpace(dir); !ok || !strings.HasPrefix(line, "replace ") || !strings.HasPrefix(dir, "./") {
			continue
		}
		if want := strings.TrimPrefix(dir, "./") + "/go.mod"; !strings.Contains(copied, want) {
			t.Errorf("Dockerfile runs go mod download before copying %s (go.mod replaces a module with %s); COPY it with go.mod", want, dir)
		}
	}
}

// TestDeployAlertRules checks the Prometheus rules: the expected alerts,
// each on an outboxrelay metric or up, with a severity and a summary.
func TestDeployAlertRules(t *testing.T) {
	docs := deployDocs(t, filepath.Join(deployDir, "prometheus", "alerts.yaml"))
	if len(docs) != 1 {
		t.Fatalf("alerts.yaml has %d documents, want 1", len(docs))
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := docs[0].Decode(&rules); err != nil {
		t.Fatal(err)
	}
	metric := regexp.MustCompile(`\boutboxrelay_[a-z_]+|\bup\b`)
	got := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			got[r.Alert] = true
			if !metric.MatchString(r.Expr) {
				t.Errorf("alert %s: expr %q uses no outboxrelay_ metric and not up", r.Alert, r.Expr)
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("alert %s needs a severity label and a summary annotation", r.Alert)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("alert %s: for %q: %v", r.Alert, r.For, err)
				}
			}
		}
	}
	for _, name := range []string{
		"OutboxRelayReplicationLagHigh", "OutboxRelayReplicationLagCritical", "OutboxRelayDeadLetters",
		"OutboxRelayInstanceDown", "OutboxRelayDown", "OutboxRelayNoProgress",
	} {
		if !got[name] {
			t.Errorf("alerts.yaml has no alert %s", name)
		}
	}
}

// TestDeployRelayRole runs the relay as the unprivileged role that
// deploy/postgres/init.sql creates (LOGIN REPLICATION, no superuser), the
// way the compose file does: migrate --grant as the owner, then relay a row, record
// checkpoints and send heartbeats without a privilege error.
func TestDeployRelayRole(t *testing.T) {
	ctx := t.Context()
	name := fmt.Sprintf("it_%d_%d", os.Getpid(), dbCounter.Add(1))
	ownerURL, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	initSQL, err := os.ReadFile(filepath.Join(deployDir, "postgres", "init.sql"))
	if err != nil {
		t.Fatal(err)
	}
	owner, err := pgx.Connect(ctx, ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Close(context.Background()) })
	if _, err := owner.Exec(ctx, string(initSQL), pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("init.sql: %v", err)
	}

	// pgserver trusts loopback, so the role's password is not checked here.
	relayURL := strings.Replace(ownerURL, "postgres://postgres@", "postgres://outboxrelay:outboxrelay@", 1)
	if relayURL == ownerURL {
		t.Fatalf("unexpected server URL %s", ownerURL)
	}
	e := &env{t: t, dbURL: relayURL, db: owner}
	if out, code := e.cli("migrate", "--database-url", ownerURL, "--grant", "outboxrelay"); code != 0 {
		t.Fatalf("migrate exited %d: %s", code, out)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), ownerURL)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		c.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active")
	})
	e.kafka, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.kafka.Close)
	e.brokers = e.kafka.ListenAddrs()[0]

	c := e.consume("outbox.order")
	p := e.start("OUTBOXRELAY_POSTGRES_HEARTBEAT_INTERVAL=200ms")
	p.waitLog(`"streaming"`, 30*time.Second)
	var id string
	if err := owner.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', '7', 'order.created', '{"order_id": 7}') RETURNING id::text`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	c.waitIDs([]string{id}, 30*time.Second)

	// The checkpoint is recorded by the relay's role, and heartbeats run.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var recorded bool
		err := owner.QueryRow(ctx, "SELECT EXISTS (SELECT FROM outboxrelay.checkpoint WHERE slot = 'outboxrelay' AND confirmed_lsn IS NOT NULL)").Scan(&recorded)
		if err != nil {
			t.Fatal(err)
		}
		if recorded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay's role recorded no checkpoint within 20s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // several heartbeats
	p.stop()
	for _, line := range strings.Split(p.out.String(), "\n") {
		if strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`) {
			if strings.Contains(line, "permission denied") || strings.Contains(line, "42501") || strings.Contains(line, "privilege") {
				t.Errorf("the relay's role lacks a privilege: %s", line)
			}
		}
	}
}
