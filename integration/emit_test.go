package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

const emitTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// TestEmitFunction: outboxrelay.emit, the SQL producer migrate installs,
// called from pgx, from psql and from Node's pg (the interop client), writes
// rows the relay delivers like any other, and a table-less message when
// outboxrelay.emit_mode is 'message'. It refuses a reserved header name, in
// any case, and a traceparent that is not W3C's, with SQLSTATE 22023 and
// nothing written. Checked against the ledger of returned ids: each
// delivered once to Kafka (kfake), with its headers and traceparent.
func TestEmitFunction(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()

	for _, tc := range []struct{ headers, traceparent, want string }{
		{`{"Message_ID": "x"}`, "", `header "Message_ID" is a name the relay sets itself`},
		{`{"ce_type": "x"}`, "", `header "ce_type" starts with ce_`},
		{`["tenant"]`, "", "headers must be a JSON object, not array"},
		{`{}`, "00-abc", `traceparent "00-abc" is not a W3C traceparent`},
		{`{}`, strings.ToUpper(emitTraceparent), "is not a W3C traceparent"},
		{`{}`, "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "is not a W3C traceparent"},
		{`{}`, "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "is not a W3C traceparent"},
		{`{}`, emitTraceparent + "-x", "is not a W3C traceparent"},
	} {
		var tp any
		if tc.traceparent != "" {
			tp = tc.traceparent
		}
		_, err := e.db.Exec(ctx, `SELECT outboxrelay.emit('order', 'a', 'order.created', '{}', $1::jsonb, $2)`, tc.headers, tp)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "22023" || !strings.Contains(pe.Message, tc.want) {
			t.Errorf("emit(headers %s, traceparent %q): %v; want SQLSTATE 22023 %q", tc.headers, tc.traceparent, err, tc.want)
		}
	}
	if _, err := e.db.Exec(ctx, `SELECT outboxrelay.emit('order', '', 'order.created', '{}')`); err == nil || !strings.Contains(err.Error(), "must be non-empty") {
		t.Errorf("empty aggregate id: %v", err)
	}
	var rows int
	if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("refused calls wrote %d rows (%v)", rows, err)
	}

	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)

	want := map[string]string{} // id -> aggregate id
	var id string
	if err := e.db.QueryRow(ctx, `SELECT outboxrelay.emit('order', 'pgx-1', 'order.created', '{"n": 1}', '{"tenant": "acme"}', $1)::text`,
		emitTraceparent).Scan(&id); err != nil {
		t.Fatal(err)
	}
	want[id] = "pgx-1"
	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL outboxrelay.emit_mode = 'message'`); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT outboxrelay.emit('order', 'msg-1', 'order.created', '{"n": 2}', '{"tenant": "acme"}', $1)::text`,
		emitTraceparent).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want[id] = "msg-1"

	// psql, as an operator or a shell script would call it.
	psql, err := exec.LookPath("psql")
	if err != nil {
		missingClient(t, "psql", "install Debian's postgresql-client")
	}
	out, err := exec.CommandContext(ctx, psql, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", e.dbURL, "-c",
		`SELECT outboxrelay.emit('order', 'psql-1', 'order.created', '{"n": 3}', '{"tenant": "acme"}', '`+emitTraceparent+`')`).CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v: %s", err, out)
	}
	want[strings.TrimSpace(string(out))] = "psql-1"
	out, err = exec.CommandContext(ctx, psql, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", e.dbURL, "-c",
		`SELECT outboxrelay.emit('order', 'psql-1', 'order.created', '{}', '{"traceparent": "x"}')`).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `header "traceparent" is a name the relay sets itself`) {
		t.Errorf("psql with a reserved header: %v: %s", err, out)
	}

	// Node's pg, the driver a Node service uses.
	mods := interopNodeModules(t)
	if _, err := os.Stat(filepath.Join(mods, "pg", "package.json")); err != nil {
		missingClient(t, "npm package pg", "run .ci/interop-deps")
	}
	cmd := exec.CommandContext(ctx, "node", "interop/pg-emit.js", e.dbURL)
	cmd.Env = append(os.Environ(), "NODE_PATH="+mods)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err = cmd.Output()
	if err != nil {
		t.Fatalf("node pg-emit.js: %v: %s", err, stderr.String())
	}
	var node struct {
		ID      string `json:"id"`
		Refused *struct{ Code, Message string }
	}
	if err := json.Unmarshal(out, &node); err != nil {
		t.Fatalf("pg-emit.js printed %q: %v", out, err)
	}
	if node.Refused == nil || node.Refused.Code != "22023" || !strings.Contains(node.Refused.Message, `header "message_id"`) {
		t.Errorf("node pg, reserved header: %+v", node.Refused)
	}
	want[node.ID] = "node-1"

	recs := e.rawRecords("outbox.order", len(want))
	p.stop()
	seen := map[string]int{}
	for _, r := range recs {
		hs := map[string]string{}
		for _, h := range r.Headers {
			hs[h.Key] = string(h.Value)
		}
		id := hs["message_id"]
		seen[id]++
		agg, ok := want[id]
		if !ok {
			t.Errorf("record %q is no emitted event", id)
			continue
		}
		if string(r.Key) != agg || hs["tenant"] != "acme" || hs["traceparent"] != emitTraceparent {
			t.Errorf("record %s: key %q, headers %v", id, r.Key, hs)
		}
	}
	for id := range want {
		if seen[id] != 1 {
			t.Errorf("event %s delivered %d times, want once", id, seen[id])
		}
	}
	if len(recs) != len(want) {
		t.Errorf("%d records, want %d", len(recs), len(want))
	}
}
