package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/internal/app"
	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/relay"
	rows "github.com/outboxrelay/outboxrelay/replay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/verify"
)

// window holds the flags that select outbox rows.
type window struct {
	since, until string
	aggTypes     listFlag
	ids          listFlag
	margin       time.Duration
}

// listFlag is a flag that may be given several times, or with commas.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

func (w *window) register(fs *flag.FlagSet) {
	fs.StringVar(&w.since, "since", "", "rows created at or after this time: RFC 3339 (2026-11-29T08:00:00Z) or a duration ago (2h)")
	fs.StringVar(&w.until, "until", "", "rows created before this time (default: now)")
	fs.Var(&w.aggTypes, "aggregate-type", "only rows of this aggregate type (repeatable)")
	fs.Var(&w.ids, "id", "only the row with this id (repeatable, or comma-separated)")
	fs.DurationVar(&w.margin, "margin", time.Minute, "read the broker from this much before --since, for clock skew")
}

// parseTime reads an RFC 3339 time or a duration before now.
func parseTime(name, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05Z07:00", "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, usageErr("--%s %q is neither an RFC 3339 time (2026-11-29T08:00:00Z) nor a duration ago (2h)", name, v)
}

func (w *window) filter(needSince bool) (rows.Filter, error) {
	now := time.Now()
	f := rows.Filter{AggregateTypes: w.aggTypes, IDs: w.ids}
	var err error
	if f.Since, err = parseTime("since", w.since, now); err != nil {
		return f, err
	}
	if f.Until, err = parseTime("until", w.until, now); err != nil {
		return f, err
	}
	if f.Since.IsZero() && (needSince || len(f.IDs) == 0) {
		return f, usageErr("--since is required (or --id)")
	}
	if !f.Until.IsZero() && !f.Since.IsZero() && !f.Until.After(f.Since) {
		return f, usageErr("--until %s is not after --since %s", f.Until.Format(time.RFC3339), f.Since.Format(time.RFC3339))
	}
	return f, nil
}

// opsEnv is what verify, replay and recover share: the configuration, a
// logger, a connection and the outbox tables.
type opsEnv struct {
	cfg    config.Config
	log    *zap.Logger
	db     *pgx.Conn
	source rows.Source
}

func openOps(ctx context.Context, path string, stderr io.Writer) (*opsEnv, error) {
	cfg, err := loadConfig(path, stderr)
	if err != nil {
		return nil, err
	}
	log, err := newLogger(cfg.Log.Level, stderr)
	if err != nil {
		return nil, usageErr("log.level: %v", err)
	}
	db, err := connect(ctx, cfg.Postgres.URL)
	if err != nil {
		return nil, err
	}
	var database string
	if err := db.QueryRow(ctx, "SELECT current_database()").Scan(&database); err != nil {
		db.Close(context.WithoutCancel(ctx))
		return nil, usageErr("cannot query PostgreSQL: %v", err)
	}
	for _, t := range app.QualifiedTables(cfg.Postgres.Tables) {
		var exists bool
		if err := db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", t).Scan(&exists); err != nil || !exists {
			db.Close(context.WithoutCancel(ctx))
			return nil, usageErr("outbox table %s does not exist; run `outboxrelay migrate` or fix postgres.tables", t)
		}
	}
	return &opsEnv{cfg: cfg, log: log, db: db, source: app.OutboxSource(cfg, database)}, nil
}

func (o *opsEnv) close(ctx context.Context) {
	o.db.Close(context.WithoutCancel(ctx))
	_ = o.log.Sync()
}

// brokerReader returns the reader of the configured sink's broker and how
// to render a row's destination for it, from the sink's own settings
// (sinks.Verifiable).
func brokerReader(cfg config.Config, rabbitQueue string) (verify.Reader, func(*relay.Message) (string, error), error) {
	if len(cfg.Sinks) > 0 {
		// Reading one sink's broker would report the others' rows missing.
		return nil, nil, usageErr("verify reads one sink's broker, and the configuration lists several under sinks; verify with a configuration whose sink section is the one to check")
	}
	v, ok := cfg.Sink.Settings().(sinks.Verifiable)
	if !ok {
		return nil, nil, usageErr("sink.type %q cannot be verified: its sink does not read its broker back", cfg.Sink.Type)
	}
	rd, dest, err := v.VerifyReader(sinks.VerifyOptions{Queue: rabbitQueue})
	if err != nil {
		return nil, nil, usageErr("%v", err)
	}
	return rd, dest, nil
}

// noRows is the error for a window that selects no outbox row.
func noRows(cfg config.Config) error {
	hint := ""
	if cfg.Postgres.Retention > 0 {
		hint = fmt.Sprintf(" (postgres.retention deletes rows after %s)", cfg.Postgres.Retention)
	}
	return usageErr("no outbox rows are retained in the selected window%s; choose a window the table still holds, or remember that rows an application deletes right after inserting them cannot be verified or replayed", hint)
}

