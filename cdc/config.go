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
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Config configures the replication side.
type Config struct {
	// URL is a PostgreSQL connection URL or DSN. The stream adds
	// replication=database itself.
	URL string
	// Slot is the logical replication slot (pgoutput) to stream from.
	Slot string
	// Publication is limited to Tables and publishes inserts only.
	Publication string
	// Tables are the outbox tables, as schema.name.
	Tables []string
	// IgnoreTables are tables the publication may also send whose inserts
	// the operator chose not to relay (each is counted and logged).
	IgnoreTables []string
	// AcceptConfigChange lets Setup take over a slot that was consumed with
	// another publication or other tables (run --accept-config-change).
	AcceptConfigChange bool
	// FailoverSlot makes Setup create the slot as a failover slot
	// (PostgreSQL 17+), which follows a failover to a standby that
	// synchronizes slots.
	FailoverSlot bool
	// Log receives what Setup changes. Optional.
	Log *zap.Logger
	// ApplicationName is shown in pg_stat_replication.
	ApplicationName string
	// StatusInterval is how often the flushed position is reported (default 1s).
	StatusInterval time.Duration
	// DrainTimeout bounds the wait for broker acknowledgements at shutdown (default 30s).
	DrainTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the reconnect backoff (defaults 500ms, 30s).
	ReconnectMin, ReconnectMax time.Duration
	// StandbyPoll is how often a standby checks whether the slot is free (default 1s).
	StandbyPoll time.Duration
	// ReceiveTimeout ends a session that received nothing for this long (default 30s).
	ReceiveTimeout time.Duration
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_$]{0,62}$`)

// Validate checks the configuration without connecting.
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
	return errors.Join(errs...)
}

func (c Config) logger() *zap.Logger {
	if c.Log == nil {
		return zap.NewNop()
	}
	return c.Log.Named("cdc")
}

func (c *Config) setDefaults() {
	if c.StatusInterval <= 0 {
		c.StatusInterval = time.Second
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = 500 * time.Millisecond
	}
	if c.ReconnectMax <= 0 {
		c.ReconnectMax = 30 * time.Second
	}
	if c.ReceiveTimeout <= 0 {
		c.ReceiveTimeout = 30 * time.Second
	}
	if c.StandbyPoll <= 0 {
		c.StandbyPoll = time.Second
	}
	if c.ApplicationName == "" {
		c.ApplicationName = "outboxrelay"
	}
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
