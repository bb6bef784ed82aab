package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/store"
)

func TestStatusExitCodes(t *testing.T) {
	ok := store.Status{Slot: "outboxrelay", Exists: true, WALStatus: "reserved", ConfirmedFlushLSN: 0x100, CurrentWALLSN: 0x900, LagBytes: 0x800}
	tests := []struct {
		name   string
		edit   func(*store.Status)
		maxLag int64
		code   int
		msg    string
	}{
		{"healthy", func(*store.Status) {}, 0, exitOK, ""},
		{"under the limit", func(*store.Status) {}, 4096, exitOK, ""},
		{"over the limit", func(*store.Status) {}, 1024, exitUnhealthy, "lag of 2048 bytes is over the limit of 1024 bytes"},
		{"missing", func(s *store.Status) { *s = store.Status{Slot: "outboxrelay"} }, 0, exitUnhealthy, `slot "outboxrelay" does not exist`},
		{"lost", func(s *store.Status) { s.WALStatus = "lost" }, 0, exitUnhealthy, "wal_status=lost"},
		{"unreserved", func(s *store.Status) { s.WALStatus = "unreserved" }, 0, exitUnhealthy, "wal_status=unreserved"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := ok
			tt.edit(&st)
			err := healthErr(st, tt.maxLag)
			code := exitOK
			var ee *exitError
			if errors.As(err, &ee) {
				code = ee.code
			} else if err != nil {
				t.Fatalf("healthErr = %v, not an exitError", err)
			}
			if code != tt.code || (tt.msg != "" && !strings.Contains(err.Error(), tt.msg)) {
				t.Errorf("healthErr = %v (exit %d), want exit %d with %q", err, code, tt.code, tt.msg)
			}
		})
	}
}

func TestPrintStatus(t *testing.T) {
	st := store.Status{Slot: "gone", CurrentWALLSN: 0x5000}
	var text, js bytes.Buffer
	if err := printStatus(&text, st, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(text.String(), "slot                 gone\nexists               false\n") {
		t.Errorf("text:\n%s", text.String())
	}
	if err := printStatus(&js, st, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(js.Bytes(), &m); err != nil {
		t.Fatalf("--json output is not one object: %v\n%s", err, js.String())
	}
	if m["exists"] != false || m["lag_bytes"] != nil || m["lag_seconds"] != nil || len(m) != 16 {
		t.Errorf("--json object: %v", m)
	}
}

func TestStatusUsage(t *testing.T) {
	t.Setenv("OUTBOXRELAY_POSTGRES_URL", "")
	t.Setenv("DATABASE_URL", "")
	for _, args := range [][]string{
		{"status"},
		{"status", "--database-url", "postgres://x@127.0.0.1:1/x", "--max-lag-bytes", "-1"},
		{"status", "--database-url", "postgres://x@127.0.0.1:1/x", "--max-lag-bytes", "many"},
		{"status", "--database-url", "postgres://x@127.0.0.1:1/x", "extra"},
		{"status", "--database-url", "postgres://relay:hunter2@127.0.0.1:1/x?connect_timeout=2"},
	} {
		var stdout, stderr bytes.Buffer
		code := runMain(args, &stdout, &stderr)
		if code != exitUsage || strings.Count(stderr.String(), "\n") != 1 || strings.Contains(stderr.String(), "hunter2") {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 with one line and no password", args, code, stderr.String())
		}
	}
}

// TestWatchLine: the line `status --watch` prints per reading carries the
// lag in seconds next to the lag in bytes, "-" until it is known.
func TestWatchLine(t *testing.T) {
	now := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	st := store.Status{Slot: "outboxrelay", Exists: true, Active: true, WALStatus: "reserved", LagBytes: 2048,
		LagSeconds: 3.25, LagSince: now.Add(-3250 * time.Millisecond), PublishedTotal: 7}
	want := "2026-12-02T06:00:00Z slot=outboxrelay exists=true active=true wal_status=reserved lag_bytes=2048 lag_seconds=3.2 published_total=7 republished_total=0 dead_letters=0"
	if got := watchLine(st, now); got != want {
		t.Errorf("watch line\n%s\nwant\n%s", got, want)
	}
	st.LagSince = time.Time{}
	if got := watchLine(st, now); !strings.Contains(got, " lag_seconds=- ") {
		t.Errorf("watch line without a recorded lag: %s", got)
	}
}

// TestStatusRelaySinks: with --relay, status reads each sink's own progress
// from the running relay's /status (with the bearer token) and prints a line
// per sink; a relay that refuses or does not answer is one error that says
// the sinks' lag is unknown.
func TestStatusRelaySinks(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/status" || r.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		fmt.Fprint(w, `{"slot": "outboxrelay", "sinks": [
			{"name": "analytics", "confirmed_lsn": "0/3000", "lag_bytes": 0, "lag_seconds": null, "ready": true, "retrying": false},
			{"name": "partner", "confirmed_lsn": "0/1000", "lag_bytes": 8192, "lag_seconds": 15.25, "ready": true, "retrying": true}]}`)
	}))
	defer srv.Close()
	sinks, err := relaySinks(t.Context(), srv.URL+"/", "s3cret")
	if err != nil || len(sinks) != 2 {
		t.Fatalf("relaySinks: %v, %v", sinks, err)
	}
	var text bytes.Buffer
	st := store.Status{Slot: "outboxrelay", Exists: true, ConfirmedFlushLSN: 0x1000, CurrentWALLSN: 0x3000, Sinks: sinks}
	if err := printStatus(&text, st, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"\nsink analytics       confirmed 0/3000, lag_bytes 0, lag_seconds -\n",
		"\nsink partner         confirmed 0/1000, lag_bytes 8192 (8.0 KiB), lag_seconds 15.2, retrying\n",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text:\n%s\nwant the line %q", text.String(), want)
		}
	}
	if _, err := relaySinks(t.Context(), srv.URL, "wrong"); err == nil || !strings.Contains(err.Error(), "answered 401 Unauthorized to GET /status") {
		t.Errorf("a refused token: %v", err)
	}
	srv.Close()
	if _, err := relaySinks(t.Context(), srv.URL, "s3cret"); err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Errorf("a relay that does not answer: %v", err)
	}
}
