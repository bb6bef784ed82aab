package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/config"
	"github.com/outboxrelay/outboxrelay/dlq"
	"github.com/outboxrelay/outboxrelay/relay"
)

const dlqUsage = `usage:
  outboxrelay dlq list   (--config FILE | --database-url URL [--slot NAME]) [--json] [--all]
  outboxrelay dlq replay --config FILE (--id ID | --all)      a head is replayed with its parked chain, in order
  outboxrelay dlq purge  (--config FILE | --database-url URL [--slot NAME]) --before TIME|AGE   a head goes with its chain`

func cmdDeadLetters(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return usageErr("dlq needs a subcommand (list, replay or purge); see outboxrelay dlq --help")
	}
	sub := args[0]
	switch sub {
	case "-h", "-help", "--help", "help":
		fmt.Fprintf(stdout, "%s\n\nInspect, re-publish and purge dead letters; `outboxrelay dlq SUBCOMMAND --help` lists its flags.\n", dlqUsage)
		return nil
	case "list", "replay", "purge":
	default:
		return usageErr("unknown dlq subcommand %q; use list, replay or purge (see outboxrelay dlq --help)", sub)
	}
	about := map[string]string{
		"list":   "List pending dead letters (with --all also the replayed ones).",
		"replay": "Publish dead letters again through the configured sink, and mark them replayed.",
		"purge":  "Delete dead letters created before a time or older than an age.",
	}[sub]
	synopsis := map[string]string{
		"list":   "dlq list (--config FILE | --database-url URL [--slot NAME]) [--json] [--all]",
		"replay": "dlq replay --config FILE (--id ID | --all)",
		"purge":  "dlq purge (--config FILE | --database-url URL [--slot NAME]) --before TIME|AGE",
	}[sub]
	fs := newFlags("dlq "+sub, synopsis, about)
	cfgPath := fs.String("config", "", "YAML configuration file")
	dbURL := fs.String("database-url", "", "PostgreSQL URL (list and purge)")
	slot := fs.String("slot", "outboxrelay", "replication slot whose dead letters to use")
	asJSON := fs.Bool("json", false, "print JSON")
	all := fs.Bool("all", false, "list: include replayed letters; replay: every pending letter")
	id := fs.Int64("id", 0, "replay one dead letter by id")
	before := fs.String("before", "", "purge letters created before this RFC 3339 time, or older than this age (e.g. 168h)")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}

	var cfg config.Config
	haveCfg := *cfgPath != ""
	if haveCfg {
		var err error
		if cfg, err = config.Load(*cfgPath, os.LookupEnv); err != nil {
			return usageErr("invalid configuration: %v", err)
		}
		*dbURL, *slot = cfg.Postgres.URL, cfg.Postgres.Slot
	} else if sub == "replay" {
		return usageErr("dlq replay needs --config FILE: it publishes through the configured sink")
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
	store := &dlq.Store{DB: conn, Slot: *slot}

	switch sub {
	case "list":
		letters, err := store.List(ctx, dlq.Filter{IncludeReplayed: *all})
		if err != nil {
			return err
		}
		return printLetters(stdout, letters, *asJSON)
	case "replay":
		if (*id == 0) == !*all {
			return usageErr("dlq replay needs exactly one of --id ID or --all")
		}
		log, err := newLogger(cfg.Log.Level, os.Stderr)
		if err != nil {
			return usageErr("log.level: %v", err)
		}
		n, err := replay(ctx, cfg, store, dlq.Filter{ID: *id}, log)
		fmt.Fprintf(stdout, "replayed %d dead letter(s) and %d parked message(s)\n", n.Letters, n.Parked)
		return err
	case "purge":
		t, err := parseBefore(*before, time.Now())
		if err != nil {
			return err
		}
		n, err := store.Purge(ctx, t)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "purged %d dead letter(s) created before %s and %d message(s) parked behind them\n",
			n.Letters, t.UTC().Format(time.RFC3339), n.Parked)
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

func replay(ctx context.Context, cfg config.Config, store *dlq.Store, f dlq.Filter, log *zap.Logger) (dlq.Replayed, error) {
	sink, err := openSink(ctx, cfg, log)
	if err != nil {
		return dlq.Replayed{}, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if r, ok := sink.(relay.Runner); ok {
			_ = r.Run(runCtx)
		}
	}()
	n, err := store.Replay(ctx, sink, f)
	cancel()
	<-done
	if cerr := sink.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return n, err
}

func printLetters(w io.Writer, letters []dlq.Letter, asJSON bool) error {
	if asJSON {
		if letters == nil {
			letters = []dlq.Letter{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(letters)
	}
	if len(letters) == 0 {
		fmt.Fprintln(w, "no dead letters")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tMESSAGE ID\tDESTINATION\tATTEMPTS\tLAST FAILURE\tREPLAYED\tPARKED\tERROR")
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
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", l.ID, l.MessageID, l.Destination, l.Attempts,
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