func cmdVerify(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("verify", "verify --config FILE --since T [--until T] [--aggregate-type A] [--id ID] [--rabbitmq-queue Q] [--allow-uncovered]",
		"Reconciles the outbox rows committed in the window, by message_id, with what the broker holds; prints the counts, lists the missing ids and exits 1 when any are missing.")
	path := fs.String("config", "", "YAML configuration file")
	queue := fs.String("rabbitmq-queue", "", "RabbitMQ: the verification queue bound to the exchange")
	allowUncovered := fs.Bool("allow-uncovered", false, "exit 0 although part of the window lies past postgres.retention, whose rows may be deleted and so are not verified")
	var w window
	w.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	f, err := w.filter(true)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	o, err := openOps(ctx, *path, stderr)
	if err != nil {
		return err
	}
	defer o.close(ctx)
	gap := uncoveredPart(f, o.cfg.Postgres.Retention, time.Now())
	rep, err := reconcile(ctx, o, f, w.margin, *queue, stderr, func(rep verify.Report) {
		printReport(stdout, rep)
		if gap.length > 0 {
			fmt.Fprintf(stdout, "not covered    %s to %s: %s; rows created then may have been deleted and are not counted\n",
				gap.from.UTC().Format(time.RFC3339), gap.to.UTC().Format(time.RFC3339), gap)
		}
		if rep.Missing > 0 {
			fmt.Fprintln(stdout, "missing ids:")
		}
	}, func(id string) error {
		_, err := fmt.Fprintln(stdout, id)
		return err
	})
	if err != nil {
		return err
	}
	if rep.Missing > 0 {
		return &exitError{code: exitUnhealthy, err: fmt.Errorf("%d of %d committed messages are missing at the broker; republish them with `outboxrelay replay --config FILE --since %s --missing`",
			rep.Missing, rep.Committed, f.Since.UTC().Format(time.RFC3339))}
	}
	if gap.length > 0 && !*allowUncovered {
		return &exitError{code: exitUnhealthy, err: fmt.Errorf("%s, so its rows may have been deleted and were not verified; verify from --since %s, or pass --allow-uncovered to accept the part still held",
			gap, gap.to.UTC().Format(time.RFC3339))}
	}
	return nil
}

// uncovered is the part of a window whose rows retention may have deleted.
type uncovered struct {
	from, to  time.Time
	length    time.Duration
	window    time.Duration
	retention time.Duration
}

func (u uncovered) String() string {
	return fmt.Sprintf("%s of the window's %s (%.0f%%) lies past postgres.retention (%s)",
		u.length.Round(time.Second), u.window.Round(time.Second), 100*u.length.Seconds()/u.window.Seconds(), u.retention)
}

// uncoveredPart returns the part of f's window, as of now, that lies
// before what postgres.retention keeps; its length is 0 when none does.
func uncoveredPart(f rows.Filter, retention time.Duration, now time.Time) uncovered {
	if retention <= 0 || f.Since.IsZero() {
		return uncovered{}
	}
	until := f.Until
	if until.IsZero() || until.After(now) {
		until = now
	}
	cutoff := now.Add(-retention)
	if !f.Since.Before(cutoff) || !until.After(f.Since) {
		return uncovered{}
	}
	to := cutoff
	if until.Before(to) {
		to = until
	}
	return uncovered{from: f.Since, to: to, length: to.Sub(f.Since), window: until.Sub(f.Since), retention: retention}
}

// reconcile runs verify.Run with a progress bar; counted is called with the
// counts before the missing ids are listed.
func reconcile(ctx context.Context, o *opsEnv, f rows.Filter, margin time.Duration, queue string, stderr io.Writer,
	counted func(verify.Report), missing func(string) error) (verify.Report, error) {
	rd, dest, err := brokerReader(o.cfg, queue)
	if err != nil {
		return verify.Report{}, err
	}
	defer rd.Close()
	total, err := o.source.Count(ctx, o.db, f)
	if err != nil {
		return verify.Report{}, usageErr("%v", err)
	}
	if total == 0 {
		return verify.Report{}, noRows(o.cfg)
	}
	// The bar is erased before the report is printed: on a terminal,
	// stdout and stderr share the screen, and the report must not start
	// on the bar's line.
	bar := newProgress(stderr, "reading the broker", 0)
	rep, err := verify.Run(ctx, o.db, rd, verify.Config{
		Source: o.source, Filter: f, Slot: o.cfg.Postgres.Slot, Destination: dest, Margin: margin,
		Progress: func(n int64) { bar.set(n) },
		Counted: func(rep verify.Report) {
			bar.clear()
			if counted != nil {
				counted(rep)
			}
		},
	}, missing)
	bar.clear()
	if err != nil {
		return rep, &exitError{code: exitUsage, err: fmt.Errorf("verify: %w", err)}
	}
	return rep, nil
}

