package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/internal/app"
	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/store"
	"github.com/outboxrelay/outboxrelay/relay"
)

const dlqUsage = `usage:
  outboxrelay dlq list   (--config FILE | --database-url URL) [--slot NAME] [--json] [--all]
  outboxrelay dlq show   (--config FILE | --database-url URL) --id ID [--json]   the envelope and the chain parked behind it
  outboxrelay dlq replay --config FILE (--id ID | --all) [--force] [--dry-run [--json]]   a head is replayed with its parked chain, in order
  outboxrelay dlq purge  (--config FILE | --database-url URL) [--slot NAME] --before TIME|AGE   a head goes with its chain

With --database-url and no --slot, list, show and purge cover every slot; with --config, the config's slot.`

// dlqCommands are the subcommands of dlq.
var dlqCommands = []string{"list", "show", "replay", "purge"}

func cmdDeadLetters(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageErr("dlq needs a subcommand (list, show, replay or purge); see outboxrelay dlq --help")
	}
	sub := args[0]
	switch sub {
	case "-h", "-help", "--help", "help":
		fmt.Fprintf(stdout, "%s\n\nInspect, re-publish and purge dead letters; `outboxrelay dlq SUBCOMMAND --help` lists its flags.\n", dlqUsage)
		return nil
	default:
		if !slices.Contains(dlqCommands, sub) {
			return usageErr("unknown dlq subcommand %q; use list, show, replay or purge (see outboxrelay dlq --help)", sub)
		}
	}
	about := map[string]string{
		"list": "List pending dead letters (with --all also the replayed ones) and the slot each belongs to. " +
			"Without --slot or --config, the dead letters of every slot.",
		"show": "Print one dead letter: its fields, its envelope pretty-printed, and the messages parked behind it " +
			"in the order dlq replay publishes them.",
		"replay": "Publish dead letters again through the configured sink, and mark them replayed. " +
			"A letter that is not a valid outbox message (an empty event_type, say) is refused with the reason; " +
			"--force publishes it anyway and records who forced it in the letter. " +
			"--dry-run prints what would be published, in order, and changes nothing.",
		"purge": "Delete dead letters created before a time or older than an age. Without --slot or --config, " +
			"those of every slot.",
	}[sub]
	synopsis := map[string]string{
		"list":   "dlq list (--config FILE | --database-url URL) [--slot NAME] [--json] [--all]",
		"show":   "dlq show (--config FILE | --database-url URL) [--slot NAME] --id ID [--json]",
		"replay": "dlq replay (--config FILE) (--id ID | --all) [--force] [--dry-run [--json]]",
		"purge":  "dlq purge (--config FILE | --database-url URL) [--slot NAME] --before TIME|AGE",
	}[sub]
	fs := newFlags("dlq "+sub, synopsis, about)
	cfgPath := fs.String("config", "", "YAML configuration file")
	dbURL := fs.String("database-url", "", "PostgreSQL URL (list, show, purge and replay --dry-run)")
	slot := fs.String("slot", "", "only the dead letters of this replication slot (default: the config's slot, or every slot)")
	asJSON := fs.Bool("json", false, "print JSON")
	var all, dryRun, force *bool
	var id *int64
	var before *string
	switch sub {
	case "list":
		all = fs.Bool("all", false, "include replayed letters")
	case "replay":
		all = fs.Bool("all", false, "replay every pending letter (a progress bar on a terminal)")
		dryRun = fs.Bool("dry-run", false, "print what would be published, in order, and change nothing")
		force = fs.Bool("force", false, "also publish letters that are not valid outbox messages, as they are; the letter records who forced it")
	case "purge":
		before = fs.String("before", "", "purge letters created before this RFC 3339 time, or older than this age (e.g. 168h)")
	}
	if sub == "show" || sub == "replay" {
		id = fs.Int64("id", 0, "the dead letter's id (dlq list shows it)")
	}
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	slotSet := false
	fs.Visit(func(f *flag.Flag) { slotSet = slotSet || f.Name == "slot" })

	var cfg config.Config
	haveCfg := *cfgPath != ""
	if haveCfg {
		var err error
		if cfg, err = loadConfig(*cfgPath, stderr); err != nil {
			return err
		}
		*dbURL = cfg.Postgres.URL
		if !slotSet {
			*slot = cfg.Postgres.Slot
		}
	} else if sub == "replay" && !*dryRun {
		return usageErr("dlq replay needs --config FILE: it publishes through the configured sink")
	}
	if sub == "replay" && (*id == 0) == !*all {
		return usageErr("dlq replay needs exactly one of --id ID or --all")
	}
	if sub == "show" && *id == 0 {
		return usageErr("dlq show needs --id ID (outboxrelay dlq list shows the ids)")
	}
	url, err := databaseURL(*dbURL)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	conn, err := connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	dead := &store.DeadLetters{DB: conn, Slot: *slot}

	switch sub {
	case "list":
		letters, err := dead.List(ctx, store.DeadLetterFilter{IncludeReplayed: *all})
		if err != nil {
			return err
		}
		return printLetters(stdout, letters, *asJSON, *slot)
	case "show":
		letters, err := dead.List(ctx, store.DeadLetterFilter{ID: *id, IncludeReplayed: true})
		if err != nil {
			return err
		}
		if len(letters) == 0 {
			where := ""
			if *slot != "" {
				where = " for slot " + *slot
			}
			return usageErr("no dead letter with id %d%s; outboxrelay dlq list --all shows them", *id, where)
		}
		return showLetter(stdout, &letters[0], *asJSON)
	case "replay":
		f := store.DeadLetterFilter{ID: *id}
		steps, err := dead.Plan(ctx, f, cfg.Postgres.Columns)
		if err != nil {
			return err
		}
		if *dryRun {
			return printPlan(stdout, steps, *asJSON)
		}
		log, err := newLogger(cfg.Log.Level, os.Stderr)
		if err != nil {
			return usageErr("log.level: %v", err)
		}
		var bar *progress
		if *all {
			bar = newProgress(stderr, "replaying", int64(len(steps)))
		}
		forcedBy := ""
		if *force {
			forcedBy = operator()
		}
		n, err := replay(ctx, cfg, dead, f, forcedBy, bar, log)
		fmt.Fprintf(stdout, "replayed %d dead letter(s) and %d parked message(s)\n", n.Letters, n.Parked)
		if len(n.Forced) > 0 {
			fmt.Fprintf(stdout, "forced %d letter(s) that are not valid outbox messages (ids %v), recorded as forced by %s\n", len(n.Forced), n.Forced, forcedBy)
		}
		return err
	case "purge":
		t, err := parseBefore(*before, time.Now())
		if err != nil {
			return err
		}
		n, err := dead.Purge(ctx, t)
		if err != nil {
			return err
		}
		of := "of every slot"
		if *slot != "" {
			of = "of slot " + *slot
		}
		fmt.Fprintf(stdout, "purged %d dead letter(s) %s created before %s and %d message(s) parked behind them\n",
			n.Letters, of, t.UTC().Format(time.RFC3339), n.Parked)
		return nil
	}
	return usageErr("unknown dlq subcommand %q\n%s", sub, dlqUsage)
}

