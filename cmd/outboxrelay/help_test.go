package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestSubcommandHelp: each command's --help prints its own usage and every
// flag with its description, on stdout, and exits 0, without needing a
// database URL or a configuration.
func TestSubcommandHelp(t *testing.T) {
	tests := []struct {
		args  []string
		usage string
		flags []string
	}{
		{[]string{"migrate", "--help"}, "outboxrelay migrate", []string{"--config", "--database-url", "--slot", "--print-role", "--grant", "replication slot to create", "--inbox", "--inbox-schema"}},
		{[]string{"inbox", "--help"}, "outboxrelay inbox status", []string{"--database-url", "parked aggregates"}},
		{[]string{"inbox", "dlq", "--help"}, "outboxrelay inbox dlq list", []string{"show", "replay", "discard", "--reason", "consumer's runner"}},
		{[]string{"inbox", "dlq", "list", "--help"}, "outboxrelay inbox dlq list", []string{"--database-url", "--consumer", "--all", "--json"}},
		{[]string{"inbox", "dlq", "show", "--help"}, "outboxrelay inbox dlq show", []string{"--id", "--json", "parked behind it"}},
		{[]string{"inbox", "dlq", "replay", "--help"}, "outboxrelay inbox dlq replay", []string{"--id", "replay interval", "releases"}},
		{[]string{"inbox", "dlq", "discard", "--help"}, "outboxrelay inbox dlq discard", []string{"--id", "--reason", "recorded"}},
		{[]string{"inbox", "status", "--help"}, "outboxrelay inbox status", []string{"--database-url", "--schema", "--json", "dead letters"}},
		{[]string{"run", "-h"}, "outboxrelay run", []string{"--config", "--check-config", "--accept-config-change", "validate the configuration"}},
		{[]string{"status", "--help"}, "outboxrelay status", []string{"--database-url", "--slot", "--json", "--max-lag-bytes"}},
		{[]string{"maintain", "--help"}, "outboxrelay maintain", []string{"--config"}},
		{[]string{"healthcheck", "--help"}, "outboxrelay healthcheck", []string{"--url"}},
		{[]string{"dlq", "--help"}, "outboxrelay dlq list", []string{"show", "replay", "purge", "--dry-run"}},
		{[]string{"dlq", "list", "--help"}, "outboxrelay dlq list", []string{"--database-url", "--slot", "--json"}},
		{[]string{"dlq", "purge", "--help"}, "outboxrelay dlq purge", []string{"--before"}},
		{[]string{"dlq", "show", "--help"}, "outboxrelay dlq show", []string{"--id", "--database-url", "pretty-printed"}},
		{[]string{"dlq", "replay", "--help"}, "outboxrelay dlq replay", []string{"--dry-run", "--all", "progress bar"}},
		{[]string{"version", "--help"}, "outboxrelay version", []string{"--json"}},
		{[]string{"help", "migrate"}, "outboxrelay migrate", []string{"--database-url"}},
		{[]string{"schema", "--help"}, "outboxrelay schema check DIR", []string{"backward compatible"}},
		{[]string{"schema", "check", "--help"}, "outboxrelay schema check DIR", []string{"backward compatible"}},
		{[]string{"help", "schema"}, "outboxrelay schema check DIR", []string{"backward compatible"}},
		{[]string{"verify", "--help"}, "outboxrelay verify", []string{"--since", "--rabbitmq-queue"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Setenv("DATABASE_URL", "")
			var out, errOut bytes.Buffer
			if code := runMain(tt.args, &out, &errOut); code != exitOK {
				t.Fatalf("exit %d, want 0; stderr: %s", code, errOut.String())
			}
			if errOut.Len() != 0 {
				t.Errorf("stderr: %s", errOut.String())
			}
			got := out.String()
			if !strings.Contains(got, tt.usage) {
				t.Errorf("usage lacks %q:\n%s", tt.usage, got)
			}
			for _, f := range tt.flags {
				if !strings.Contains(got, f) {
					t.Errorf("usage lacks %q:\n%s", f, got)
				}
			}
			if strings.Contains(got, "outboxrelay relays committed") && tt.args[0] != "help" {
				t.Errorf("printed the global usage instead of the command's:\n%s", got)
			}
		})
	}
}

// TestBadFlagIsOneLine: an unknown flag is one line naming the command's
// --help, exit 2.
func TestBadFlagIsOneLine(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := runMain([]string{"migrate", "--slto", "x"}, &out, &errOut); code != exitUsage {
		t.Fatalf("exit %d, want 2", code)
	}
	if got := errOut.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "-slto") || !strings.Contains(got, "outboxrelay migrate --help") {
		t.Fatalf("stderr: %q", got)
	}
}
