package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"go.yaml.in/yaml/v3"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/app"
	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/rules"
	"github.com/outboxrelay/outboxrelay/relay"
)

// cmdRules runs `outboxrelay rules test --config FILE ROWS.jsonl`: it
// compiles the file's routes, unmatched and transform keys (every other key
// is left alone) and prints, for each row of ROWS.jsonl, the route,
// destination, key and headers the rules give it, or why it is dropped or
// dead-lettered. A rule that does not compile is exit 2 with its error.
// With --from-table N instead of a file, the rows are the newest N of the
// configured outbox tables, read as the relay reads them (see
// rulesFromTable).
func cmdRules(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("rules test", "rules test --config FILE (ROWS.jsonl | --from-table N)",
		"Dry-runs the routing rules of FILE (routes, unmatched, transform) on sample rows, one JSON object a line with the outbox table's columns (id, aggregate_type, aggregate_id, event_type, payload, headers, and any other), or with --from-table N on the newest N rows of the configured outbox tables, and prints each row's route, destination, key and headers, or why it is dropped or dead-lettered (by a rule, or by its schema when FILE sets relay.schemas). Nothing is sent, and nothing is written to the database.")
	configPath := fs.String("config", "", "the configuration file whose rules to test")
	fromTable := fs.String("from-table", "", "dry-run on the newest `N` rows of the configured outbox tables (postgres.url, postgres.tables, postgres.columns), newest by postgres.columns.created_at, or by the id column when created_at is not mapped; printed oldest first, in commit order per aggregate. Read in a read-only transaction")
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help") {
		return &exitError{code: exitOK, err: &helpRequest{fs}}
	}
	if len(args) == 0 || args[0] != "test" {
		return usageErr("rules: want `outboxrelay rules test --config FILE ROWS.jsonl` or `--from-table N`; see outboxrelay rules --help")
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &exitError{code: exitOK, err: &helpRequest{fs}}
		}
		return usageErr("rules test: %v", err)
	}
	if *fromTable != "" {
		n, err := strconv.Atoi(*fromTable)
		switch {
		case err != nil || n <= 0:
			return usageErr("rules test: --from-table %q: want a positive number of rows, as in --from-table 20", *fromTable)
		case *configPath == "":
			return usageErr("rules test: --from-table needs --config FILE, whose postgres section says where the outbox is")
		case fs.NArg() > 0:
			return usageErr("rules test: give either a file of rows (%s) or --from-table N, not both", fs.Arg(0))
		}
		return rulesFromTable(*configPath, n, stdout, stderr)
	}
	if *configPath == "" || fs.NArg() != 1 {
		return usageErr("rules test: want --config FILE and one file of rows, as in `outboxrelay rules test --config relay.yaml rows.jsonl`, or --from-table N")
	}
	set, validate, err := loadRules(*configPath)
	if err != nil {
		return usageErr("rules test: %v", err)
	}
	f, err := os.Open(fs.Arg(0))
	if err != nil {
		return usageErr("rules test: %v", err)
	}
	defer f.Close()
	return testRules(set, validate, f, stdout)
}

// rulesFromTable dry-runs the rules of the configuration at path on the
// newest n rows of its outbox tables. The rows are read, in a read-only
// transaction, with the relay's own column mapping and row building
// (replay.Source.RuleRows): a row the relay dead-letters before any rule
// runs says so with the relay's reason. No slot is read or confirmed.
func rulesFromTable(path string, n int, stdout, stderr io.Writer) error {
	cfg, err := loadConfig(path, stderr)
	if err != nil {
		return err
	}
	if len(cfg.Config.Routes) == 0 {
		return usageErr("rules test: %s has no routes", path)
	}
	set, err := rules.Compile(cfg.Config)
	if err != nil {
		return usageErr("rules test: %s: %v", path, err)
	}
	validate, err := app.SchemaValidator(cfg.Relay.Schemas)
	if err != nil {
		return usageErr("rules test: %s: %v", path, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	i := 0
	err = app.NewestRuleRows(ctx, cfg, n, func(row *rules.Row, invalid error) error {
		i++
		printDecision(stdout, fmt.Sprintf("row %d (%s id %s):", i, row.Table, row.MessageID), set, validate, row, invalid)
		return nil
	})
	if err != nil {
		return fmt.Errorf("rules test: %w", err)
	}
	if i == 0 {
		fmt.Fprintf(stdout, "no rows in %s\n", strings.Join(app.QualifiedTables(cfg.Postgres.Tables), ", "))
	}
	return nil
}

// loadRules compiles the rules of the configuration file at path, and
// loads its schema folder (relay.schemas) when it names one, as the relay
// checks the payloads with it; every other key is left alone.
func loadRules(path string) (*rules.Set, relay.Validator, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var c rules.Config
	if err := yaml.Unmarshal(data, &c); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(c.Routes) == 0 {
		return nil, nil, fmt.Errorf("%s has no routes", path)
	}
	set, err := rules.Compile(c)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	var schemas struct {
		Relay struct {
			Schemas config.Schemas `yaml:"schemas"`
		} `yaml:"relay"`
	}
	if err := yaml.Unmarshal(data, &schemas); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	validate, err := app.SchemaValidator(schemas.Relay.Schemas)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return set, validate, nil
}

// testRules prints the decision for every row of r.
func testRules(set *rules.Set, validate relay.Validator, r io.Reader, w io.Writer) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		row, err := sampleRow(line)
		if err != nil {
			return usageErr("rules test: line %d: %v", n, err)
		}
		printDecision(w, fmt.Sprintf("row %d (id %s):", n, row.MessageID), set, validate, row, nil)
	}
	if err := sc.Err(); err != nil {
		return usageErr("rules test: %v", err)
	}
	return nil
}

