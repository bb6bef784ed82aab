package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dashboard is the part of deploy/grafana/outboxrelay.json the test reads.
type dashboard struct {
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// startPrometheus runs a Prometheus server that scrapes the relay at
// target every second and returns its base URL. It is stopped at cleanup.
func startPrometheus(t *testing.T, bin, target string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: kubernetes-pods
    static_configs:
      - targets: [%q]
        labels: {pod: outboxrelay-a}
`, target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	base := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return base
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready within 30s:\n%s", tail(out.String(), 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// promQuery evaluates query now and returns the number of series in the
// result, or an error for an invalid query.
func promQuery(base, query string) (int, error) {
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, fmt.Errorf("decode answer (HTTP %d): %w", resp.StatusCode, err)
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("%s", r.Error)
	}
	return len(r.Data.Result), nil
}

// TestDashboardQueries runs a real Prometheus that scrapes a real relay
// under load and evaluates every query of deploy/grafana/outboxrelay.json:
// each must be valid and return data.
func TestDashboardQueries(t *testing.T) {
	promBin := needTool(t, "prometheus", "prometheus")
	data, err := os.ReadFile(filepath.Join(deployDir, "grafana", "outboxrelay.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("outboxrelay.json: %v", err)
	}
	wantPanels := map[string]string{ // a word of each required panel's title, and its type
		"Lag (bytes)": "timeseries", "Lag (seconds)": "timeseries", "max_slot_wal_keep_size": "timeseries",
		"per destination": "timeseries", "latency": "heatmap", "dead letters": "timeseries",
		"In-flight": "timeseries", "Active replica": "state-timeline",
	}
	for word, typ := range wantPanels {
		found := false
		for _, p := range d.Panels {
			found = found || (strings.Contains(p.Title, word) && p.Type == typ)
		}
		if !found {
			t.Errorf("dashboard has no %s panel titled with %q", typ, word)
		}
	}

	// A server of its own, with a max_slot_wal_keep_size for the retained-WAL panel.
	srv, _ := startServer(t, map[string]string{"max_slot_wal_keep_size": "1GB"})
	e := newEnvOn(t, srv)
	p := e.start("OUTBOXRELAY_POSTGRES_HEARTBEAT_INTERVAL=1s")
	relayAddr := p.httpAddr()
	p.waitLog(`"streaming"`, 30*time.Second)
	prom := startPrometheus(t, promBin, relayAddr)

	wait := e.insertLoop(80, 20, 150*time.Millisecond)
	ids := wait()
	c := e.consume("outbox.order")
	c.waitIDs(ids, 60*time.Second)
	t.Logf("relayed %d rows under load while Prometheus scraped every second", len(ids))

	vars := strings.NewReplacer("$slot", "outboxrelay", "${slot}", "outboxrelay", "$__rate_interval", "20s", "$__interval", "5s")
	var failures []string
	check := func() bool {
		failures = failures[:0]
		for _, p := range d.Panels {
			if len(p.Targets) == 0 {
				failures = append(failures, fmt.Sprintf("panel %q has no query", p.Title))
			}
			for _, tg := range p.Targets {
				q := vars.Replace(tg.Expr)
				n, err := promQuery(prom, q)
				switch {
				case err != nil:
					failures = append(failures, fmt.Sprintf("panel %q: %s: invalid: %v", p.Title, q, err))
				case n == 0:
					failures = append(failures, fmt.Sprintf("panel %q: %s: no data", p.Title, q))
				}
			}
		}
		for _, v := range d.Templating.List {
			if v.Type != "query" {
				continue
			}
			q := strings.TrimSuffix(strings.TrimPrefix(v.Definition, "label_values("), ")")
			metric, label, _ := strings.Cut(q, ", ")
			if n, err := promQuery(prom, fmt.Sprintf("count by (%s) (%s)", label, metric)); err != nil || n == 0 {
				failures = append(failures, fmt.Sprintf("variable %s (%s): %d values, %v", v.Name, v.Definition, n, err))
			}
		}
		return len(failures) == 0
	}
	// Rates need a few scrapes; retry for a while before calling data missing.
	for deadline := time.Now().Add(30 * time.Second); !check() && time.Now().Before(deadline); {
		time.Sleep(time.Second)
	}
	if len(failures) > 0 {
		t.Errorf("dashboard queries:\n%s", strings.Join(failures, "\n"))
	}
	p.stop()
}
