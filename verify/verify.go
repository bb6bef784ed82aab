// Package verify proves that the outbox rows committed in a time window
// reached the broker: it reconciles their ids, by message_id, against what
// the broker holds (a Reader per broker) and counts what was found,
// missing, duplicated, dead-lettered and parked.
//
// Memory does not grow with the number of ids: the broker's ids stream
// into a temporary table of the verifying session (COPY), and PostgreSQL
// joins them with the outbox rows; missing ids stream back from a cursor.
package verify

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/replay"
)

// Reader reads the message ids a broker holds.
type Reader interface {
	// Read calls fn with the message_id of every message in the given
	// destinations (topics, stream keys; a reader of one whole stream
	// ignores them) that the broker stored at or after since, up to what it
	// held when Read started. An id stored twice is passed twice.
	Read(ctx context.Context, since time.Time, destinations []string, fn func(id string) error) error
	// Close releases the reader's connections.
	Close() error
}

// Config configures a verification.
type Config struct {
	Source replay.Source
	Filter replay.Filter
	// Slot names the dead letters that count (outboxrelay.dead_letters.slot).
	Slot string
	// Destination renders the destination of a route (aggregate_type,
	// event_type, table); nil for a reader that ignores destinations.
	Destination func(m *relay.Message) (string, error)
	// Margin is how much earlier than Filter.Since the broker is read, for
	// clock skew between PostgreSQL and the broker (default 1m).
	Margin time.Duration
	// Progress, when set, is called with the ids read from the broker so far.
	Progress func(read int64)
	// Counted, when set, is called with the counts before the missing ids
	// are listed.
	Counted func(Report)
}

// Report is the outcome of a verification.
type Report struct {
	// Committed rows in the window; Found of them at the broker at least
	// once; Duplicates: extra copies of found rows; DeadLettered: not found
	// and in outboxrelay.dead_letters (not replayed); Parked: not found and
	// held in outboxrelay.parked behind a dead letter of their aggregate
	// (dlq replay publishes them); Missing: none of these.
	// Filtered: not found and dropped by the routing rules (unmatched:
	// drop), as the relay drops them.
	Committed, Found, Missing, Duplicates, DeadLettered, Parked, Filtered int64
	// BrokerIDs is the number of ids read from the broker.
	BrokerIDs int64
}

// seenTable and missingTable are temporary tables of the verifying session.
const (
	seenTable     = "outboxrelay_verify_seen"
	missingTable  = "outboxrelay_verify_missing"
	filteredTable = "outboxrelay_verify_filtered"
)

// MissingTable names the temporary table Run leaves in the session with the
// missing ids (column id), for replay.Filter.Only.
const MissingTable = missingTable