// parseBefore takes an RFC 3339 time or an age such as 168h.
func parseBefore(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, usageErr("dlq purge needs --before TIME (RFC 3339) or an age such as 168h")
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, usageErr("--before %q is neither an RFC 3339 time nor an age such as 168h", s)
}

// operator names who runs `dlq replay --force`, for the letters it forces:
// the OS user and host, as far as they are known.
func operator() string {
	who := "unknown user"
	if u, err := user.Current(); err == nil {
		who = u.Username
	}
	host, _ := os.Hostname() // "" is said as such below
	return fmt.Sprintf("cli: %s on host %q", who, host)
}

func replay(ctx context.Context, cfg config.Config, dead *store.DeadLetters, f store.DeadLetterFilter, forcedBy string, bar *progress, log *zap.Logger) (store.Replayed, error) {
	var wrap func(relay.Sink) relay.Sink
	if bar != nil {
		wrap = func(sink relay.Sink) relay.Sink {
			return &countingSink{Sink: sink, acked: func(n int64) { bar.set(n) }}
		}
	}
	n, err := app.ReplayDeadLetters(ctx, cfg, dead, f, forcedBy, wrap, log)
	if bar != nil {
		bar.done()
	}
	if se := (*app.SinkError)(nil); errors.As(err, &se) {
		return n, usageErr("%v", se.Err)
	}
	if refused := (*store.RefusedError)(nil); errors.As(err, &refused) {
		problems := []error{err}
		if joined, ok := err.(interface{ Unwrap() []error }); ok { // --all: one line per letter refused
			problems = joined.Unwrap()
		}
		return n, &exitError{code: exitUnhealthy, err: &problemList{what: "dlq replay", problems: problems}}
	}
	return n, err
}

