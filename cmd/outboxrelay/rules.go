package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/outboxrelay/outboxrelay/internal/rules"
)

// cmdRules runs `outboxrelay rules test --config FILE ROWS.jsonl`: it
// compiles the file's routes, unmatched and transform keys (every other key
// is left alone) and prints, for each row of ROWS.jsonl, the route,
// destination, key and headers the rules give it, or why it is dropped or
// dead-lettered. A rule that does not compile is exit 2 with its error.
func cmdRules(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("rules test", "rules test --config FILE ROWS.jsonl",
		"Dry-runs the routing rules of FILE (routes, unmatched, transform) on sample rows, one JSON object a line with the outbox table's columns (id, aggregate_type, aggregate_id, event_type, payload, headers, and any other), and prints each row's route, destination, key and headers.")
	configPath := fs.String("config", "", "the configuration file whose rules to test")
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help") {
		return &exitError{code: exitOK, err: &helpRequest{fs}}
	}
	if len(args) == 0 || args[0] != "test" {
		return usageErr("rules: want `outboxrelay rules test --config FILE ROWS.jsonl`; see outboxrelay rules --help")
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &exitError{code: exitOK, err: &helpRequest{fs}}
		}
		return usageErr("rules test: %v", err)
	}
	if *configPath == "" || fs.NArg() != 1 {
		return usageErr("rules test: want --config FILE and one file of rows, as in `outboxrelay rules test --config relay.yaml rows.jsonl`")
	}
	set, err := loadRules(*configPath)
	if err != nil {
		return usageErr("rules test: %v", err)
	}
	f, err := os.Open(fs.Arg(0))
	if err != nil {
		return usageErr("rules test: %v", err)
	}
	defer f.Close()
	return testRules(set, f, stdout)
}

func loadRules(path string) (*rules.Set, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c rules.Config
	if err := yaml.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(c.Routes) == 0 {
		return nil, fmt.Errorf("%s has no routes", path)
	}
	set, err := rules.Compile(c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return set, nil
}

// testRules prints the decision for every row of r.
func testRules(set *rules.Set, r io.Reader, w io.Writer) error {
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
		d, err := set.Decide(row)
		prefix := fmt.Sprintf("row %d (id %s):", n, row.MessageID)
		switch {
		case err != nil:
			fmt.Fprintf(w, "%s dead letter: %v\n", prefix, err)
		case d.Dropped:
			fmt.Fprintf(w, "%s dropped (unmatched: drop)\n", prefix)
		}
		for _, m := range d.Matches {
			var hs []string
			for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
				hs = append(hs, k+"="+m.Headers[k])
			}
			fmt.Fprintf(w, "%s route=%s destination=%q key=%q headers={%s}", prefix, m.Route, m.Destination, m.Key, strings.Join(hs, ", "))
			if m.Format != "" {
				fmt.Fprintf(w, " format=%s", m.Format)
			}
			fmt.Fprintln(w)
		}
		if d.Payload != nil {
			fmt.Fprintf(w, "%s payload=%s\n", prefix, d.Payload)
		}
	}
	if err := sc.Err(); err != nil {
		return usageErr("rules test: %v", err)
	}
	return nil
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
