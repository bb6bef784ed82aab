package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outboxrelay/cdc"
)

// LSN is a WAL position. It is encoded in JSON as PostgreSQL writes it
// ("0/1A2B3C4"), and as null when it is zero (unknown).
type LSN uint64

// String formats l as PostgreSQL does.
func (l LSN) String() string { return pglogrepl.LSN(l).String() }

// MarshalJSON implements json.Marshaler.
func (l LSN) MarshalJSON() ([]byte, error) {
	if l == 0 {
		return []byte("null"), nil
	}
	return json.Marshal(l.String())
}

// UnmarshalJSON implements json.Unmarshaler.
func (l *LSN) UnmarshalJSON(b []byte) error {
	var s *string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	if s == nil {
		*l = 0
		return nil
	}
	v, err := pglogrepl.ParseLSN(*s)
	if err != nil {
		return fmt.Errorf("lsn %q: %w", *s, err)
	}
	*l = LSN(v)
	return nil
}

// Status is the status of one slot. Its JSON form has the same
// names as the columns of the view outboxrelay.status; figures that are not
// known (for a missing slot, or before the first publish) are null.
type Status struct {
	Slot   string `json:"slot"`
	Exists bool   `json:"exists"`
	// Active reports whether a process (normally the relay) streams from the slot.
	Active bool `json:"active"`
	// WALStatus is pg_replication_slots.wal_status: reserved, extended,
	// unreserved or lost.
	WALStatus         string `json:"wal_status"`
	ConfirmedFlushLSN LSN    `json:"confirmed_flush_lsn"`
	RestartLSN        LSN    `json:"restart_lsn"`
	CurrentWALLSN     LSN    `json:"current_wal_lsn"`
	// LagBytes is how much WAL may still hold undelivered messages:
	// current_wal_lsn minus the older of confirmed_flush_lsn and
	// restart_lsn. Keepalives move confirmed_flush_lsn through a
	// transaction the server is still decoding; restart_lsn stays before
	// it until it is delivered. Between transactions restart_lsn trails by
	// up to the last running-transactions record (PostgreSQL writes one
	// about every 15 s while WAL is written). Valid only when LagKnown.
	LagBytes int64 `json:"lag_bytes"`
	// LagSeconds is the age of the oldest committed message the broker
	// has not acknowledged or, when nothing is pending, of the newest
	// transaction the relay saw (its heartbeat on an idle relay). It is
	// computed by PostgreSQL from LagSince, which the relay records, so it
	// keeps growing while the relay is stopped or stuck. Valid only when
	// LagSecondsKnown.
	LagSeconds float64 `json:"lag_seconds"`
	// LagSince is the commit time LagSeconds counts from (the server's
	// clock). Not a column of the view.
	LagSince time.Time `json:"-"`
	// RetainedWALBytes is how much WAL the slot keeps on the server:
	// current_wal_lsn - restart_lsn. Valid only when RetainedKnown.
	RetainedWALBytes int64 `json:"retained_wal_bytes"`
	// LastPublishedLSN, LastPublishedAt and LastMessageID describe the
	// furthest message the broker has acknowledged; PublishedTotal counts
	// acknowledged messages over the slot's life (repeats after a crash
	// included).
	LastPublishedLSN LSN       `json:"last_published_lsn"`
	LastPublishedAt  time.Time `json:"last_published_at"`
	LastMessageID    string    `json:"last_message_id"`
	PublishedTotal   int64     `json:"published_total"`
	// RepublishedTotal counts the messages published again while the
	// broker may already have held them, over the slot's life, and
	// Republished by reason (relay.RepublishedRetry and the others; nil
	// when none):
	// what each relay, `replay` and `recover` could know of. What a killed
	// or replaced relay published past the confirmed position is not in it.
	RepublishedTotal int64            `json:"republished_total"`
	Republished      map[string]int64 `json:"republished,omitempty"`
	// DeadLetters counts dead letters of the slot not yet replayed.
	DeadLetters int64 `json:"dead_letters"`
	// MaxSlotWALKeepSize is the server's max_slot_wal_keep_size in bytes,
	// -1 when unlimited (0: not read). Not in the JSON form nor the view.
	MaxSlotWALKeepSize int64 `json:"-"`
	// LastError is why the relay last stopped with an error, and when;
	// cleared when a relay starts. Not a column of the view.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"-"`
	// Coverage lists why inserts into the outbox tables the slot is
	// consumed for would not reach the relay (see cdc.CoverageState).
	// Not a column of the view.
	Coverage []string `json:"coverage,omitempty"`
	// Failover reports whether the slot is a failover slot, which
	// PostgreSQL 17 and later synchronize to standbys; Synced whether this
	// server's slot is such a synchronized copy (on a standby, or on a
	// standby promoted since). Both are nil before PostgreSQL 17 and for a
	// missing slot. Not columns of the view.
	Failover *bool `json:"failover,omitempty"`
	Synced   *bool `json:"synced,omitempty"`
	// Warnings say why some figures are missing (for example the
	// outboxrelay schema is not there). Not a column of the view.
	Warnings []string `json:"warnings,omitempty"`
	// Sinks is each sink's own progress when the relay feeds several
	// (the sinks section), as the running relay knows it: the slot's
	// confirmed position is the lowest of their watermarks. Not a column
	// of the view.
	Sinks []SinkStatus `json:"sinks,omitempty"`
	// MissingSlot is, for a slot that does not exist, what `run` will
	// do about it (cdc.MissingSlot): nil when it will create the slot,
	// the error it will refuse to start with otherwise. Problems reports
	// it. Not in the JSON form nor the view.
	MissingSlot error `json:"-"`
}

