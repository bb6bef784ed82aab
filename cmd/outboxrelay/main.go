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
	"slices"
	"strings"

	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// Exit codes, as docs/operations.md's "Commands" lists them.
const (
	exitOK        = 0
	exitUnhealthy = 1
	exitUsage     = 2
)

// command is one top-level command. The global usage, the dispatch and the
// shell completion are all made from the table below, so that a command
// cannot be listed in one and missing from another.
type command struct {
	name    string
	aliases []string
	// usage is its lines in the global usage, "  outboxrelay " included;
	// empty for a command the usage does not list (help).
	usage string
	// subcommands each take their own flags (dlq list, schema check); args
	// are the words that may follow the name (completion's shells).
	subcommands, args []string
	run               func(args []string, stdout, stderr io.Writer) error
}

// commands returns the command table, in the usage's order.
func commands() []command {
	return []command{
		{name: "migrate", run: cmdMigrate, usage: `  outboxrelay migrate (--database-url URL | --config FILE) [--print] [--grant ROLE] [--table T] [--publication P] [--slot S] [--debezium] [--partitioned]
  outboxrelay migrate --print-role [--role NAME] [--table T] [--publication P] [--debezium]
  outboxrelay migrate --inbox --database-url URL [--inbox-schema S] [--print]
                                                    create a consumer database's inbox tables (the inbox library's)
`},
		{name: "run", run: cmdRun, usage: "  outboxrelay run     --config FILE [--check-config] [--accept-config-change]\n"},
		{name: "maintain", run: cmdMaintain, usage: "  outboxrelay maintain --config FILE                 create daily partitions ahead, drop those past postgres.retention\n"},
		{name: "status", run: cmdStatus, usage: "  outboxrelay status  --database-url URL [--slot NAME | --all] [--json | -o json|wide] [--max-lag-bytes N] [--relay URL] [--watch]\n"},
		{name: "dlq", run: cmdDeadLetters, subcommands: dlqCommands, usage: "  outboxrelay dlq     list|show|replay|purge ...\n"},
		{name: "inbox", run: cmdInbox, subcommands: inboxCommands, usage: "  outboxrelay inbox   status --database-url URL [--schema S] [--json]   a consumer database's inbox: last processed, dead letters, parked\n" +
			"  outboxrelay inbox   dlq list|show|replay|discard --database-url URL ...   a consumer's inbox dead letters\n"},
		{name: "verify", run: cmdVerify, usage: `  outboxrelay verify  --config FILE --since T [--until T] [--aggregate-type A] [--id ID] [--rabbitmq-queue Q] [--allow-uncovered]
                                                    prove committed rows reached the broker; exit 1 listing missing ids
`},
		{name: "replay", run: cmdReplay, usage: `  outboxrelay replay  --config FILE --since T [--until T] [--aggregate-type A] [--id ID] [--missing] [--rate N]
                                                    republish outbox rows with their envelope and message_id
`},
		{name: "recover", run: cmdRecover, usage: `  outboxrelay recover --config FILE [--since T] [--margin D] [--force]
                                                    re-create a lost or replaced slot and republish what it missed
`},
		{name: "healthcheck", run: cmdHealthcheck, usage: "  outboxrelay healthcheck [--url URL]               exit 0 when the relay's /healthz answers 200\n"},
		{name: "completion", run: cmdCompletion, args: shells, usage: "  outboxrelay completion bash|zsh|fish               print the shell completion script\n"},
		{name: "schema", run: cmdSchema, subcommands: []string{"check"}, usage: "  outboxrelay schema check DIR                      exit 1 when a schema version is not backward compatible with the one before\n"},
		{name: "rules", run: cmdRules, subcommands: []string{"test"}, usage: "  outboxrelay rules test --config FILE (ROWS.jsonl | --from-table N)   dry-run the routing rules on sample rows or the outbox's newest rows\n"},
		{name: "version", aliases: []string{"--version", "-v"}, run: cmdVersion, usage: "  outboxrelay version [--json]\n"},
		{name: "help", aliases: []string{"-h", "--help"}, run: cmdHelp},
	}
}

