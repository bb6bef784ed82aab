package main

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/internal/store"
	"github.com/outboxrelay/outboxrelay/relay"
	rows "github.com/outboxrelay/outboxrelay/replay"
)

func cmdRecover(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("recover", "recover --config FILE [--since T] [--margin 10m] [--force] [--rate N]",
		"Re-creates a lost or replaced replication slot and republishes the outbox rows it missed, then records the new slot's start so that the relay can run again.")
	path := fs.String("config", "", "YAML configuration file")
	sinceFlag := fs.String("since", "", "republish rows created at or after this time (default: the relay's last recorded position, minus --margin)")
	margin := fs.Duration("margin", 10*time.Minute, "republish from this much before the last recorded position: rows are selected by creation time, which precedes the commit")
	force := fs.Bool("force", false, "re-create and republish even when the slot looks healthy")
	rate := fs.Float64("rate", 0, "at most this many messages a second (0: unlimited)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	since, err := parseTime("since", *sinceFlag, time.Now())
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
	if o.source.Columns.CreatedAt == "" {
		return usageErr("%v", rows.ErrNoCreatedAt)
	}
	slot := o.cfg.Postgres.Slot
	st, err := rows.ReadSlot(ctx, o.db, slot)
	if err != nil {
		return usageErr("%v", err)
	}
	if st.Active {
		return usageErr("replication slot %s is in use; stop the relay (and any standby) before running recover", slot)
	}
	if st.Healthy() && !*force {
		fmt.Fprintf(stdout, "replication slot %s is healthy (confirmed %s, recorded %s): nothing to recover; --force re-creates it anyway\n", slot, st.Confirmed, recorded(st))
		return nil
	}
	if since.IsZero() {
		if st.RecordedAt.IsZero() {
			return usageErr("outboxrelay.checkpoint has no recorded position for slot %s, so recover does not know where the relay stopped; give --since TIME", slot)
		}
		since = st.RecordedAt.Add(-*margin)
	}
	if r := o.cfg.Postgres.Retention; r > 0 && since.Before(time.Now().Add(-r)) {
		fmt.Fprintf(stderr, "outboxrelay: warning: rows created before %s were deleted by postgres.retention (%s); messages among them that were never published cannot be recovered: keep postgres.retention longer than the longest outage to survive\n",
			time.Now().Add(-r).UTC().Format(time.RFC3339), r)
	}
	switch {
	case !st.Exists:
		fmt.Fprintf(stdout, "replication slot %s is missing", slot)
	case st.Lost:
		fmt.Fprintf(stdout, "replication slot %s has lost WAL", slot)
	case st.Healthy():
		fmt.Fprintf(stdout, "replication slot %s is healthy (confirmed %s, recorded %s) and --force is set", slot, st.Confirmed, recorded(st))
	default:
		fmt.Fprintf(stdout, "replication slot %s is at %s, ahead of the relay's record %s", slot, st.Confirmed, st.RecordedLSN)
	}
	fmt.Fprintf(stdout, "; re-creating it and republishing rows created since %s\n", since.UTC().Format(time.RFC3339Nano))

	// Dead letters are stored on a connection of their own: o.db reads the
	// rows in the new slot's snapshot meanwhile.
	dlConn, err := connect(ctx, o.cfg.Postgres.URL)
	if err != nil {
		return err
	}
	defer dlConn.Close(context.WithoutCancel(ctx))
	dead := &store.DeadLetters{DB: dlConn, Slot: slot}
	var res rows.RecoverResult
	_, err = publishRows(ctx, o, stderr, *rate, 0, dead.Add, func(ctx context.Context, pub *rows.Publisher, row func()) error {
		var err error
		res, err = rows.Recover(ctx, o.db, pub, rows.RecoverConfig{URL: o.cfg.Postgres.URL, Slot: slot, Failover: o.cfg.Postgres.FailoverSlot,
			Since: since, Source: o.source, Row: row})
		return err
	})
	fmt.Fprintf(stdout, "republished %d messages; slot %s starts at %s\n", res.Published, slot, res.ConsistentPoint)
	countRepublished(ctx, dlConn, o, relay.RepublishedRecover, res.Published)
	printFiltered(stdout, res.Result)
	if n := len(res.Held); n > 0 {
		fmt.Fprintf(stdout, "%d messages of the window wait in outboxrelay.dead_letters and were left there; `outboxrelay dlq replay` publishes them\n", n)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "recovered: start the relay")
	if n := len(res.DeadLettered); n > 0 {
		return &exitError{code: exitUnhealthy, err: fmt.Errorf("%d messages the broker refused, or invalid rows, were dead-lettered as the relay would; see `outboxrelay dlq list` and republish them with `outboxrelay dlq replay` once fixed", n)}
	}
	return resultErr(res.Result)
}

// recorded is the checkpoint's position for a message, "none" when there
// is none.
func recorded(st rows.SlotState) string {
	if !st.Recorded {
		return "none"
	}
	return st.RecordedLSN.String()
}

// countRepublished records in outboxrelay.republished that a command
// published n messages of the configured slot again, for status. A failure
// is logged: the messages are published, and the count is only a figure.
func countRepublished(ctx context.Context, db store.DB, o *opsEnv, reason string, n int64) {
	if err := store.AddRepublished(context.WithoutCancel(ctx), db, o.cfg.Postgres.Slot, reason, n, o.log); err != nil {
		o.log.Warn("count the republished messages in outboxrelay.republished", zap.Error(err))
	}
}
