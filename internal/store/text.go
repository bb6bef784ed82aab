package store

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteText writes s as a two-column table, one field a line, named as in
// the JSON form; unknown figures are "-". Byte counts of a KiB or more get a
// readable size, and last_published_at its age relative to now. Warnings
// follow the table, one a line.
func WriteText(w io.Writer, s Status, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name, value string) {
		fmt.Fprintf(tw, "%s\t%s\n", name, value)
	}
	lsn := func(l LSN) string {
		if l == 0 {
			return "-"
		}
		return l.String()
	}
	row("slot", s.Slot)
	row("exists", strconv.FormatBool(s.Exists))
	if s.Exists {
		row("active", strconv.FormatBool(s.Active))
	} else {
		row("active", "-")
	}
	row("wal_status", orDash(s.WALStatus))
	row("confirmed_flush_lsn", lsn(s.ConfirmedFlushLSN))
	row("restart_lsn", lsn(s.RestartLSN))
	row("current_wal_lsn", lsn(s.CurrentWALLSN))
	if s.LagKnown() {
		row("lag_bytes", byteSize(s.LagBytes))
	} else {
		row("lag_bytes", "-")
	}
	if s.LagSecondsKnown() {
		row("lag_seconds", strconv.FormatFloat(s.LagSeconds, 'f', 1, 64)+" (since "+s.LagSince.UTC().Format(time.RFC3339Nano)+")")
	} else {
		row("lag_seconds", "-")
	}
	if s.RetainedKnown() {
		row("retained_wal_bytes", byteSize(s.RetainedWALBytes))
	} else {
		row("retained_wal_bytes", "-")
	}
	row("last_published_lsn", lsn(s.LastPublishedLSN))
	if s.LastPublishedAt.IsZero() {
		row("last_published_at", "-")
	} else {
		row("last_published_at", s.LastPublishedAt.UTC().Format(time.RFC3339Nano)+" ("+age(now.Sub(s.LastPublishedAt))+")")
	}
	row("last_message_id", orDash(s.LastMessageID))
	row("published_total", strconv.FormatInt(s.PublishedTotal, 10))
	row("republished_total", republishedText(s))
	row("dead_letters", strconv.FormatInt(s.DeadLetters, 10))
	if s.Failover != nil {
		row("failover", strconv.FormatBool(*s.Failover))
	}
	if s.Synced != nil {
		row("synced", strconv.FormatBool(*s.Synced))
	}
	for _, k := range s.Sinks {
		row("sink "+k.Name, sinkLine(k, lsn))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, warning := range s.Warnings {
		if _, err := fmt.Fprintf(w, "warning: %s\n", warning); err != nil {
			return err
		}
	}
	return nil
}

// sinkLine is one sink's own watermark and lag (Status.Sinks).
func sinkLine(k SinkStatus, lsn func(LSN) string) string {
	bytes, secs := "-", "-"
	if k.LagBytes != nil {
		bytes = byteSize(*k.LagBytes)
	}
	if k.LagSeconds != nil {
		secs = strconv.FormatFloat(*k.LagSeconds, 'f', 1, 64)
	}
	line := "confirmed " + lsn(k.ConfirmedLSN) + ", lag_bytes " + bytes + ", lag_seconds " + secs
	switch {
	case k.Behind && k.BehindSince != nil:
		line += fmt.Sprintf(", behind since %s, %d spilled", k.BehindSince.Format(time.RFC3339), k.Spilled)
	case k.Spilled > 0:
		line += fmt.Sprintf(", %d spilled", k.Spilled)
	}
	switch {
	case k.Retrying:
		line += ", retrying"
	case !k.Ready:
		line += ", not ready"
	}
	return line
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// byteSize formats n exactly, with a binary-unit size when it helps reading.
func byteSize(n int64) string {
	exact := strconv.FormatInt(n, 10)
	abs := n
	if abs < 0 {
		abs = -abs
	}
	if abs < 1<<10 {
		return exact
	}
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v := float64(n) / (1 << 10)
	u := 0
	for (v >= 1024 || v <= -1024) && u < len(units)-1 {
		v /= 1024
		u++
	}
	return fmt.Sprintf("%s (%.1f %s)", exact, v, units[u])
}

// age formats how long ago something happened, to the second.
func age(d time.Duration) string {
	if d < 0 {
		return "in the future"
	}
	if d < time.Second {
		return "just now"
	}
	return d.Truncate(time.Second).String() + " ago"
}

// republishedText is the republished count, with its reasons when there
// are any: "3 (retry 2, replay 1)".
func republishedText(s Status) string {
	text := strconv.FormatInt(s.RepublishedTotal, 10)
	if len(s.Republished) == 0 {
		return text
	}
	var parts []string
	for _, reason := range slices.Sorted(maps.Keys(s.Republished)) {
		parts = append(parts, reason+" "+strconv.FormatInt(s.Republished[reason], 10))
	}
	return text + " (" + strings.Join(parts, ", ") + ")"
}
