package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/internal/store"
)

// statusView is what `status --all` and `status --watch` print.
type statusView struct {
	all        bool
	slot       string
	json, wide bool
	maxLag     int64
	watch      bool
	interval   time.Duration
}

// statusAll prints the status once, or with watch every interval until ctx
// ends (then it returns nil). On a terminal a watch redraws the screen;
// elsewhere (a log, a pipe) it prints one summary line per interval.
func statusAll(ctx context.Context, url string, v statusView, stdout io.Writer) error {
	conn, err := connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tty := isTerminal(stdout)
	for {
		readCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		var buf bytes.Buffer
		problems, err := v.render(readCtx, conn, &buf, v.watch && !tty)
		cancel()
		if err != nil {
			if v.watch && ctx.Err() != nil {
				return nil
			}
			return usageErr("status: %v", err)
		}
		if v.watch && tty {
			fmt.Fprint(stdout, "\x1b[H\x1b[2J") // home, clear
		}
		if _, err := stdout.Write(buf.Bytes()); err != nil {
			return err
		}
		if !v.watch {
			if len(problems) > 0 {
				return &exitError{code: exitUnhealthy, err: errors.New("unhealthy: " + strings.Join(problems, "; "))}
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(v.interval):
		}
	}
}

// render writes one reading and returns what makes it unhealthy. line asks
// for one summary line (a watch that is not on a terminal).
func (v statusView) render(ctx context.Context, conn *pgx.Conn, w io.Writer, line bool) (problems []string, err error) {
	now := time.Now()
	if !v.all {
		st, err := store.ReadStatus(ctx, conn, v.slot)
		if err != nil {
			return nil, err
		}
		switch {
		case line:
			fmt.Fprintln(w, watchLine(st, now))
		default:
			if err := printStatus(w, st, v.json, now); err != nil {
				return nil, err
			}
		}
		return st.Problems(v.maxLag), nil
	}
	slots, err := store.ReadSlots(ctx, conn)
	if err != nil {
		return nil, err
	}
	var flagged []string
	var retained int64
	active := 0
	for _, s := range slots {
		if s.Flag != "" {
			flagged = append(flagged, s.Slot+": "+s.Flag)
		}
		if s.Active {
			active++
		}
		retained += s.RetainedWALBytes
	}
	switch {
	case line:
		fmt.Fprintf(w, "%s slots=%d active=%d flagged=%d retained_wal_bytes=%d\n", now.UTC().Format(time.RFC3339), len(slots), active, len(flagged), retained)
	case v.json:
		if slots == nil {
			slots = []store.Slot{}
		}
		b, err := json.MarshalIndent(slots, "", "  ")
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(w, "%s\n", b)
	default:
		writeSlots(w, slots, v.wide, now)
	}
	return flagged, nil
}

func writeSlots(w io.Writer, slots []store.Slot, wide bool, now time.Time) {
	if len(slots) == 0 {
		fmt.Fprintln(w, "no logical replication slots")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "SLOT\tDATABASE\tACTIVE\tINACTIVE SINCE\tRETAINED WAL\tWAL STATUS\tCHECKPOINT"
	if wide {
		head += "\tPLUGIN\tRESTART LSN\tCONFIRMED LSN"
	}
	fmt.Fprintln(tw, head+"\tFLAG")
	for _, s := range slots {
		since := "-"
		if s.InactiveSince != nil {
			since = fmt.Sprintf("%s (%s ago)", s.InactiveSince.Format(time.RFC3339), now.Sub(*s.InactiveSince).Truncate(time.Second))
		}
		checkpoint := "?"
		if s.Checkpoint != nil {
			checkpoint = map[bool]string{true: "yes", false: "no"}[*s.Checkpoint]
		}
		row := fmt.Sprintf("%s\t%s\t%t\t%s\t%d\t%s\t%s", s.Slot, s.Database, s.Active, since, s.RetainedWALBytes, orDash(s.WALStatus), checkpoint)
		if wide {
			row += fmt.Sprintf("\t%s\t%s\t%s", s.Plugin, orDash(s.RestartLSN), orDash(s.ConfirmedLSN))
		}
		fmt.Fprintln(tw, row+"\t"+orDash(s.Flag))
	}
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// isTerminal reports whether w is a character device, such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// watchLine is the one line a watch that is not on a terminal prints per
// reading. lag_seconds is "-" until a relay has recorded where lag counts
// from.
func watchLine(st store.Status, now time.Time) string {
	lagSeconds := "-"
	if st.LagSecondsKnown() {
		lagSeconds = strconv.FormatFloat(st.LagSeconds, 'f', 1, 64)
	}
	return fmt.Sprintf("%s slot=%s exists=%t active=%t wal_status=%s lag_bytes=%d lag_seconds=%s published_total=%d republished_total=%d dead_letters=%d",
		now.UTC().Format(time.RFC3339), st.Slot, st.Exists, st.Active, orDash(st.WALStatus), st.LagBytes, lagSeconds, st.PublishedTotal, st.RepublishedTotal, st.DeadLetters)
}