// countingSink reports each message the broker acknowledged, for a
// progress bar. dlq replays one message at a time, so the count is ordered.
type countingSink struct {
	relay.Sink
	acked func(n int64)
	n     atomic.Int64
}

func (c *countingSink) Publish(ctx context.Context, m *relay.Message, done func(*relay.Message, error)) {
	c.Sink.Publish(ctx, m, func(m *relay.Message, err error) {
		if err == nil {
			c.acked(c.n.Add(1))
		}
		done(m, err)
	})
}

// printLetters prints letters as a table, or JSON. slot is the one slot
// they were read for, "" for every slot.
func printLetters(w io.Writer, letters []store.DeadLetter, asJSON bool, slot string) error {
	if asJSON {
		if letters == nil {
			letters = []store.DeadLetter{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(letters)
	}
	if len(letters) == 0 {
		if slot == "" {
			fmt.Fprintln(w, "no dead letters in any slot")
		} else {
			fmt.Fprintf(w, "no dead letters for slot %s\n", slot)
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSLOT\tMESSAGE ID\tDESTINATION\tATTEMPTS\tLAST FAILURE\tREPLAYED\tPARKED\tERROR")
	heads := 0
	for _, l := range letters {
		replayed := "-"
		if l.ReplayedAt != nil {
			replayed = l.ReplayedAt.UTC().Format(time.RFC3339)
		}
		parked := "-"
		if l.Parks {
			parked = fmt.Sprint(len(l.Parked))
			heads++
		}
		errText := strings.Join(strings.Fields(l.Error), " ")
		if len(errText) > 80 {
			errText = errText[:77] + "..."
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", l.ID, l.Slot, l.MessageID, l.Destination, l.Attempts,
			l.LastFailedAt.UTC().Format(time.RFC3339), replayed, parked, errText)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if heads == 0 {
		return nil
	}
	// What waits behind what: each head's aggregate and its chain, in the
	// order `dlq replay --id HEAD` publishes it.
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BEHIND\tAGGREGATE\tPOSITION\tMESSAGE ID\tEVENT TYPE\tCOMMITTED")
	for _, l := range letters {
		if !l.Parks {
			continue
		}
		agg := l.AggregateType + "/" + l.AggregateID
		if len(l.Parked) == 0 {
			fmt.Fprintf(tw, "%d\t%s\t-\t(nothing yet: the aggregate's next messages park here)\t\t\n", l.ID, agg)
		}
		for i, p := range l.Parked {
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\n", l.ID, agg, i+1, p.MessageID, p.EventType, p.CommittedAt.UTC().Format(time.RFC3339))
		}
	}
	return tw.Flush()
}

// showLetter prints one dead letter for a reader: its fields, its envelope
// pretty-printed, then the messages parked behind it in replay order.
func showLetter(w io.Writer, l *store.DeadLetter, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(l)
	}
	replayed := "no"
	if l.ReplayedAt != nil {
		replayed = l.ReplayedAt.UTC().Format(time.RFC3339)
	}
	if l.ReplayForcedBy != "" {
		replayed += ", forced by " + l.ReplayForcedBy
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "dead letter\t%d\n", l.ID)
	fmt.Fprintf(tw, "slot\t%s\n", l.Slot)
	fmt.Fprintf(tw, "message id\t%s\n", l.MessageID)
	fmt.Fprintf(tw, "aggregate\t%s/%s\n", l.AggregateType, l.AggregateID)
	fmt.Fprintf(tw, "event type\t%s\n", l.EventType)
	fmt.Fprintf(tw, "destination\t%s\n", l.Destination)
	fmt.Fprintf(tw, "source table\t%s\n", l.Table)
	if l.Invalid {
		fmt.Fprintf(tw, "invalid\tthe relay refused to build it; dlq replay refuses it too, unless --force\n")
	}
	fmt.Fprintf(tw, "attempts\t%d failed (first %s, last %s)\n", l.Attempts,
		l.FirstFailedAt.UTC().Format(time.RFC3339), l.LastFailedAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "replayed\t%s\n", replayed)
	fmt.Fprintf(tw, "error\t%s\n", strings.Join(strings.Fields(l.Error), " "))
	if len(l.Headers) > 0 && string(l.Headers) != "{}" {
		fmt.Fprintf(tw, "headers\t%s\n", l.Headers)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	body := l.Body
	if body == nil {
		body = []byte(l.Envelope)
	}
	fmt.Fprintln(w, "\nenvelope:")
	writeBody(w, body, l.ContentType, "  ")
	if !l.Parks {
		return nil
	}
	agg := l.AggregateType + "/" + l.AggregateID
	if len(l.Parked) == 0 {
		fmt.Fprintf(w, "\nparked behind it: nothing yet; the next messages of %s wait here until it is replayed or purged\n", agg)
		return nil
	}
	fmt.Fprintf(w, "\nparked behind it: %d message(s) of %s, published in this order after it by dlq replay --id %d\n",
		len(l.Parked), agg, l.ID)
	for i, p := range l.Parked {
		fmt.Fprintf(w, "\n%d. message %s, %s, committed %s\n", i+1, p.MessageID, p.EventType, p.CommittedAt.UTC().Format(time.RFC3339))
		writeBody(w, p.Body, p.ContentType, "   ")
	}
	return nil
}

// writeBody prints a message body indented: JSON pretty-printed, other
// text as it is, and bytes that are not text as base64.
func writeBody(w io.Writer, body []byte, contentType, indent string) {
	var b bytes.Buffer
	switch {
	case json.Valid(body) && json.Indent(&b, body, indent, "  ") == nil:
		fmt.Fprintf(w, "%s%s\n", indent, b.String())
	case utf8.Valid(body):
		fmt.Fprintf(w, "%s(%s)\n%s%s\n", indent, orDefault(contentType, "text"), indent, body)
	default:
		fmt.Fprintf(w, "%s(%s, base64)\n%s%s\n", indent, orDefault(contentType, "binary"), indent, base64.StdEncoding.EncodeToString(body))
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// printPlan prints what dlq replay would publish, in publishing order.
func printPlan(w io.Writer, steps []store.ReplayStep, asJSON bool) error {
	if asJSON {
		if steps == nil {
			steps = []store.ReplayStep{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(steps)
	}
	if len(steps) == 0 {
		fmt.Fprintln(w, "dry run: nothing to replay")
		return nil
	}
	fmt.Fprintf(w, "dry run: dlq replay would publish %d message(s), in this order; nothing was changed\n", len(steps))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ORDER\tSLOT\tDEAD LETTER\tPOSITION\tMESSAGE ID\tAGGREGATE\tEVENT TYPE\tDESTINATION")
	for i, s := range steps {
		pos := "head"
		if s.Position > 0 {
			pos = fmt.Sprintf("parked %d", s.Position)
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s/%s\t%s\t%s\n", i+1, s.Slot, s.Head, pos, s.MessageID,
			s.AggregateType, s.AggregateID, s.EventType, orDefault(s.Destination, "-"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range steps {
		if s.Refused != "" {
			fmt.Fprintf(w, "dead letter %d is not a valid outbox message (%s): refused without --force\n", s.Head, s.Refused)
		}
	}
	return nil
}