// SinkStatus is one sink's own progress (Status.Sinks). Figures that are
// not known are null.
type SinkStatus struct {
	Name string `json:"name"`
	// ConfirmedLSN is the sink's own watermark: every one of its messages
	// before it is acknowledged (or dead-lettered or parked).
	ConfirmedLSN LSN `json:"confirmed_lsn"`
	// LagBytes is current_wal_lsn minus ConfirmedLSN; LagSeconds the age of
	// the sink's oldest message its broker has not acknowledged.
	LagBytes   *int64   `json:"lag_bytes"`
	LagSeconds *float64 `json:"lag_seconds"`
	Ready      bool     `json:"ready"`
	Retrying   bool     `json:"retrying"`
	// Behind says the sink fell behind the others since BehindSince (nil
	// otherwise), and its messages go to outboxrelay.spilled; Spilled is
	// how many of them wait there (relay.behind: spill).
	Behind      bool       `json:"behind"`
	BehindSince *time.Time `json:"behind_since"`
	Spilled     int64      `json:"spilled"`
}

// LagKnown reports whether LagBytes is meaningful.
func (s Status) LagKnown() bool {
	return s.Exists && s.ConfirmedFlushLSN != 0 && s.CurrentWALLSN != 0
}

// LagSecondsKnown reports whether LagSeconds is meaningful: the slot exists
// and a relay recorded where lag counts from.
func (s Status) LagSecondsKnown() bool { return s.Exists && !s.LagSince.IsZero() }

// RetainedKnown reports whether RetainedWALBytes is meaningful.
func (s Status) RetainedKnown() bool {
	return s.Exists && s.RestartLSN != 0 && s.CurrentWALLSN != 0
}

