package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxrelay/outboxrelay/inbox"
)

const inboxDLQUsage = `usage:
  outboxrelay inbox dlq list    --database-url URL [--schema S] [--consumer NAME] [--all] [--json]
  outboxrelay inbox dlq show    --database-url URL [--schema S] [--consumer NAME] --id ID [--json]   the message and the chain parked behind it
  outboxrelay inbox dlq replay  --database-url URL [--schema S] [--consumer NAME] --id ID   the consumer's runner runs it and its chain
  outboxrelay inbox dlq discard --database-url URL [--schema S] [--consumer NAME] --id ID --reason TEXT   its message never runs; its chain does

The inbox's dead letters live in the consumer's database. This command cannot run the consumer's
handler: replay and discard record the request on the letter, and the consumer's runner carries it out.`

// inboxDLQCommands are the subcommands of inbox dlq. discard, not purge:
// the relay's dlq purge deletes letters by age, while an inbox discard
// keeps the letter as the record of a decision on one message (the
// inbox's Discard) and then lets its chain run.
var inboxDLQCommands = []string{"list", "show", "replay", "discard"}

func cmdInboxDLQ(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return usageErr("inbox dlq needs a subcommand (list, show, replay or discard); see outboxrelay inbox dlq --help")
	}
	sub := args[0]
	if slices.Contains([]string{"-h", "-help", "--help", "help"}, sub) {
		fmt.Fprintf(stdout, "%s\n\nInspect, replay and discard a consumer's inbox dead letters; `outboxrelay inbox dlq SUBCOMMAND --help` lists its flags.\n", inboxDLQUsage)
		return nil
	}
	if !slices.Contains(inboxDLQCommands, sub) {
		return usageErr("unknown inbox dlq subcommand %q; use list, show, replay or discard (see outboxrelay inbox dlq --help)", sub)
	}
	about := map[string]string{
		"list": "List the inbox dead letters not released (with --all also the replayed and discarded ones), " +
			"each with its consumer, its state and how many messages are parked behind it.",
		"show": "Print one inbox dead letter: its fields, its message as received, and the messages parked behind it " +
			"in the order a replay runs them.",
		"replay": "Request the replay of an inbox dead letter. The consumer's runner (inbox/kafka, inbox/rabbitmq, " +
			"inbox/nats, inbox/redis, or the service's own call of ReplayRequested) runs it with the consumer's handler " +
			"within its replay interval (5s by default), then the messages parked behind it in order, and releases the aggregate. " +
			"inbox dlq show tells when it is done, or why it failed.",
		"discard": "Give up on an inbox dead letter: its message never runs (a redelivery stays a duplicate). The decision is " +
			"recorded on the letter with --reason, who and when. A letter with nothing parked behind it is released at once; " +
			"otherwise the consumer's runner runs the parked messages in order, as a replay does, and releases the aggregate.",
	}[sub]
	synopsis := map[string]string{
		"list":    "inbox dlq list --database-url URL [--schema S] [--consumer NAME] [--all] [--json]",
		"show":    "inbox dlq show --database-url URL [--schema S] [--consumer NAME] --id ID [--json]",
		"replay":  "inbox dlq replay --database-url URL [--schema S] [--consumer NAME] --id ID",
		"discard": "inbox dlq discard --database-url URL [--schema S] [--consumer NAME] --id ID --reason TEXT",
	}[sub]
	fs := newFlags("inbox dlq "+sub, synopsis, about)
	url := fs.String("database-url", "", "PostgreSQL URL of the consumer's database (env OUTBOXRELAY_POSTGRES_URL, OUTBOXRELAY_POSTGRES_URL_FILE, DATABASE_URL)")
	schema := fs.String("schema", inbox.DefaultSchema, "schema of the inbox tables")
	consumer := fs.String("consumer", "", "only the dead letters of this consumer (default: every consumer)")
	var asJSON, all *bool
	var id *int64
	var reason *string
	if sub == "list" || sub == "show" {
		asJSON = fs.Bool("json", false, "print JSON")
	}
	if sub == "list" {
		all = fs.Bool("all", false, "include released letters (replayed or discarded)")
	} else {
		id = fs.Int64("id", 0, "the dead letter's id (inbox dlq list shows it)")
	}
	if sub == "discard" {
		reason = fs.String("reason", "", "why the message must never run (its effect was made by hand, say); recorded on the letter")
	}
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if id != nil && *id <= 0 {
		return usageErr("inbox dlq %s needs --id ID (outboxrelay inbox dlq list shows the ids)", sub)
	}
	if reason != nil && strings.TrimSpace(*reason) == "" {
		return usageErr("inbox dlq discard needs --reason TEXT: the decision that the message never runs is recorded on the letter")
	}
	return withConn(*url, 30*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
		var err error
		switch sub {
		case "list":
			err = inboxDLQList(ctx, stdout, conn, *schema, inbox.LetterFilter{Consumer: *consumer, IncludeReleased: *all}, *asJSON)
		case "show":
			err = inboxDLQShow(ctx, stdout, conn, *schema, *consumer, *id, *asJSON)
		case "replay":
			err = inboxDLQReplay(ctx, stdout, conn, *schema, *consumer, *id)
		case "discard":
			err = inboxDLQDiscard(ctx, stdout, conn, *schema, *consumer, *id, strings.TrimSpace(*reason))
		}
		return inboxDLQErr(sub, err)
	})
}

