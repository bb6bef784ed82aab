package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSchemaCheckCommand(t *testing.T) {
	for _, tc := range []struct {
		dir        string
		code       int
		out, trail string
	}{
		{"../../outbox/schema/testdata/check/compatible", exitOK, "schemas in ../../outbox/schema/testdata/check/compatible evolve compatibly\n", ""},
		{"../../outbox/schema/testdata/check/incompatible", exitUnhealthy,
			`../../outbox/schema/testdata/check/incompatible/order.created/v2.json#/properties/status/enum: enum value "paid" removed`,
			"outboxrelay: schema check: 10 incompatible changes or broken rules in ../../outbox/schema/testdata/check/incompatible; fix them, or publish the change as a new event type\n"},
		{"../../outbox/schema/testdata/none", exitUsage, "", "outboxrelay: schema check: read schema folder:"},
	} {
		var stdout, stderr bytes.Buffer
		code := runMain([]string{"schema", "check", tc.dir}, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String(), tc.out) || !strings.HasPrefix(stderr.String(), tc.trail) {
			t.Errorf("schema check %s: exit %d, stdout:\n%s\nstderr: %s\nwant exit %d, stdout with %q, stderr %q",
				tc.dir, code, stdout.String(), stderr.String(), tc.code, tc.out, tc.trail)
		}
	}
	var stderr bytes.Buffer
	if code := runMain([]string{"schema", "check"}, &bytes.Buffer{}, &stderr); code != exitUsage {
		t.Errorf("schema check without a folder: exit %d, %s", code, stderr.String())
	}
}

func TestRunRefusesABadSchemaFolder(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "order.created"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "order.created", "v1.json"), []byte(`{"type": 1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "relay.yaml")
	yaml := "postgres: {url: postgres://relay@127.0.0.1:1/shop}\nsink: {kafka: {brokers: [127.0.0.1:1]}}\nrelay: {schemas: {dir: " + dir + "}}\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	code := runMain([]string{"run", "--config", cfg, "--check-config"}, &bytes.Buffer{}, &stderr)
	if code != exitUsage || !strings.Contains(stderr.String(), "relay.schemas.dir: schema order.created/v1.json:") {
		t.Fatalf("exit %d, stderr %s; want exit 2 naming the schema file", code, stderr.String())
	}
}