// usage is the global usage, from the command table.
func usage() string {
	var b strings.Builder
	b.WriteString("outboxrelay relays committed PostgreSQL outbox rows to Kafka, RabbitMQ, NATS JetStream or Redis Streams.\n\nUsage:\n")
	for _, c := range commands() {
		b.WriteString(c.usage)
	}
	b.WriteString("\noutboxrelay COMMAND --help prints the command's flags, their defaults and the environment it reads.\n")
	return b.String()
}

// lookup returns the command named name (or one of its aliases).
func lookup(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name || slices.Contains(c.aliases, name) {
			return c, true
		}
	}
	return command{}, false
}

// cmdHelp prints the global usage, or with a command name that command's.
func cmdHelp(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] != "help" && !strings.HasPrefix(args[0], "-") {
		if code := runMain(append(args, "--help"), stdout, stderr); code != exitOK {
			return &exitError{code: code, err: flag.ErrHelp} // runMain has printed why
		}
		return nil
	}
	fmt.Fprint(stdout, usage())
	return nil
}

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
		fmt.Fprint(stderr, usage())
		return exitUsage
	}
	c, ok := lookup(args[0])
	if !ok {
		fmt.Fprintf(stderr, "outboxrelay: unknown command %q\n\n%s", args[0], usage())
		return exitUsage
	}
	err := c.run(args[1:], stdout, stderr)
	if err == nil {
		return exitOK
	}
	code := exitUsage
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	var help *helpRequest
	var list *problemList
	switch {
	case errors.As(err, &help):
		help.fs.SetOutput(stdout)
		help.fs.Usage()
	case errors.Is(err, flag.ErrHelp):
	case errors.As(err, &list):
		for i, l := range list.lines() {
			if i == 0 {
				l = "outboxrelay: " + l
			}
			fmt.Fprintln(stderr, redact.Text(l))
		}
	default:
		fmt.Fprintln(stderr, "outboxrelay:", oneLine(redact.Text(err.Error())))
	}
	return code
}

// oneLine keeps a user-facing error on one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// newFlags returns the flag set of one command. synopsis is its usage line
// without the program name, about what it does; `--help` prints both with
// every flag, its default and the environment the command reads.
func newFlags(name, synopsis, about string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse errors are one line, printed by runMain
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage:\n  outboxrelay %s\n\n%s\n\nFlags:\n", synopsis, about)
		fs.VisitAll(func(f *flag.Flag) {
			name, text := flag.UnquoteUsage(f)
			dash := "--"
			if len(f.Name) == 1 {
				dash = "-"
			}
			fmt.Fprintf(w, "  %s%s\n      %s", dash, strings.TrimSpace(f.Name+" "+name), text)
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
				fmt.Fprintf(w, " (default %q)", f.DefValue)
			}
			fmt.Fprintln(w)
		})
		fmt.Fprint(w, helpFooter)
	}
	return fs
}

const helpFooter = `
Environment:
  Every configuration key is also OUTBOXRELAY_<SECTION>_<KEY> (OUTBOXRELAY_POSTGRES_URL,
  OUTBOXRELAY_SINK_KAFKA_BROKERS, ...) and wins over the file; a key ending in _FILE reads
  the value from that file. Without --database-url or --config, the PostgreSQL URL comes
  from OUTBOXRELAY_POSTGRES_URL, OUTBOXRELAY_POSTGRES_URL_FILE, then DATABASE_URL.

Exit codes: 0 ok; 1 unhealthy; 2 bad usage, bad configuration, cannot connect, or
could not finish (one line on stderr).
`

// helpRequest is --help for the command of fs: runMain prints its usage.
type helpRequest struct{ fs *flag.FlagSet }

func (h *helpRequest) Error() string { return flag.ErrHelp.Error() }
func (h *helpRequest) Unwrap() error { return flag.ErrHelp }

func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &exitError{code: exitOK, err: &helpRequest{fs}}
		}
		return usageErr("%s: %v; see outboxrelay %s --help", fs.Name(), err, fs.Name())
	}
	if fs.NArg() > 0 {
		return usageErr("%s: unexpected argument %q; see outboxrelay %s --help", fs.Name(), fs.Arg(0), fs.Name())
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
