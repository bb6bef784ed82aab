package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
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
)

// walkthroughSteps are the steps of the README's walkthrough, in order.
// The README marks each command block with <!-- walkthrough: STEP -->; a
// step missing, added or moved fails the test, so the README and the test
// cannot drift apart.
var walkthroughSteps = []string{"settings", "role", "config", "migrate", "run", "write", "consume", "status"}

// walkthroughSettings are the variables the settings step must define: the
// test gives them its own values (its database, its role, its broker).
var walkthroughSettings = []string{"ADMIN_URL", "OWNER_URL", "RELAY_ROLE", "RELAY_PASSWORD", "RELAY_URL", "KAFKA_BROKERS"}

type walkStep struct{ name, script string }

var walkBlockRE = regexp.MustCompile("(?m)^[ \t]*<!-- walkthrough: ([a-z]+) -->[ \t]*\n([ \t]*)```sh\n((?s:.*?))\n[ \t]*```")

// readmeSection returns the text of the README's section under heading
// (a "## " line), up to the next such heading.
func readmeSection(t *testing.T, heading string) string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README.md has no section %q", heading)
	}
	section := text[i+len(heading)+2:]
	if j := strings.Index(section, "\n## "); j >= 0 {
		section = section[:j]
	}
	return section
}

// readmeWalkthrough returns the marked command blocks of the README's
// section "Running it against your own database and broker", in order.
func readmeWalkthrough(t *testing.T) []walkStep {
	t.Helper()
	section := readmeSection(t, "## Running it against your own database and broker")
	var steps []walkStep
	for _, m := range walkBlockRE.FindAllStringSubmatch(section, -1) {
		indent := m[2]
		var lines []string
		for _, l := range strings.Split(m[3], "\n") {
			lines = append(lines, strings.TrimPrefix(l, indent))
		}
		steps = append(steps, walkStep{name: m[1], script: strings.Join(lines, "\n") + "\n"})
	}
	var names []string
	for _, s := range steps {
		names = append(names, s.name)
	}
	if !slices.Equal(names, walkthroughSteps) {
		t.Fatalf("the README's walkthrough has the steps %v, the test follows %v", names, walkthroughSteps)
	}
	return steps
}