// printDecision prints, each line after prefix, what set makes of row:
// each route it takes with its destination, key, headers and format, then
// the transformed payload; or that it is dropped, or dead-lettered and why.
// invalid is why the relay dead-letters the row before any rule runs.
// With a schema folder (validate not nil), a routed row whose JSON payload
// (the one transform.payload made, if it sets fields) fails its schema is
// dead-lettered with the schema's error, as the relay does.
func printDecision(w io.Writer, prefix string, set *rules.Set, validate relay.Validator, row *rules.Row, invalid error) {
	if invalid != nil {
		fmt.Fprintf(w, "%s dead letter: %v\n", prefix, oneLine(invalid.Error()))
		return
	}
	d, err := set.Decide(row)
	switch {
	case err != nil:
		fmt.Fprintf(w, "%s dead letter: %v\n", prefix, err)
	case d.Dropped:
		fmt.Fprintf(w, "%s dropped (unmatched: drop)\n", prefix)
	}
	payload := row.Payload
	if d.Payload != nil {
		payload = d.Payload
	}
	if validate != nil && len(d.Matches) > 0 && payload != nil {
		em := envelope.Message{EventType: row.EventType, SchemaVersion: row.SchemaVersion, Payload: payload}
		if err := validate.Validate(&em); err != nil {
			if d.Payload != nil {
				err = fmt.Errorf("the payload transform.payload made: %w", err)
			}
			fmt.Fprintf(w, "%s dead letter: %v\n", prefix, oneLine(err.Error()))
			return
		}
	}
	for _, m := range d.Matches {
		var hs []string
		for _, h := range m.Headers {
			hs = append(hs, h.Name+"="+h.Value)
		}
		fmt.Fprintf(w, "%s route=%s destination=%q key=%q headers={%s}", prefix, m.Route, m.Destination, m.Key, strings.Join(hs, ", "))
		if m.Sink != "" {
			fmt.Fprintf(w, " sink=%s", m.Sink)
		}
		if m.Format != "" {
			fmt.Fprintf(w, " format=%s", m.Format)
		}
		fmt.Fprintln(w)
	}
	if d.Payload != nil {
		fmt.Fprintf(w, "%s payload=%s\n", prefix, d.Payload)
	}
}

// sampleRow reads a row as the outbox table's columns in a JSON object;
// the default column names fill the envelope fields.
func sampleRow(line []byte) (*rules.Row, error) {
	var cols map[string]json.RawMessage
	if err := json.Unmarshal(line, &cols); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	row := &rules.Row{Columns: map[string]string{}, SchemaVersion: 1, Payload: cols["payload"]}
	for k, v := range cols {
		var s string
		if json.Unmarshal(v, &s) != nil {
			if string(v) == "null" {
				continue
			}
			s = string(v)
		}
		row.Columns[k] = s
	}
	row.MessageID, row.AggregateType, row.AggregateID = row.Columns["id"], row.Columns["aggregate_type"], row.Columns["aggregate_id"]
	row.EventType, row.Table = row.Columns["event_type"], row.Columns["table"]
	if v, ok := cols["schema_version"]; ok {
		if err := json.Unmarshal(v, &row.SchemaVersion); err != nil {
			return nil, fmt.Errorf("schema_version %s is not an integer", v)
		}
	}
	if h, ok := cols["headers"]; ok && string(h) != "null" {
		if err := json.Unmarshal(h, &row.Headers); err != nil {
			return nil, fmt.Errorf("headers %s is not an object of strings", h)
		}
	}
	return row, nil
}