func printReport(w io.Writer, r verify.Report) {
	fmt.Fprintf(w, "committed      %d\nfound          %d\nmissing        %d\nduplicates     %d\ndead-lettered  %d\nparked         %d\n",
		r.Committed, r.Found, r.Missing, r.Duplicates, r.DeadLettered, r.Parked)
	if r.Filtered > 0 {
		fmt.Fprintf(w, "filtered       %d\n", r.Filtered)
	}
}

func cmdReplay(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("replay", "replay --config FILE --since T [--until T] [--aggregate-type A] [--id ID] [--missing] [--rate N]",
		"Republishes outbox rows still in the table through the configured sink, with the same envelope and message_id, in commit order per aggregate.")
	path := fs.String("config", "", "YAML configuration file")
	missingOnly := fs.Bool("missing", false, "replay only the rows verify finds missing at the broker")
	queue := fs.String("rabbitmq-queue", "", "RabbitMQ with --missing: the verification queue bound to the exchange")
	rate := fs.Float64("rate", 0, "at most this many messages a second (0: unlimited)")
	var w window
	w.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	f, err := w.filter(false)
	if err != nil {
		return err
	}
	if *rate < 0 {
		return usageErr("--rate %v must not be negative", *rate)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	o, err := openOps(ctx, *path, stderr)
	if err != nil {
		return err
	}
	defer o.close(ctx)
	if *missingOnly {
		rep, err := reconcile(ctx, o, f, w.margin, *queue, stderr, nil, nil)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%d of %d committed messages missing at the broker\n", rep.Missing, rep.Committed)
		if rep.Missing == 0 {
			return nil
		}
		f.Only = verify.MissingTable
	}
	total, err := o.source.Count(ctx, o.db, f)
	if err != nil {
		return usageErr("%v", err)
	}
	if total == 0 {
		return noRows(o.cfg)
	}
	res, err := publishRows(ctx, o, stderr, *rate, total, nil, func(ctx context.Context, pub *rows.Publisher, row func()) error {
		return o.source.Scan(ctx, o.db, f, func(m *relay.Message, invalid error) error {
			row()
			if invalid != nil { // a row the rules drop too: Invalid counts it
				pub.Invalid(ctx, m, invalid)
				return nil
			}
			return pub.Publish(ctx, m)
		})
	})
	fmt.Fprintf(stdout, "replayed %d of %d messages\n", res.Published, total)
	if !*missingOnly { // the rows verify found missing were not at the broker
		countRepublished(ctx, o.db, o, relay.RepublishedReplay, res.Published)
	}
	printFiltered(stdout, res)
	if err != nil {
		return err
	}
	return resultErr(res)
}

// printFiltered says how many rows the routing rules dropped (unmatched:
// drop): they are not published, as the relay does not publish them.
func printFiltered(w io.Writer, res rows.Result) {
	if res.Filtered > 0 {
		fmt.Fprintf(w, "%d rows dropped by the routing rules (unmatched: drop), not published\n", res.Filtered)
	}
}

func resultErr(res rows.Result) error {
	if n := len(res.Failed) + len(res.Invalid); n > 0 {
		return &exitError{code: exitUnhealthy, err: fmt.Errorf("%d messages were not published: %d refused by the broker, %d invalid rows (see the log)", n, len(res.Failed), len(res.Invalid))}
	}
	return nil
}

// publishRows opens the sink, runs it, and publishes what scan hands over.
// A message the broker refuses, or an invalid row, is stored through
// deadLetter when it is set.
func publishRows(ctx context.Context, o *opsEnv, stderr io.Writer, rate float64, total int64, deadLetter func(context.Context, *relay.Message) error,
	scan func(ctx context.Context, pub *rows.Publisher, row func()) error) (rows.Result, error) {
	sink, err := openSink(ctx, o.cfg, o.log)
	if err != nil {
		return rows.Result{}, err
	}
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan error, 1)
	if r, ok := sink.(relay.Runner); ok {
		go func() { ran <- r.Run(runCtx) }()
	} else {
		ran <- nil
	}
	bar := newProgress(stderr, "publishing", total)
	pub := rows.NewPublisher(sink, rows.PublisherConfig{Rate: rate, MaxAttempts: o.cfg.Relay.MaxAttempts, DeadLetter: deadLetter}, o.log)
	var n int64
	err = scan(ctx, pub, func() {
		n++
		bar.set(n)
	})
	res, werr := pub.Wait(ctx)
	bar.done()
	stopRun()
	if rerr := <-ran; rerr != nil && !errors.Is(rerr, context.Canceled) {
		o.log.Warn("sink stopped", zap.Error(rerr))
	}
	if cerr := sink.Close(); cerr != nil {
		o.log.Warn("close sink", zap.Error(cerr))
	}
	if err = errors.Join(err, werr); err != nil {
		code := exitUsage
		if errors.Is(err, rows.ErrFailed) {
			code = exitUnhealthy // the broker refused messages
		}
		return res, &exitError{code: code, err: fmt.Errorf("replay: %w", err)}
	}
	return res, nil
}
