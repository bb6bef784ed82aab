// Package cdc is the PostgreSQL side of outboxrelay: it prepares the
// publication and the logical replication slot, streams pgoutput over a
// replication connection and decodes it into committed changes.
//
// The relay does not ask pgoutput for streaming of in-progress
// transactions. PostgreSQL then sends a transaction only after it has
// committed, spilling large ones to disk on the server side
// (logical_decoding_work_mem), so every change the Handler sees is already
// committed and can be published as it arrives. A transaction of any size
// flows through in bounded memory: the Handler applies backpressure, and
// nothing is buffered here. Rolled-back transactions and rolled-back
// subtransactions never reach the relay.
package cdc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Config configures the replication side. The zero value of every field
// means its default (WithDefaults); NewStream applies them. Its yaml keys
// are the configuration file's postgres section, which embeds it, and Docs
// describes them.
type Config struct {
	// URL is a PostgreSQL connection URL or DSN. The stream adds
	// replication=database itself. Every libpq TLS parameter (sslmode,
	// sslrootcert, sslcert, sslkey, sslpassword) is honoured, on the
	// regular and the replication connection alike.
	URL string `yaml:"url" secret:"url"`
	// URLFile names a file holding URL (a mounted secret); the
	// configuration loader reads it, NewStream ignores it.
	URLFile string `yaml:"url_file"`
	// Slot is the logical replication slot (pgoutput) to stream from,
	// default "outboxrelay".
	Slot string `yaml:"slot"`
	// Publication is limited to Tables and publishes inserts only, default
	// "outboxrelay".
	Publication string `yaml:"publication"`
	// Tables are the outbox tables, as schema.name, default public.outbox.
	Tables []string `yaml:"tables"`
	// IgnoreTables are tables the publication may also send whose inserts
	// the operator chose not to relay (each is counted and logged). Any
	// other table in the stream that is not in Tables stops the relay.
	IgnoreTables []string `yaml:"ignore_tables"`
	// FailoverSlot makes Setup create the slot as a failover slot
	// (PostgreSQL 17+), which follows a failover to a standby that
	// synchronizes slots.
	FailoverSlot bool `yaml:"failover_slot"`
	// StatusInterval is how often the flushed position is reported
	// (default 1s, at least 100ms and at most 10s).
	StatusInterval time.Duration `yaml:"status_interval"`
	// AcceptConfigChange lets Setup take over a slot that was consumed with
	// another publication or other tables (run --accept-config-change).
	AcceptConfigChange bool `yaml:"-"`
	// Log receives what Setup changes. Optional.
	Log *zap.Logger `yaml:"-"`
	// ApplicationName is shown in pg_stat_replication.
	ApplicationName string `yaml:"-"`
	// DrainTimeout bounds the wait for broker acknowledgements at shutdown
	// (default 30s). The configuration file sets it as relay.drain_timeout.
	DrainTimeout time.Duration `yaml:"-"`
	// ReconnectMin and ReconnectMax bound the reconnect backoff (defaults 500ms, 30s).
	ReconnectMin time.Duration `yaml:"-"`
	ReconnectMax time.Duration `yaml:"-"`
	// StandbyPoll is how often a standby checks whether the slot is free
	// (default 1s): by a session without SlotActive, else by SlotActive,
	// when the Gate keeps this process from taking the slot.
	StandbyPoll time.Duration `yaml:"-"`
	// StandbyProbe is how often a standby that may take the slot asks
	// SlotActive whether it is free (default 200ms): the takeover waits at
	// most this long after the old walsender ends.
	StandbyProbe time.Duration `yaml:"-"`
	// SlotActive, when set, reports whether a walsender holds the slot,
	// through an ordinary connection. A standby asks it rather than open a
	// replication session on every poll, and starts one once the slot is
	// free. Nil: a session every StandbyPoll.
	SlotActive func(ctx context.Context) (bool, error) `yaml:"-"`
	// UnservedAfter is how long a slot may stay free while this process
	// holds its share before it takes the slot above its share
	// (Gate.TakeAbove): no replica with room serves it (default 3s).
	UnservedAfter time.Duration `yaml:"-"`
	// ReceiveTimeout ends a session that received nothing for this long (default 30s).
	ReceiveTimeout time.Duration `yaml:"-"`
	// Gate, when set, is asked before each session whether this process
	// may stream one more slot (replicas sharing pipelines); a refusal
	// waits as a standby does. Nil: always.
	Gate Gate `yaml:"-"`
}