// The README's walkthrough, from nothing to a consumed message: create the
// relay's role, write the config, migrate, run, write a row, consume it,
// run status. Every command is the README's own. The owner that migrates
// and writes is the database's owner and not a superuser, as on a real
// deployment; only the role step runs as the admin (the test's superuser).
func TestReadmeWalkthrough(t *testing.T) {
	steps := readmeWalkthrough(t)
	tools := map[string]string{}
	for _, tool := range []string{"bash", "psql", "kcat"} {
		path, err := exec.LookPath(tool)
		if err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed; the README's walkthrough uses it", tool)
			}
			t.Skipf("%s is not installed; the README's walkthrough uses it (CI=true makes this a failure)", tool)
		}
		tools[tool] = path
	}
	ctx := t.Context()
	dbURL, err := pg.CreateDatabase(ctx, fmt.Sprintf("walk_%d_%d", os.Getpid(), dbCounter.Add(1)))
	if err != nil {
		t.Fatalf("create database: %v", err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	e := &env{t: t, dbURL: dbURL, kafka: cluster, brokers: cluster.ListenAddrs()[0]}
	e.db = connectT(t, dbURL)

	role := fmt.Sprintf("walk_relay_%d", os.Getpid())
	password := "walk-Pa55word"
	relayURL, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	relayURL.User = url.UserPassword(role, password)

	// The owner: LOGIN, owner of the database (so it may create schemas,
	// the table in public and the publication), nothing else.
	owner := fmt.Sprintf("walk_owner_%d", os.Getpid())
	ownerPassword := "walk-0wner-Pa55word"
	ownerURL := *relayURL
	ownerURL.User = url.UserPassword(owner, ownerPassword)
	var database string
	if err := e.db.QueryRow(ctx, "SELECT current_database()").Scan(&database); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"CREATE ROLE " + pgx.Identifier{owner}.Sanitize() + " LOGIN PASSWORD '" + ownerPassword + "'",
		"ALTER DATABASE " + pgx.Identifier{database}.Sanitize() + " OWNER TO " + pgx.Identifier{owner}.Sanitize(),
	} {
		if _, err := e.db.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	settings := map[string]string{
		"ADMIN_URL": dbURL, "OWNER_URL": ownerURL.String(), "RELAY_ROLE": role, "RELAY_PASSWORD": password,
		"RELAY_URL": relayURL.String(), "KAFKA_BROKERS": e.brokers,
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), dbURL)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		defer func() {
			c.Exec(context.Background(), "REASSIGN OWNED BY "+pgx.Identifier{owner}.Sanitize()+" TO CURRENT_USER")
			c.Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{owner}.Sanitize())
			c.Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{owner}.Sanitize())
		}()
		for attempt := 0; attempt < 50; attempt++ {
			c.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
				WHERE database = current_database() AND active_pid IS NOT NULL`)
			c.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active")
			var left int
			if c.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").Scan(&left) != nil || left == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
		c.Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize())
	})

	dir := t.TempDir()
	// Every command runs in one directory, with the relay binary first on
	// PATH and the settings in the environment. http.listen is overridden
	// (the environment wins over the file) so that the test takes a free port.
	environ := append(cleanEnv(), "PATH="+filepath.Dir(relayBin)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"OUTBOXRELAY_HTTP_LISTEN=127.0.0.1:0", "PGCONNECT_TIMEOUT=10")
	for _, k := range walkthroughSettings {
		environ = append(environ, k+"="+settings[k])
	}
	shell := func(ctx context.Context, script string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, tools["bash"], "-euo", "pipefail", "-c", script)
		cmd.Dir, cmd.Env = dir, environ
		return cmd
	}
	runStep := func(s walkStep, timeout time.Duration) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		out, err := shell(ctx, s.script).CombinedOutput()
		if err != nil {
			t.Fatalf("walkthrough step %q failed (%v):\n%s\noutput:\n%s", s.name, err, s.script, out)
		}
		t.Logf("step %s:\n%s%s", s.name, s.script, out)
		return string(out)
	}

	var relay *proc
	var messageID string
	for _, s := range steps {
		switch s.name {
		case "settings":
			var defined []string
			for _, line := range strings.Split(strings.TrimSpace(s.script), "\n") {
				name, _, ok := strings.Cut(line, "=")
				if !ok || strings.ContainsAny(name, " \t") {
					t.Fatalf("the settings step has a line that is not NAME=value: %q", line)
				}
				defined = append(defined, name)
			}
			if !slices.Equal(defined, walkthroughSettings) {
				t.Fatalf("the settings step defines %v; the test gives values to %v", defined, walkthroughSettings)
			}
		case "role":
			// The owner alone cannot create a role with REPLICATION: the
			// README's reason for an admin.
			out, err := shell(ctx, strings.ReplaceAll(s.script, "$ADMIN_URL", "$OWNER_URL")).CombinedOutput()
			if err == nil || !strings.Contains(string(out), "must be superuser to create replication users") &&
				!strings.Contains(string(out), "permission denied to create role") {
				t.Fatalf("the role step as the owner: %v, want the errors the README names:\n%s", err, out)
			}
			runStep(s, 2*time.Minute)
		case "run":
			if strings.Count(strings.TrimSpace(s.script), "\n") != 0 {
				t.Fatalf("the run step must be one command, the test runs it in the background:\n%s", s.script)
			}
			relay = e.startCmd(shell(context.Background(), "exec "+strings.TrimSpace(s.script)))
			relay.waitLog(`"http listening"`, 30*time.Second)
		case "write":
			runStep(s, time.Minute)
			var ids []string
			rows, err := e.db.Query(ctx, "SELECT id::text FROM public.outbox")
			if err == nil {
				ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
			}
			if err != nil || len(ids) != 1 {
				t.Fatalf("after the write step the outbox holds %v (%v), want one row", ids, err)
			}
			messageID = ids[0]
		case "consume":
			// kcat fails on a topic that does not exist yet: the relay
			// creates it with its first publish, which may come after the
			// write step returns. Run the step once the row is there.
			e.consume("outbox.order").waitIDs([]string{messageID}, time.Minute)
			out := runStep(s, time.Minute)
			for _, want := range []string{"key 42", "message_id=" + messageID, `"message_id":"` + messageID + `"`, `"order_id": 42`} {
				if !strings.Contains(out, want) {
					t.Fatalf("the consume step printed no %q:\n%s", want, out)
				}
			}
		case "status":
			// The relay records its checkpoint every postgres.status_interval:
			// status turns healthy and counts the message within a few.
			deadline := time.Now().Add(60 * time.Second)
			for {
				ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				out, err := shell(ctx, s.script).CombinedOutput()
				cancel()
				if err == nil && strings.Contains(string(out), messageID) {
					t.Logf("step status:\n%s%s", s.script, out)
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("status did not turn healthy with the message %s within 60s (%v):\n%s", messageID, err, out)
				}
				time.Sleep(500 * time.Millisecond)
			}
		default:
			runStep(s, 2*time.Minute)
		}
	}

	// The ledger: the one committed row arrived exactly once, keyed by its
	// aggregate.
	recs := e.consume("outbox.order").waitIDs([]string{messageID}, 30*time.Second)
	time.Sleep(500 * time.Millisecond)
	if len(recs) != 1 || recs[0].Key != "42" {
		t.Fatalf("outbox.order holds %d records (%+v), want the one row once", len(recs), recs)
	}

	// build_info carries what `version --json` prints.
	out, err := exec.Command(relayBin, "version", "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var build struct{ Version, Revision string }
	if err := json.Unmarshal(out, &build); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + relay.httpAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var line string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, "outboxrelay_build_info{") {
			line = l
		}
	}
	if !strings.Contains(line, fmt.Sprintf(`revision=%q`, build.Revision)) || !strings.Contains(line, fmt.Sprintf(`version=%q`, build.Version)) {
		t.Fatalf("build_info is %q; version --json says %s", line, out)
	}
	relay.stop()
}
