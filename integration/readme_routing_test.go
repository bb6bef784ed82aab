package integration

import (
	"bytes"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// readmeRoutingBlocks are the marked code blocks of the README's Routing
// section, in order. The README marks each with <!-- routing: NAME --> or
// <!-- producer: NAME -->; a block missing, added or moved fails the test,
// so the README and the test cannot drift apart.
var readmeRoutingBlocks = []string{
	"routing: config", "routing: rules-test", "routing: rules-output",
	"producer: psql", "producer: python", "producer: node", "producer: java",
}

var routingBlockRE = regexp.MustCompile("(?m)^<!-- ((?:routing|producer): [a-z-]+) -->\n```[a-z]*\n((?s:.*?))\n```")

// readmeRouting returns the marked blocks of the README's section
// "Routing", by name.
func readmeRouting(t *testing.T) map[string]string {
	t.Helper()
	section := readmeSection(t, "## Routing")
	blocks := map[string]string{}
	var names []string
	for _, m := range routingBlockRE.FindAllStringSubmatch(section, -1) {
		names = append(names, m[1])
		blocks[m[1]] = m[2] + "\n"
	}
	if !slices.Equal(names, readmeRoutingBlocks) {
		t.Fatalf("the README's Routing section has the blocks %v, the test follows %v", names, readmeRoutingBlocks)
	}
	return blocks
}

// TestReadmeRouting runs the README's Routing section as written: its
// `rules test` command on its rows prints the output the README shows; its
// configuration, with the test's broker, webhook receiver and secret file
// in place of the README's, runs the relay; and each producer snippet
// (psql, Python psycopg, Node pg, Java JDBC) writes one order and its
// event in one transaction. Checked: each event row as the snippet wrote
// it, in the transaction of its order row (same xmin); each delivered once
// to Kafka (kfake) by the route orders, with the transform's key and
// header, and once to the webhook by the route big-orders, signed. A
// snippet whose runtime is missing skips its subtest (fails under CI=true).
func TestReadmeRouting(t *testing.T) {
	blocks := readmeRouting(t)
	bash, err := exec.LookPath("bash")
	if err != nil {
		missingClient(t, "bash", "install Debian's bash")
	}
	e := newEnv(t)
	ctx := t.Context()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "outboxrelay.yaml"), []byte(blocks["routing: config"]), 0o600); err != nil {
		t.Fatal(err)
	}
	pathEnv := "PATH=" + filepath.Dir(relayBin) + string(os.PathListSeparator) + os.Getenv("PATH")

	// The dry run, in a folder holding the README's configuration.
	cmd := exec.CommandContext(ctx, bash, "-eu", "-o", "pipefail", "-c", blocks["routing: rules-test"])
	cmd.Dir, cmd.Env = dir, append(cleanEnv(), pathEnv)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the README's rules test: %v\n%s%s", err, out, stderr.String())
	}
	if got, want := string(out), blocks["routing: rules-output"]; got != want {
		t.Errorf("the README's rules test prints\n%s\nthe README shows\n%s", got, want)
	}

	// The configuration, run: only the README's placeholders are replaced.
	recv := newOutageReceiver(t)
	secret := filepath.Join(dir, "partner-secret")
	if err := os.WriteFile(secret, []byte(e2eWebhookSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := blocks["routing: config"]
	for _, r := range [][2]string{{"kafka-1:9092", e.brokers}, {"https://partner.example/hooks", recv.srv.URL + "/hooks"}, {"/run/secrets/partner", secret}} {
		if !strings.Contains(cfg, r[0]) {
			t.Fatalf("the README's routing configuration no longer names %s, which the test replaces", r[0])
		}
		cfg = strings.ReplaceAll(cfg, r[0], r[1])
	}
	cfg = "postgres:\n  url: " + e.dbURL + "\n  status_interval: 200ms\nhttp:\n  listen: 127.0.0.1:0\nlog:\n  level: info\n" + cfg
	e.exec(`CREATE TABLE orders (id int NOT NULL, total numeric NOT NULL)`)
	p := e.startConfig(cfg)
	p.waitLog(`"streaming"`, 30*time.Second)

	producers := map[string]string{} // message id -> producer
	run := func(name string, produce func(t *testing.T) []byte) {
		t.Run(name, func(t *testing.T) {
			out := produce(t)
			id := strings.TrimSpace(string(out))
			var aggType, aggID, event, total, tenant string
			var sameTx int
			if err := e.db.QueryRow(ctx, `SELECT aggregate_type, aggregate_id, event_type, payload->>'total', headers->>'tenant',
				(SELECT count(*) FROM orders WHERE orders.xmin = outbox.xmin)
				FROM outbox WHERE id::text = $1`, id).Scan(&aggType, &aggID, &event, &total, &tenant, &sameTx); err != nil {
				t.Fatalf("the %s snippet printed %q: no such outbox row: %v", name, out, err)
			}
			// JavaScript writes 250.0 as 250.
			if aggType != "order" || aggID != "42" || event != "order.created" || strings.TrimSuffix(total, ".0") != "250" || tenant != "acme" {
				t.Errorf("%s wrote (%s, %s, %s, total %s, tenant %s); want (order, 42, order.created, total 250, tenant acme)",
					name, aggType, aggID, event, total, tenant)
			}
			if sameTx != 1 {
				t.Errorf("%s: %d order rows in the event's transaction, want 1", name, sameTx)
			}
			producers[id] = name
		})
	}
	env := append(cleanEnv(), "DATABASE_URL="+e.dbURL)
	runIn := func(t *testing.T, cmd *exec.Cmd) []byte {
		t.Helper()
		cmd.Dir, cmd.Env = dir, env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: %v\n%s%s", cmd.Args, err, out, stderr.String())
		}
		return out
	}
	run("psql", func(t *testing.T) []byte {
		if _, err := exec.LookPath("psql"); err != nil {
			missingClient(t, "psql", "install Debian's postgresql-client")
		}
		return runIn(t, exec.CommandContext(ctx, bash, "-eu", "-o", "pipefail", "-c", blocks["producer: psql"]))
	})
	run("python", func(t *testing.T) []byte {
		py := pythonImporting(t, "psycopg", "python3-psycopg")
		return runIn(t, exec.CommandContext(ctx, py, "-c", blocks["producer: python"]))
	})
	run("node", func(t *testing.T) []byte {
		mods := interopNodeModules(t)
		if _, err := os.Stat(filepath.Join(mods, "pg", "package.json")); err != nil {
			missingClient(t, "npm package pg", "run .ci/interop-deps")
		}
		// An ES module finds its packages in a node_modules folder above
		// it (NODE_PATH is for require only).
		nodeDir := t.TempDir()
		if err := os.Symlink(mods, filepath.Join(nodeDir, "node_modules")); err != nil {
			t.Fatal(err)
		}
		script := filepath.Join(nodeDir, "emit.mjs")
		if err := os.WriteFile(script, []byte(blocks["producer: node"]), 0o600); err != nil {
			t.Fatal(err)
		}
		return runIn(t, exec.CommandContext(ctx, "node", script))
	})
	run("java", func(t *testing.T) []byte {
		const driver = "/usr/share/java/postgresql.jar" // Debian's libpostgresql-jdbc-java
		if _, err := exec.LookPath("java"); err != nil {
			missingClient(t, "java", "install Debian's default-jdk-headless")
		}
		if _, err := os.Stat(driver); err != nil {
			missingClient(t, "the PostgreSQL JDBC driver "+driver, "apt-get install libpostgresql-jdbc-java (.ci/services does)")
		}
		javaDir := t.TempDir()
		if err := os.WriteFile(filepath.Join(javaDir, "Emit.java"), []byte(blocks["producer: java"]), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, "java", "-cp", driver, filepath.Join(javaDir, "Emit.java"))
		env = append(env, "JDBC_URL="+jdbcURL(t, e.dbURL))
		return runIn(t, cmd)
	})
	if len(producers) == 0 {
		if t.Failed() {
			t.FailNow()
		}
		// Under CI=true a missing runtime has failed its subtest already.
		t.Skip("every producer snippet skipped (reasons above): no event to check delivery of")
	}

	// Delivery: the route orders to Kafka, the route big-orders (which
	// says continue) to the webhook; every event once on each.
	recs := e.rawRecords("orders.order.created", len(producers))
	seen := map[string]int{}
	for _, r := range recs {
		hs := map[string]string{}
		for _, h := range r.Headers {
			hs[h.Key] = string(h.Value)
		}
		id := hs["message_id"]
		seen[id]++
		if _, ok := producers[id]; !ok {
			t.Errorf("record %q on orders.order.created is no emitted event", id)
			continue
		}
		if string(r.Key) != "order:42" || hs["x-tenant"] != "acme" || hs["tenant"] != "acme" {
			t.Errorf("record of %s: key %q, headers %v; want key order:42 (the transform's) and x-tenant and tenant acme", producers[id], r.Key, hs)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for recv.distinct() < len(producers) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	p.stop()
	for id, name := range producers {
		if seen[id] != 1 {
			t.Errorf("the %s event %s reached Kafka %d times, want once", name, id, seen[id])
		}
		if _, ok := recv.receivedAt(id); !ok {
			t.Errorf("the %s event %s never reached the webhook", name, id)
		}
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recs) != len(producers) || recv.dups != 0 || len(recv.badSigns) != 0 {
		t.Errorf("%d Kafka records for %d events; webhook: %d duplicates, bad signatures %v", len(recs), len(producers), recv.dups, recv.badSigns)
	}
}

// jdbcURL returns the JDBC form of a postgres:// URL.
func jdbcURL(t *testing.T, pgURL string) string {
	t.Helper()
	u, err := url.Parse(pgURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("user", u.User.Username())
	if pw, ok := u.User.Password(); ok {
		q.Set("password", pw)
	}
	return "jdbc:postgresql://" + u.Host + u.Path + "?" + q.Encode()
}