// MarshalJSON writes unknown figures as null, in the order of the view's columns.
func (s Status) MarshalJSON() ([]byte, error) {
	type nullable struct {
		Slot              string           `json:"slot"`
		Exists            bool             `json:"exists"`
		Active            *bool            `json:"active"`
		WALStatus         *string          `json:"wal_status"`
		ConfirmedFlushLSN LSN              `json:"confirmed_flush_lsn"`
		RestartLSN        LSN              `json:"restart_lsn"`
		CurrentWALLSN     LSN              `json:"current_wal_lsn"`
		LagBytes          *int64           `json:"lag_bytes"`
		LagSeconds        *float64         `json:"lag_seconds"`
		RetainedWALBytes  *int64           `json:"retained_wal_bytes"`
		LastPublishedLSN  LSN              `json:"last_published_lsn"`
		LastPublishedAt   *time.Time       `json:"last_published_at"`
		LastMessageID     *string          `json:"last_message_id"`
		PublishedTotal    int64            `json:"published_total"`
		RepublishedTotal  int64            `json:"republished_total"`
		DeadLetters       int64            `json:"dead_letters"`
		LastError         string           `json:"last_error,omitempty"`
		Republished       map[string]int64 `json:"republished,omitempty"`
		Coverage          []string         `json:"coverage,omitempty"`
		Failover          *bool            `json:"failover,omitempty"`
		Synced            *bool            `json:"synced,omitempty"`
		Warnings          []string         `json:"warnings,omitempty"`
		Sinks             []SinkStatus     `json:"sinks,omitempty"`
	}
	n := nullable{
		Slot: s.Slot, Exists: s.Exists, ConfirmedFlushLSN: s.ConfirmedFlushLSN, RestartLSN: s.RestartLSN,
		CurrentWALLSN: s.CurrentWALLSN, LastPublishedLSN: s.LastPublishedLSN, PublishedTotal: s.PublishedTotal,
		RepublishedTotal: s.RepublishedTotal, Republished: s.Republished, DeadLetters: s.DeadLetters, LastError: s.LastError, Coverage: s.Coverage, Warnings: s.Warnings,
		Failover: s.Failover, Synced: s.Synced, Sinks: s.Sinks,
	}
	if s.Exists {
		n.Active = &s.Active
	}
	if s.WALStatus != "" {
		n.WALStatus = &s.WALStatus
	}
	if s.LagKnown() {
		n.LagBytes = &s.LagBytes
	}
	if s.LagSecondsKnown() {
		n.LagSeconds = &s.LagSeconds
	}
	if s.RetainedKnown() {
		n.RetainedWALBytes = &s.RetainedWALBytes
	}
	if !s.LastPublishedAt.IsZero() {
		t := s.LastPublishedAt.UTC()
		n.LastPublishedAt = &t
	}
	if s.LastMessageID != "" {
		n.LastMessageID = &s.LastMessageID
	}
	return json.Marshal(n)
}

// Problems lists why the slot is unhealthy, or nothing when it is healthy:
// the slot is missing, PostgreSQL removed (lost) or is about to remove
// (unreserved) WAL the slot needs, or the lag is over maxLagBytes (when
// maxLagBytes > 0).
func (s Status) Problems(maxLagBytes int64) []string {
	var p []string
	if !s.Exists {
		if s.MissingSlot != nil {
			return append(p, s.MissingSlot.Error())
		}
		return append(p, fmt.Sprintf("replication slot %q does not exist; start the relay to create it (or check --slot)", s.Slot))
	}
	switch s.WALStatus {
	case "lost":
		p = append(p, cdc.LostSlot(s.Slot).Error())
	case "unreserved":
		p = append(p, fmt.Sprintf("replication slot %q has wal_status=unreserved: PostgreSQL will remove WAL the relay still needs at the next checkpoint (max_slot_wal_keep_size)", s.Slot))
	}
	if !s.Active && s.LastError != "" {
		p = append(p, fmt.Sprintf("the relay stopped at %s: %s", s.LastErrorAt.UTC().Format(time.RFC3339), s.LastError))
	}
	for _, c := range s.Coverage {
		p = append(p, "coverage lost: "+c)
	}
	if maxLagBytes > 0 && s.LagKnown() && s.LagBytes > maxLagBytes {
		p = append(p, fmt.Sprintf("lag of %d bytes is over the limit of %d bytes", s.LagBytes, maxLagBytes))
	}
	return p
}

