package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxrelay/outboxrelay/inbox"
)

// inboxCommands are the subcommands of inbox.
var inboxCommands = []string{"status", "dlq"}

// cmdInbox reads a consumer database's inbox (the inbox library's tables,
// created by `outboxrelay migrate --inbox`).
func cmdInbox(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageErr("inbox needs a subcommand (status or dlq); see outboxrelay inbox --help")
	}
	switch sub := args[0]; {
	case slices.Contains([]string{"-h", "-help", "--help", "help"}, sub):
		fmt.Fprint(stdout, "Usage:\n  outboxrelay inbox status --database-url URL [--schema S] [--json]\n"+
			"  outboxrelay inbox dlq list|show|replay|discard --database-url URL ...\n\n"+
			"Read a consumer database's inbox: per consumer, the last processed message and when, the dead letters and the parked aggregates; "+
			"list, show, replay and discard its dead letters (outboxrelay inbox dlq --help).\n")
		return nil
	case sub == "dlq":
		return cmdInboxDLQ(args[1:], stdout)
	case sub != "status":
		return usageErr("unknown inbox subcommand %q; use status or dlq (see outboxrelay inbox --help)", sub)
	}
	fs := newFlags("inbox status", "inbox status --database-url URL [--schema S] [--json]",
		"Print, per consumer of a consumer database's inbox (its status view), the last processed message id and time, the dead letters not released, the aggregates parked behind one and the messages waiting behind those. Exits 1 when a dead letter waits.")
	url := fs.String("database-url", "", "PostgreSQL URL of the consumer's database (env OUTBOXRELAY_POSTGRES_URL, OUTBOXRELAY_POSTGRES_URL_FILE, DATABASE_URL)")
	schema := fs.String("schema", inbox.DefaultSchema, "schema of the inbox tables")
	asJSON := fs.Bool("json", false, "print one JSON array")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	return withConn(*url, 30*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
		sts, err := inbox.StatusAll(ctx, conn, *schema)
		if err != nil {
			return usageErr("inbox status: %v; create it with outboxrelay migrate --inbox", err)
		}
		if err := printInboxStatus(stdout, sts, *asJSON); err != nil {
			return err
		}
		for _, st := range sts {
			if st.DeadLetters > 0 {
				return &exitError{code: exitUnhealthy, err: fmt.Errorf("inbox status: consumer %s has %d dead letters waiting", st.Consumer, st.DeadLetters)}
			}
		}
		return nil
	})
}

// inboxStatusJSON is one consumer's line of inbox status --json.
type inboxStatusJSON struct {
	Consumer         string     `json:"consumer"`
	LastMessageID    string     `json:"last_message_id,omitempty"`
	LastProcessedAt  *time.Time `json:"last_processed_at,omitempty"`
	DeadLetters      int64      `json:"dead_letters"`
	ParkedAggregates int64      `json:"parked_aggregates"`
	ParkedMessages   int64      `json:"parked_messages"`
}

func printInboxStatus(w io.Writer, sts []inbox.ConsumerStatus, asJSON bool) error {
	if asJSON {
		out := make([]inboxStatusJSON, len(sts))
		for i, st := range sts {
			out[i] = inboxStatusJSON{Consumer: st.Consumer, LastMessageID: st.LastMessageID, DeadLetters: st.DeadLetters,
				ParkedAggregates: st.ParkedAggregates, ParkedMessages: st.ParkedMessages}
			if !st.LastProcessedAt.IsZero() {
				at := st.LastProcessedAt.UTC()
				out[i].LastProcessedAt = &at
			}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	if len(sts) == 0 {
		_, err := fmt.Fprintln(w, "no consumer has processed records in the window or dead letters")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tLAST MESSAGE\tLAST PROCESSED\tDEAD LETTERS\tPARKED AGGREGATES\tWAITING")
	for _, st := range sts {
		last, at := "-", "-"
		if st.LastMessageID != "" {
			last, at = st.LastMessageID, st.LastProcessedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\n", st.Consumer, last, at, st.DeadLetters, st.ParkedAggregates, st.ParkedMessages)
	}
	return tw.Flush()
}
