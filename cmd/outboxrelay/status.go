package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/internal/store"
)

// cmdStatus prints the checkpoint status of a slot and exits 1 when the
// slot is missing, has lost (or is about to lose) WAL, or lags more than
// --max-lag-bytes. The status is printed in every case.
func cmdStatus(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("status", "status --database-url URL [--slot NAME | --all] [--json | -o json|wide] [--max-lag-bytes N] [--relay URL] [--watch [--interval 2s]]",
		"Print the checkpoint status of a replication slot, or with --all of every logical slot of the server. Exits 1 when the slot is missing, lost or over --max-lag-bytes, or (--all) when a slot is flagged: inactive and retaining WAL, or lost.")
	url := fs.String("database-url", "", "PostgreSQL URL")
	slot := fs.String("slot", envOr("OUTBOXRELAY_POSTGRES_SLOT", cdc.Config{}.WithDefaults().Slot), "replication slot (or OUTBOXRELAY_POSTGRES_SLOT)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	maxLag := fs.Int64("max-lag-bytes", 0, "unhealthy when the lag is over this many bytes (0: no limit)")
	all := fs.Bool("all", false, "list every logical slot: active, inactive since, retained WAL, wal_status, relay checkpoint; flags inactive slots that retain WAL")
	output := fs.String("o", "", "output format: `json|wide` (wide: more columns with --all)")
	watch := fs.Bool("watch", false, "print again every --interval until interrupted: redrawn in place on a terminal, one line per interval otherwise")
	interval := fs.Duration("interval", 2*time.Second, "how often --watch reads the status")
	relayURL := fs.String("relay", "", "the running relay's HTTP address (http.listen, as `http://127.0.0.1:8080`): with several sinks (the sinks section), each sink's own watermark and lag, which only the running relay knows, are read from its /status (bearer token from OUTBOXRELAY_HTTP_TOKEN when set) and printed, one line a sink")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch *output {
	case "":
	case "json":
		*asJSON = true
	case "wide":
	default:
		return usageErr("status: -o %q is unknown; use json or wide", *output)
	}
	if *interval <= 0 {
		return usageErr("status: --interval must be above 0")
	}
	if *maxLag < 0 {
		return usageErr("status: --max-lag-bytes must not be negative")
	}
	if *slot == "" {
		return usageErr("status: --slot must not be empty")
	}
	dbURL, err := databaseURL(*url)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *relayURL != "" && (*watch || *all) {
		return usageErr("status: --relay reads one relay's sinks; it does not go with --watch or --all")
	}
	if *watch || *all {
		return statusAll(ctx, dbURL, statusView{all: *all, slot: *slot, json: *asJSON, wide: *output == "wide",
			maxLag: *maxLag, watch: *watch, interval: *interval}, stdout)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	st, err := store.ReadStatus(ctx, conn, *slot)
	if err != nil {
		return usageErr("status: %v", err)
	}
	if *relayURL != "" {
		sinks, err := relaySinks(ctx, *relayURL, os.Getenv("OUTBOXRELAY_HTTP_TOKEN"))
		if err != nil {
			st.Warnings = append(st.Warnings, fmt.Sprintf("each sink's own lag is unknown: %v", err))
		}
		st.Sinks = sinks
	}
	if err := printStatus(stdout, st, *asJSON, time.Now()); err != nil {
		return err
	}
	return healthErr(st, *maxLag)
}

func printStatus(w io.Writer, st store.Status, asJSON bool, now time.Time) error {
	if !asJSON {
		return store.WriteText(w, st, now)
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// healthErr is nil for a healthy slot and an exit-1 error naming every
// problem otherwise.
func healthErr(st store.Status, maxLagBytes int64) error {
	problems := st.Problems(maxLagBytes)
	if len(problems) == 0 {
		return nil
	}
	return &exitError{code: exitUnhealthy, err: errors.New("unhealthy: " + strings.Join(problems, "; "))}
}

// relaySinks reads each sink's own progress from the /status of the relay
// at base (Status.Sinks): none when the relay feeds one sink.
func relaySinks(ctx context.Context, base, token string) ([]store.SinkStatus, error) {
	u := strings.TrimSuffix(base, "/") + "/status"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("--relay %q: %v", base, err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the relay at %s did not answer: %v", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the relay at %s answered %s to GET /status", base, resp.Status)
	}
	var body struct {
		Sinks []store.SinkStatus `json:"sinks"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body); err != nil {
		return nil, fmt.Errorf("the relay at %s: GET /status: %v", base, err)
	}
	return body.Sinks, nil
}

// envOr returns the environment variable name, or def when it is unset or empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