// The current position is the replay position on a standby, where
// pg_current_wal_lsn() fails. The view uses the same expression. The
// failover and synced columns exist from PostgreSQL 17 on; read through
// to_jsonb they are NULL before.
const slotQuery = `
SELECT w.lsn::text,
       s.slot_name IS NOT NULL,
       coalesce(s.active, false),
       coalesce(s.wal_status, ''),
       s.confirmed_flush_lsn::text,
       s.restart_lsn::text,
       coalesce(s.plugin, ''),
       coalesce(s.database::text, ''),
       current_database()::text,
       to_regclass('outboxrelay.checkpoint') IS NOT NULL,
       to_regclass('outboxrelay.dead_letters') IS NOT NULL,
       (to_jsonb(s) ->> 'failover')::bool,
       (to_jsonb(s) ->> 'synced')::bool,
       pg_size_bytes(current_setting('max_slot_wal_keep_size'))
FROM (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn) w
LEFT JOIN pg_replication_slots s ON s.slot_name = $1`

const progressQuery = `
SELECT last_lsn::text, last_message_id, last_published_at, published_total
FROM outboxrelay.checkpoint WHERE slot = $1`

// missingSlot reads what cdc.MissingSlot decides from, as the relay reads
// it at start: the position recorded as confirmed, and the timeline.
func missingSlot(ctx context.Context, q Querier, slot string) (refusal, err error) {
	var text *string
	err = q.QueryRow(ctx, `SELECT confirmed_lsn::text FROM outboxrelay.checkpoint WHERE slot = $1`, slot).Scan(&text)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == "42703": // a schema from before confirmed_lsn: nothing recorded
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read outboxrelay.checkpoint: %w", err)
	case text == nil:
		return nil, nil
	}
	confirmed, err := pglogrepl.ParseLSN(*text)
	if err != nil {
		return nil, fmt.Errorf("parse lsn %q: %w", *text, err)
	}
	return cdc.MissingSlot(slot, cdc.LSN(confirmed), true, cdc.ReadTimeline(ctx, q)), nil
}

const consumerQuery = `
SELECT publication, coalesce(tables, '{}'), coalesce(error, ''), coalesce(error_at, 'epoch') FROM outboxrelay.checkpoint
WHERE slot = $1`

// The view computes lag_seconds the same way.
const lagQuery = `
SELECT lag_since, GREATEST(0, extract(epoch FROM clock_timestamp() - lag_since))::double precision
FROM outboxrelay.checkpoint WHERE slot = $1 AND lag_since IS NOT NULL`

const deadLettersQuery = `
SELECT count(*) FROM outboxrelay.dead_letters WHERE slot = $1 AND replayed_at IS NULL`

