// Command outboxrelay relays committed PostgreSQL outbox rows to Kafka,
// RabbitMQ, NATS JetStream or Redis Streams. See the README for the
// commands. This package holds the wiring and is the only place that reads
// the environment.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/config"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// Exit codes, as SPEC.md defines them.
const (
	exitOK        = 0
	exitUnhealthy = 1
	exitUsage     = 2
)

const usage = `outboxrelay relays committed PostgreSQL outbox rows to Kafka, RabbitMQ, NATS JetStream or Redis Streams.

Usage:
  outboxrelay migrate --database-url URL [--print] [--table T] [--publication P] [--slot S] [--debezium] [--partitioned]
  outboxrelay migrate --print-role [--role NAME] [--table T] [--publication P] [--debezium]
  outboxrelay run     --config FILE [--check-config] [--accept-config-change]
  outboxrelay maintain --config FILE                 create daily partitions ahead, drop those past postgres.retention
  outboxrelay status  --database-url URL [--slot NAME] [--json] [--max-lag-bytes N]
  outboxrelay dlq     list|replay|purge ...
  outboxrelay healthcheck [--url URL]               exit 0 when the relay's /healthz answers 200
  outboxrelay schema check DIR                      exit 1 when a schema version is not backward compatible with the one before
  outboxrelay version
`

// exitError carries an exit code and one user-facing line.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageErr(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

func main() {
	os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr))
}

func runMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	var err error
	switch args[0] {
	case "migrate":
		err = cmdMigrate(args[1:], stdout)
	case "run":
		err = cmdRun(args[1:], stdout, stderr)
	case "status":
		err = cmdStatus(args[1:], stdout)
	case "dlq":
		err = cmdDeadLetters(args[1:], stdout)
	case "maintain":
		err = cmdMaintain(args[1:], stdout)
	case "healthcheck":
		err = cmdHealthcheck(args[1:], stdout)
	case "schema":
		err = cmdSchema(args[1:], stdout)
	case "version", "--version", "-v":
		fmt.Fprintln(stdout, "outboxrelay", version)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "outboxrelay: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	if err == nil {
		return exitOK
	}
	code := exitUsage
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	if !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stderr, "outboxrelay:", oneLine(cdc.RedactURL(err.Error())))
	}
	return code
}

// oneLine keeps a user-facing error on one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(os.Stdout, usage)
			return &exitError{code: exitOK, err: err}
		}
		return usageErr("%s: %v", fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return usageErr("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

// databaseURL takes --database-url, falling back to the environment:
// OUTBOXRELAY_POSTGRES_URL, the file OUTBOXRELAY_POSTGRES_URL_FILE names
// (a mounted secret; it keeps the password out of the process list), then
// DATABASE_URL.
func databaseURL(flagValue string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	if v := os.Getenv("OUTBOXRELAY_POSTGRES_URL"); v != "" {
		return v, nil
	}
	if f := os.Getenv("OUTBOXRELAY_POSTGRES_URL_FILE"); f != "" {
		v, err := config.ReadSecretFile(f)
		if err != nil {
			return "", usageErr("OUTBOXRELAY_POSTGRES_URL_FILE: %v", err)
		}
		return v, nil
	}
	if v := os.Getenv("DATABASE_URL"); v != "" {
		return v, nil
	}
	return "", usageErr("--database-url is required (or OUTBOXRELAY_POSTGRES_URL, OUTBOXRELAY_POSTGRES_URL_FILE)")
}