// Run reconciles and calls missing, in creation order, with every missing
// id. It leaves the missing ids in the session's temporary table
// MissingTable. db must not be in a transaction.
func Run(ctx context.Context, db *pgx.Conn, rd Reader, cfg Config, missing func(id string) error) (Report, error) {
	var rep Report
	if cfg.Margin <= 0 {
		cfg.Margin = time.Minute
	}
	for _, q := range []string{
		"DROP TABLE IF EXISTS pg_temp." + filteredTable,
		"CREATE TEMP TABLE " + filteredTable + " (message_id text NOT NULL)",
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			return rep, fmt.Errorf("prepare temporary tables: %w", err)
		}
	}
	dests, err := destinations(ctx, db, cfg)
	if err != nil {
		return rep, err
	}
	for _, q := range []string{
		"DROP TABLE IF EXISTS pg_temp." + seenTable,
		"DROP TABLE IF EXISTS pg_temp." + missingTable,
		"CREATE TEMP TABLE " + seenTable + " (message_id text NOT NULL)",
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			return rep, fmt.Errorf("prepare temporary tables: %w", err)
		}
	}

	// Read the broker into the temporary table. The reader runs on its own
	// goroutine; COPY pulls ids from it in batches.
	ids := make(chan []any, 1024)
	readErr := make(chan error, 1)
	readCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(ids)
		var n int64
		err := rd.Read(readCtx, cfg.Filter.Since.Add(-cfg.Margin), dests, func(id string) error {
			select {
			case ids <- []any{id}:
			case <-readCtx.Done():
				return readCtx.Err()
			}
			n++
			if cfg.Progress != nil && n%1000 == 0 {
				cfg.Progress(n)
			}
			return nil
		})
		if cfg.Progress != nil {
			cfg.Progress(n)
		}
		readErr <- err
	}()
	copied, err := db.CopyFrom(ctx, pgx.Identifier{seenTable}, []string{"message_id"}, pgx.CopyFromFunc(func() ([]any, error) {
		row, ok := <-ids
		if !ok {
			return nil, nil
		}
		return row, nil
	}))
	cancel()
	for range ids { // let the reader finish
	}
	rerr := <-readErr
	if err != nil {
		return rep, fmt.Errorf("store broker ids: %w", err)
	}
	if rerr != nil {
		return rep, fmt.Errorf("read the broker: %w", rerr)
	}
	rep.BrokerIDs = copied
	if _, err := db.Exec(ctx, "CREATE INDEX ON pg_temp."+seenTable+" (message_id); ANALYZE pg_temp."+seenTable); err != nil {
		return rep, fmt.Errorf("index broker ids: %w", err)
	}

	rows, args, err := cfg.Source.IDQuery(cfg.Filter)
	if err != nil {
		return rep, err
	}
	args = append(args, cfg.Slot)
	slotArg := fmt.Sprintf("$%d", len(args))
	// One row per committed id: how often the broker holds it, whether it
	// is a pending dead letter and whether it is parked behind one.
	classified := `SELECT c.id, c.created_at, coalesce(s.n, 0) AS n,
			EXISTS (SELECT 1 FROM outboxrelay.dead_letters d WHERE d.slot = ` + slotArg + ` AND d.message_id = c.id AND d.replayed_at IS NULL) AS dead,
			EXISTS (SELECT 1 FROM outboxrelay.parked p WHERE p.slot = ` + slotArg + ` AND p.message_id = c.id) AS parked,
			EXISTS (SELECT 1 FROM pg_temp.` + filteredTable + ` f WHERE f.message_id = c.id) AS filtered
		FROM (` + rows + `) c
		LEFT JOIN (SELECT message_id, count(*) AS n FROM pg_temp.` + seenTable + ` GROUP BY 1) s ON s.message_id = c.id`
	if _, err := db.Exec(ctx, "CREATE TEMP TABLE "+missingTable+" AS SELECT id, created_at FROM ("+classified+") x WHERE n = 0 AND NOT dead AND NOT parked AND NOT filtered", args...); err != nil {
		return rep, fmt.Errorf("reconcile: %w", err)
	}
	err = db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE n > 0), coalesce(sum(n - 1) FILTER (WHERE n > 1), 0),
			count(*) FILTER (WHERE n = 0 AND dead), count(*) FILTER (WHERE n = 0 AND NOT dead AND parked),
			count(*) FILTER (WHERE n = 0 AND NOT dead AND NOT parked AND filtered),
			count(*) FILTER (WHERE n = 0 AND NOT dead AND NOT parked AND NOT filtered)
		FROM (`+classified+`) x`, args...).Scan(&rep.Committed, &rep.Found, &rep.Duplicates, &rep.DeadLettered, &rep.Parked, &rep.Filtered, &rep.Missing)
	if err != nil {
		return rep, fmt.Errorf("reconcile: %w", err)
	}
	if cfg.Counted != nil {
		cfg.Counted(rep)
	}
	if missing == nil || rep.Missing == 0 {
		return rep, nil
	}
	// A cursor: the list streams however long it is.
	tx, err := db.Begin(ctx)
	if err != nil {
		return rep, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "DECLARE outboxrelay_missing_ids NO SCROLL CURSOR FOR SELECT id FROM pg_temp."+missingTable+" ORDER BY created_at, id"); err != nil {
		return rep, err
	}
	for {
		r, err := tx.Query(ctx, "FETCH 1000 FROM outboxrelay_missing_ids")
		if err != nil {
			return rep, err
		}
		var n int
		for r.Next() {
			var id string
			if err := r.Scan(&id); err != nil {
				r.Close()
				return rep, err
			}
			n++
			if err := missing(id); err != nil {
				r.Close()
				return rep, err
			}
		}
		r.Close()
		if err := r.Err(); err != nil {
			return rep, err
		}
		if n == 0 {
			return rep, tx.Commit(ctx)
		}
	}
}

// destinations lists the destinations the window's rows were sent to, for
// a reader that reads by destination. With routing rules it builds every
// row as the relay does, so that a route's destination counts and a row
// the rules drop is recorded in the filtered table, not expected at the
// broker; without, the distinct routes of the window suffice.
func destinations(ctx context.Context, db *pgx.Conn, cfg Config) ([]string, error) {
	var dests []string
	seen := map[string]bool{}
	add := func(m *relay.Message) error {
		if cfg.Destination == nil {
			return nil
		}
		d, err := cfg.Destination(m)
		if err != nil {
			return err
		}
		if !seen[d] {
			if len(seen) >= 10000 {
				return errors.New("the window has more than 10000 destinations; verify a shorter window or one --aggregate-type at a time")
			}
			seen[d] = true
			dests = append(dests, d)
		}
		return nil
	}
	if len(cfg.Source.Rules.Routes) == 0 {
		if cfg.Destination == nil {
			return nil, nil
		}
		return dests, cfg.Source.Routes(ctx, db, cfg.Filter, add)
	}
	// Scan streams from db: the filtered ids wait for it to end.
	var filtered [][]any
	err := cfg.Source.Scan(ctx, db, cfg.Filter, func(m *relay.Message, invalid error) error {
		if errors.Is(invalid, replay.ErrFiltered) {
			filtered = append(filtered, []any{m.ID})
			return nil
		}
		return add(m)
	})
	if err != nil {
		return nil, err
	}
	if _, err := db.CopyFrom(ctx, pgx.Identifier{filteredTable}, []string{"message_id"}, pgx.CopyFromRows(filtered)); err != nil {
		return nil, fmt.Errorf("store filtered ids: %w", err)
	}
	return dests, nil
}