// ReadStatus returns the status of slot. A missing slot is not an error (Exists
// is false), nor is a missing outboxrelay schema: the slot's figures are
// still read and Warnings says what is missing. It runs a few short
// queries; it returns ctx's error when ctx ends first. It is safe for
// concurrent use if q is.
func ReadStatus(ctx context.Context, q Querier, slot string) (Status, error) {
	s := Status{Slot: slot}
	var (
		current, confirmed, restart     *string
		plugin, database, currentDB     string
		haveCheckpoint, haveDeadLetters bool
	)
	err := q.QueryRow(ctx, slotQuery, slot).Scan(&current, &s.Exists, &s.Active, &s.WALStatus, &confirmed, &restart,
		&plugin, &database, &currentDB, &haveCheckpoint, &haveDeadLetters, &s.Failover, &s.Synced, &s.MaxSlotWALKeepSize)
	if err != nil {
		return s, fmt.Errorf("read replication slot %q: %w", slot, err)
	}
	for _, f := range []struct {
		text *string
		lsn  *LSN
	}{{current, &s.CurrentWALLSN}, {confirmed, &s.ConfirmedFlushLSN}, {restart, &s.RestartLSN}} {
		if f.text == nil {
			continue
		}
		v, err := pglogrepl.ParseLSN(*f.text)
		if err != nil {
			return s, fmt.Errorf("parse lsn %q: %w", *f.text, err)
		}
		*f.lsn = LSN(v)
	}
	s.LagBytes = int64(s.CurrentWALLSN) - int64(min(s.ConfirmedFlushLSN, s.RestartLSN))
	if s.RestartLSN == 0 {
		s.LagBytes = int64(s.CurrentWALLSN) - int64(s.ConfirmedFlushLSN)
	}
	s.RetainedWALBytes = int64(s.CurrentWALLSN) - int64(s.RestartLSN)
	if s.Exists {
		switch {
		case database == "":
			s.Warnings = append(s.Warnings, fmt.Sprintf("slot %q is a physical slot, not the relay's", slot))
		case database != currentDB:
			s.Warnings = append(s.Warnings, fmt.Sprintf("slot %q belongs to database %q; connect to it to see the relay's progress", slot, database))
		case plugin != "pgoutput":
			s.Warnings = append(s.Warnings, fmt.Sprintf("slot %q uses plugin %s, not pgoutput", slot, plugin))
		}
	}

	if !haveCheckpoint {
		s.Warnings = append(s.Warnings, "schema outboxrelay is missing, so relay progress is unknown; run `outboxrelay migrate`")
		return s, nil
	}
	if !s.Exists {
		if s.MissingSlot, err = missingSlot(ctx, q, slot); err != nil {
			return s, err
		}
	}
	var (
		lastLSN, lastID *string
		lastAt          *time.Time
	)
	err = q.QueryRow(ctx, progressQuery, slot).Scan(&lastLSN, &lastID, &lastAt, &s.PublishedTotal)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return s, fmt.Errorf("read outboxrelay.checkpoint: %w", err)
	}
	if err := readRepublishedTotals(ctx, q, &s); err != nil {
		return s, err
	}
	if lastLSN != nil {
		v, err := pglogrepl.ParseLSN(*lastLSN)
		if err != nil {
			return s, fmt.Errorf("parse lsn %q: %w", *lastLSN, err)
		}
		s.LastPublishedLSN = LSN(v)
	}
	if lastID != nil {
		s.LastMessageID = *lastID
	}
	if lastAt != nil {
		s.LastPublishedAt = lastAt.UTC()
	}
	if s.Exists {
		var pub *string
		var tables []string
		err = q.QueryRow(ctx, consumerQuery, slot).Scan(&pub, &tables, &s.LastError, &s.LastErrorAt)
		var pgErr *pgconn.PgError
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case errors.As(err, &pgErr) && pgErr.Code == "42703": // undefined_column: schema from before coverage
			s.Warnings = append(s.Warnings, "schema outboxrelay is from an older version, so coverage is not checked; run `outboxrelay migrate`")
		case err != nil:
			return s, fmt.Errorf("read outboxrelay.checkpoint: %w", err)
		case pub != nil:
			cov, err := cdc.ReadCoverage(ctx, q, *pub, tables)
			if err != nil {
				return s, fmt.Errorf("check coverage: %w", err)
			}
			s.Coverage = cov.Problems()
		}
	}
	if s.Exists {
		err = q.QueryRow(ctx, lagQuery, slot).Scan(&s.LagSince, &s.LagSeconds)
		var pgErr *pgconn.PgError
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case errors.As(err, &pgErr) && pgErr.Code == "42703": // undefined_column: schema from before lag_seconds
			s.Warnings = append(s.Warnings, "schema outboxrelay is from an older version, so lag_seconds is unknown; run `outboxrelay migrate`")
		case err != nil:
			return s, fmt.Errorf("read lag: %w", err)
		}
		s.LagSince = s.LagSince.UTC()
	}
	if haveDeadLetters {
		err = q.QueryRow(ctx, deadLettersQuery, slot).Scan(&s.DeadLetters)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "42501": // insufficient_privilege
			s.Warnings = append(s.Warnings, "no SELECT privilege on outboxrelay.dead_letters, so dead_letters is not counted; use the view outboxrelay.status")
		case err != nil:
			return s, fmt.Errorf("count dead letters: %w", err)
		}
	}
	return s, nil
}