// inboxDLQErr makes an error about the operator's input (an id, a consumer,
// a letter's state) a usage error, which names what to do.
func inboxDLQErr(sub string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, inbox.ErrUnknownConsumer):
		return usageErr("inbox dlq %s: %v; outboxrelay inbox status lists the consumers", sub, err)
	case errors.Is(err, inbox.ErrNotParked), errors.Is(err, inbox.ErrReplayPending):
		return usageErr("inbox dlq %s: %v; outboxrelay inbox dlq list --all shows every letter and its state", sub, err)
	case strings.Contains(err.Error(), "SQLSTATE 42P01"), strings.Contains(err.Error(), "SQLSTATE 42703"): // undefined table, column
		return usageErr("inbox dlq %s: %v; create or update the inbox tables with outboxrelay migrate --inbox", sub, err)
	}
	return err
}

func inboxDLQList(ctx context.Context, w io.Writer, conn *pgx.Conn, schema string, f inbox.LetterFilter, asJSON bool) error {
	letters, err := inbox.Letters(ctx, conn, schema, f)
	if err != nil {
		return err
	}
	if asJSON {
		if letters == nil {
			letters = []inbox.DeadLetter{}
		}
		return writeJSON(w, letters)
	}
	if len(letters) == 0 {
		of := "of any consumer"
		if f.Consumer != "" {
			of = "of consumer " + f.Consumer
		}
		_, err := fmt.Fprintf(w, "no inbox dead letters %s\n", of)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCONSUMER\tMESSAGE ID\tAGGREGATE\tSTATE\tATTEMPTS\tCREATED\tPARKED\tREPLAY\tERROR")
	for _, d := range letters {
		parked := "-"
		if d.State == "parked" {
			parked = fmt.Sprint(len(d.Parked))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", d.ID, d.Consumer, d.MessageID, aggregateOf(d), d.State, d.Attempts,
			d.CreatedAt.UTC().Format(time.RFC3339), parked, replayState(d), foldLine(d.Error, 80))
	}
	return tw.Flush()
}

func inboxDLQShow(ctx context.Context, w io.Writer, conn *pgx.Conn, schema, consumer string, id int64, asJSON bool) error {
	letters, err := inbox.Letters(ctx, conn, schema, inbox.LetterFilter{Consumer: consumer, ID: id, IncludeReleased: true})
	if err != nil {
		return err
	}
	if len(letters) == 0 {
		where := ""
		if consumer != "" {
			where = " of consumer " + consumer
		}
		return fmt.Errorf("there is no dead letter %d%s in schema %s: %w", id, where, schema, inbox.ErrNotParked)
	}
	d := letters[0]
	if asJSON {
		return writeJSON(w, d)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "dead letter\t%d\n", d.ID)
	fmt.Fprintf(tw, "consumer\t%s\n", d.Consumer)
	fmt.Fprintf(tw, "message id\t%s\n", d.MessageID)
	fmt.Fprintf(tw, "aggregate\t%s\n", aggregateOf(d))
	fmt.Fprintf(tw, "state\t%s\n", stateText(d))
	fmt.Fprintf(tw, "attempts\t%d failed, dead-lettered %s\n", d.Attempts, d.CreatedAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "replay\t%s\n", replayText(d))
	if d.DiscardedAt != nil {
		fmt.Fprintf(tw, "discarded\t%s by %s: %s\n", d.DiscardedAt.UTC().Format(time.RFC3339), orDefault(d.DiscardedBy, "the inbox library"), d.DiscardReason)
	}
	fmt.Fprintf(tw, "error\t%s\n", foldLine(d.Error, 0))
	if len(d.Headers) > 0 && string(d.Headers) != "{}" {
		fmt.Fprintf(tw, "headers\t%s\n", d.Headers)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nmessage as received:")
	writeBody(w, d.Body, "", "  ")
	if d.State != "parked" {
		return nil
	}
	if len(d.Parked) == 0 {
		_, err := fmt.Fprintf(w, "\nparked behind it: nothing yet; the next messages of %s wait here until it is replayed or discarded\n", aggregateOf(d))
		return err
	}
	fmt.Fprintf(w, "\nparked behind it: %d message(s) of %s, run in this order after it by a replay\n", len(d.Parked), aggregateOf(d))
	for i, p := range d.Parked {
		fmt.Fprintf(w, "\n%d. message %s, parked %s\n", i+1, p.MessageID, p.ParkedAt.UTC().Format(time.RFC3339))
		writeBody(w, p.Body, "", "   ")
	}
	return nil
}

func inboxDLQReplay(ctx context.Context, w io.Writer, conn *pgx.Conn, schema, consumer string, id int64) error {
	d, err := inbox.RequestReplay(ctx, conn, schema, id, consumer, operator())
	if err != nil {
		return err
	}
	chain := ""
	if d.State == "parked" {
		chain = fmt.Sprintf(", then the %d message(s) parked behind it in order, and releases %s", len(d.Parked), aggregateOf(d))
	}
	what := "its message"
	if d.HeadDoneAt != nil {
		what = "the rest of its chain (its message ran in an earlier replay)"
	}
	_, err = fmt.Fprintf(w, "requested the replay of dead letter %d of consumer %s (message %s), recorded as by %s\n"+
		"consumer %s's runner runs %s with its handler within its replay interval (5s by default)%s; nothing has run yet.\n"+
		"outboxrelay inbox dlq show --id %d tells when it is done, or why it failed.\n",
		d.ID, d.Consumer, d.MessageID, d.ReplayRequestedBy, d.Consumer, what, chain, d.ID)
	return err
}

func inboxDLQDiscard(ctx context.Context, w io.Writer, conn *pgx.Conn, schema, consumer string, id int64, reason string) error {
	d, released, err := inbox.RequestDiscard(ctx, conn, schema, id, consumer, reason, operator())
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "discarded dead letter %d of consumer %s (message %s): it will never run; recorded with reason %q by %s\n",
		d.ID, d.Consumer, d.MessageID, d.DiscardReason, d.DiscardedBy)
	if released {
		_, err = fmt.Fprintln(w, "nothing was parked behind it: the letter is released")
		return err
	}
	_, err = fmt.Fprintf(w, "consumer %s's runner runs the %d message(s) parked behind it in order within its replay interval (5s by default), then releases %s\n",
		d.Consumer, len(d.Parked), aggregateOf(d))
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func aggregateOf(d inbox.DeadLetter) string {
	if d.AggregateType == "" && d.AggregateID == "" {
		return "-"
	}
	return d.AggregateType + "/" + d.AggregateID
}

// replayState is the REPLAY column of inbox dlq list.
func replayState(d inbox.DeadLetter) string {
	switch {
	case d.State == "released" && d.DiscardedAt != nil:
		return "discarded"
	case d.State == "released":
		return "replayed"
	case d.ReplayRequestedAt != nil:
		return "requested"
	case d.ReplayError != "":
		return "failed"
	}
	return "-"
}

func stateText(d inbox.DeadLetter) string {
	switch d.State {
	case "parked":
		return "parked: the aggregate's later messages wait behind it"
	case "dead":
		return "dead: it has no aggregate, so nothing waits behind it"
	}
	return fmt.Sprintf("released %s", d.ReleasedAt.UTC().Format(time.RFC3339))
}

func replayText(d inbox.DeadLetter) string {
	switch {
	case d.State == "released":
		return "done"
	case d.ReplayRequestedAt != nil:
		return fmt.Sprintf("requested %s by %s; waits for consumer %s's runner", d.ReplayRequestedAt.UTC().Format(time.RFC3339), d.ReplayRequestedBy, d.Consumer)
	case d.ReplayError != "":
		return "the last requested replay failed (request it again once fixed): " + foldLine(d.ReplayError, 0)
	}
	return "not requested (outboxrelay inbox dlq replay --id " + fmt.Sprint(d.ID) + ")"
}

// foldLine folds s onto one line, cut to max bytes when max > 0.
func foldLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if max > 0 && len(s) > max {
		s = s[:max-3] + "..."
	}
	return s
}