// Gate limits how many slots one process streams at once. Safe for
// concurrent use by the streams that share it.
type Gate interface {
	// Take reserves room for one session; release gives it back when the
	// session ends. ok is false when the process holds its share.
	Take() (release func(), ok bool)
	// TakeAbove reserves room above the share, for a slot that no process
	// with room serves.
	TakeAbove() (release func())
	// Room is closed when Take may succeed again; already closed while
	// it may.
	Room() <-chan struct{}
}

// Docs describes the postgres section's keys that Config holds, for the
// configuration reference; a test fails when a key has no line here or a
// line has no key.
func (Config) Docs() map[string]string {
	return map[string]string{
		"url":             "PostgreSQL URL (`sslmode`, `sslrootcert`, `sslcert`, `sslkey` as usual); the relay adds `replication=database` itself",
		"url_file":        "file holding `postgres.url` (a Kubernetes secret)",
		"slot":            "logical replication slot (pgoutput); created if missing",
		"publication":     "publication, inserts only, limited to `tables`; created or extended if needed",
		"tables":          "outbox tables, `schema.table`",
		"ignore_tables":   "tables the publication also sends that are knowingly not relayed (counted in `outboxrelay_skipped_inserts_total`); any other unconfigured table stops the relay",
		"failover_slot":   "create the slot as a failover slot (PostgreSQL 17+), which follows a failover to a standby with `sync_replication_slots = on`; refused on older versions",
		"status_interval": "how often the confirmed position is reported to PostgreSQL (100ms–10s)",
	}
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_$]{0,62}$`)

// Validate checks the configuration without connecting. c must have its
// defaults (WithDefaults; the configuration file starts from them, so a key
// set to its zero value there is checked as that value).
func (c *Config) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("postgres.url is required"))
	}
	if !identRE.MatchString(c.Slot) {
		errs = append(errs, fmt.Errorf("postgres.slot %q must be a lowercase identifier (letters, digits, _; at most 63)", c.Slot))
	}
	if c.Publication == "" {
		errs = append(errs, errors.New("postgres.publication is required"))
	}
	if len(c.Tables) == 0 {
		errs = append(errs, errors.New("postgres.tables needs at least one table"))
	}
	for _, t := range c.Tables {
		if _, _, err := SplitTable(t); err != nil {
			errs = append(errs, err)
		}
	}
	for _, t := range c.IgnoreTables {
		if _, _, err := SplitTable(t); err != nil {
			errs = append(errs, fmt.Errorf("postgres.ignore_tables: %w", err))
		} else if slices.Contains(qualify(c.Tables), qualify([]string{t})[0]) {
			errs = append(errs, fmt.Errorf("postgres.ignore_tables entry %q is also in postgres.tables", t))
		}
	}
	if c.StatusInterval < 100*time.Millisecond || c.StatusInterval > 10*time.Second {
		errs = append(errs, fmt.Errorf("postgres.status_interval %s must be between 100ms and 10s", c.StatusInterval))
	}
	return errors.Join(errs...)
}

func (c Config) logger() *zap.Logger {
	if c.Log == nil {
		return zap.NewNop()
	}
	return c.Log.Named("cdc")
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Slot = cmp.Or(c.Slot, "outboxrelay")
	c.Publication = cmp.Or(c.Publication, "outboxrelay")
	if len(c.Tables) == 0 {
		c.Tables = []string{"public.outbox"}
	}
	c.StatusInterval = cmp.Or(c.StatusInterval, time.Second)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, 30*time.Second)
	c.ReconnectMin = cmp.Or(c.ReconnectMin, 500*time.Millisecond)
	c.ReconnectMax = cmp.Or(c.ReconnectMax, 30*time.Second)
	c.ReceiveTimeout = cmp.Or(c.ReceiveTimeout, 30*time.Second)
	c.StandbyPoll = cmp.Or(c.StandbyPoll, time.Second)
	c.StandbyProbe = cmp.Or(c.StandbyProbe, 200*time.Millisecond)
	c.UnservedAfter = cmp.Or(c.UnservedAfter, 3*time.Second)
	c.ApplicationName = cmp.Or(c.ApplicationName, "outboxrelay")
	return c
}

// SplitTable splits schema.name; a name without a schema is in public.
func SplitTable(t string) (schema, name string, err error) {
	schema, name, ok := strings.Cut(t, ".")
	if !ok {
		schema, name = "public", t
	}
	if schema == "" || name == "" || strings.Contains(name, ".") {
		return "", "", fmt.Errorf("postgres.tables entry %q must be schema.table", t)
	}
	return schema, name, nil
}

// SetupError is a problem with the database setup or configuration that
// retrying will not fix. Msg is one sentence that names the fix.
type SetupError struct {
	Msg string
}

func (e *SetupError) Error() string { return e.Msg }

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}
