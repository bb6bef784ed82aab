package cdc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// pgoutput decides what to send with the catalog as it was when each change
// was written. An insert into an outbox table that was not in the
// publication at that moment (a table swap, ALTER PUBLICATION ... DROP
// TABLE, a publication that does not publish inserts) is never sent, and
// no later repair brings it back. Coverage is therefore checked before the
// relay streams, on a short period while it streams, and whenever pgoutput
// announces a relation the relay did not expect; the event trigger that
// migrate installs prevents such gaps instead of finding them.

// TableState identifies an outbox table and its membership in the
// publication: the table's OID and the OID of its pg_publication_rel row.
// A table swap changes OID; dropping the table from the publication and
// adding it back changes Member.
type TableState struct {
	OID    uint32 `json:"oid"`
	Member uint32 `json:"member"`
}

// CoverageState is what the catalog says about the relay's publication now.
type CoverageState struct {
	Publication string
	Exists      bool
	Insert      bool // pubinsert
	ViaRoot     bool // pubviaroot
	AllTables   bool
	// Tables maps each configured table to its state; OID 0 means no table
	// of that name exists.
	Tables map[string]TableState
	// Published reports, per configured table, whether the publication
	// sends its inserts (directly, by schema or as FOR ALL TABLES).
	Published map[string]bool
	// Partitioned lists the configured tables that are partitioned.
	Partitioned []string
	// Others lists tables the publication sends that are neither configured
	// nor partitions of a configured table.
	Others []string
	// Filtered maps each configured table that the publication sends only
	// in part (PostgreSQL 15+: a row filter or a column list on its
	// pg_publication_rel row) to what leaves rows or columns out.
	Filtered map[string]string
	// Unlogged maps each configured table to its UNLOGGED partitions (or to
	// itself when it is UNLOGGED): inserts into them never reach the WAL.
	Unlogged map[string][]string
	// Foreign maps each configured table to its partitions that are
	// foreign tables: their rows are stored on another server.
	Foreign map[string][]string
	// Guarded reports whether the coverage event trigger is installed and
	// enabled.
	Guarded bool
}

// FilterVersion is the first PostgreSQL version (server_version_num) whose
// publications can filter rows and columns per table.
const FilterVersion = 150000

// CatalogReader runs read-only queries: *pgx.Conn and *pgxpool.Pool satisfy it.
type CatalogReader interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Querier runs statements and queries: *pgx.Conn and *pgxpool.Pool satisfy it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	CatalogReader
}

// ReadCoverage reads the state of publication pub for tables (schema.name).
func ReadCoverage(ctx context.Context, q CatalogReader, pub string, tables []string) (CoverageState, error) {
	s := CoverageState{Publication: pub, Tables: map[string]TableState{}, Published: map[string]bool{},
		Filtered: map[string]string{}, Unlogged: map[string][]string{}, Foreign: map[string][]string{}}
	var version int
	if err := q.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		return s, fmt.Errorf("read server_version_num: %w", err)
	}
	var pubOID uint32
	err := q.QueryRow(ctx, `SELECT oid, pubinsert, pubviaroot, puballtables FROM pg_publication WHERE pubname = $1`, pub).
		Scan(&pubOID, &s.Insert, &s.ViaRoot, &s.AllTables)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return s, fmt.Errorf("read publication %s: %w", pub, err)
	default:
		s.Exists = true
	}
	for _, t := range tables {
		schema, name, err := SplitTable(t)
		if err != nil {
			return s, &SetupError{Msg: err.Error()}
		}
		key := schema + "." + name
		var st TableState
		var published bool
		var kind string
		err = q.QueryRow(ctx, `
			SELECT c.oid, coalesce(pr.oid, 0), c.relkind::text,
			       pr.oid IS NOT NULL OR EXISTS (SELECT 1 FROM pg_publication_tables t
			                                     WHERE t.pubname = $3 AND t.schemaname = $1 AND t.tablename = $2)
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			LEFT JOIN pg_publication_rel pr ON pr.prrelid = c.oid AND pr.prpubid = $4
			WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`, schema, name, pub, pubOID).
			Scan(&st.OID, &st.Member, &kind, &published)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return s, fmt.Errorf("read table %s: %w", key, err)
		}
		s.Tables[key] = st
		s.Published[key] = published && s.Exists
		if kind == "p" {
			s.Partitioned = append(s.Partitioned, key)
		}
		if st.OID == 0 {
			continue
		}
		if st.Member != 0 && version >= FilterVersion {
			// With publish_via_partition_root the root's filter decides for
			// its partitions' rows too.
			var filter string
			err := q.QueryRow(ctx, `SELECT concat_ws(' and ',
					'row filter WHERE ' || pg_get_expr(pr.prqual, pr.prrelid),
					'column list (' || (SELECT string_agg(a.attname, ', ' ORDER BY a.attnum) FROM pg_attribute a
					                    WHERE a.attrelid = pr.prrelid AND a.attnum = ANY (pr.prattrs::int2[])) || ')')
				FROM pg_publication_rel pr WHERE pr.oid = $1`, st.Member).Scan(&filter)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return s, fmt.Errorf("read the publication filters of %s: %w", key, err)
			}
			if filter != "" {
				s.Filtered[key] = filter
			}
		}
		var unlogged []string
		err = q.QueryRow(ctx, `SELECT coalesce(array_agg(n.nspname || '.' || c.relname ORDER BY 1), '{}')
			FROM pg_partition_tree($1::oid::regclass) t JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relpersistence = 'u'`, st.OID).Scan(&unlogged)
		if err != nil {
			return s, fmt.Errorf("read the persistence of %s and its partitions: %w", key, err)
		}
		if len(unlogged) > 0 {
			s.Unlogged[key] = unlogged
		}
		var foreign []string
		err = q.QueryRow(ctx, `SELECT coalesce(array_agg(n.nspname || '.' || c.relname ORDER BY 1), '{}')
			FROM pg_partition_tree($1::oid::regclass) t JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relkind = 'f'`, st.OID).Scan(&foreign)
		if err != nil {
			return s, fmt.Errorf("read the partitions of %s that are foreign tables: %w", key, err)
		}
		if len(foreign) > 0 {
			s.Foreign[key] = foreign
		}
	}
	if s.Exists && !s.AllTables {
		rows, err := q.Query(ctx, `
			SELECT t.schemaname || '.' || t.tablename,
			       coalesce((SELECT rn.nspname || '.' || rc.relname FROM pg_class rc JOIN pg_namespace rn ON rn.oid = rc.relnamespace
			                 WHERE rc.oid = pg_partition_root(format('%I.%I', t.schemaname, t.tablename)::regclass)), '')
			FROM pg_publication_tables t WHERE t.pubname = $1 ORDER BY 1`, pub)
		if err != nil {
			return s, fmt.Errorf("read tables of publication %s: %w", pub, err)
		}
		for rows.Next() {
			var table, root string
			if err := rows.Scan(&table, &root); err != nil {
				rows.Close()
				return s, fmt.Errorf("read tables of publication %s: %w", pub, err)
			}
			if _, ok := s.Tables[table]; ok {
				continue
			}
			if _, ok := s.Tables[root]; ok {
				continue
			}
			s.Others = append(s.Others, table)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return s, fmt.Errorf("read tables of publication %s: %w", pub, err)
		}
	}
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'outboxrelay_coverage' AND evtenabled <> 'D')`).
		Scan(&s.Guarded); err != nil {
		return s, fmt.Errorf("read event triggers: %w", err)
	}
	return s, nil
}

// Problems lists, one sentence each, why inserts into the configured tables
// would not reach the relay. Tables that do not exist are not a problem
// here: nothing can be inserted into them (Setup reports them at start).
func (s CoverageState) Problems() []string {
	pub := pgx.Identifier{s.Publication}.Sanitize()
	if !s.Exists {
		return []string{fmt.Sprintf("publication %s does not exist", s.Publication)}
	}
	var p []string
	if !s.Insert {
		p = append(p, fmt.Sprintf("publication %s does not publish inserts (fix: ALTER PUBLICATION %s SET (publish = 'insert'))", s.Publication, pub))
	}
	if !s.ViaRoot && len(s.Partitioned) > 0 {
		p = append(p, fmt.Sprintf("publication %s lacks publish_via_partition_root, so the inserts into partitioned %s come under partition names (fix: ALTER PUBLICATION %s SET (publish_via_partition_root = true))",
			s.Publication, strings.Join(s.Partitioned, ", "), pub))
	}
	for _, t := range s.sortedTables() {
		if s.Tables[t].OID != 0 && !s.Published[t] {
			schema, name, _ := SplitTable(t)
			p = append(p, fmt.Sprintf("outbox table %s is not in publication %s (fix: ALTER PUBLICATION %s ADD TABLE %s)",
				t, s.Publication, pub, pgx.Identifier{schema, name}.Sanitize()))
		}
		if f := s.Filtered[t]; f != "" {
			p = append(p, FilteredProblem(t, s.Publication, f))
		}
		for _, u := range s.Unlogged[t] {
			p = append(p, UnloggedProblem(t, u))
		}
		for _, f := range s.Foreign[t] {
			p = append(p, ForeignProblem(t, f))
		}
	}
	return p
}

// FilteredProblem says that publication pub sends table only in part
// (filter: a row filter, a column list).
func FilteredProblem(table, pub, filter string) string {
	return fmt.Sprintf("outbox table %s is in publication %s with a %s, so the rows or columns it leaves out are not relayed (fix: run `outboxrelay migrate`, which publishes it whole)",
		table, pub, filter)
}

// UnloggedProblem says that rel, table itself or one of its partitions, is
// UNLOGGED.
func UnloggedProblem(table, rel string) string {
	return fmt.Sprintf("%s (fix: ALTER TABLE %s SET LOGGED)", unlogged(table, rel), sanitizeTable(rel))
}

// ForeignProblem says that rel, a partition of table, is a foreign table.
func ForeignProblem(table, rel string) string {
	return fmt.Sprintf("%s (fix: ALTER TABLE %s DETACH PARTITION %s, and keep outbox partitions on this server)",
		foreign(table, rel), sanitizeTable(table), sanitizeTable(rel))
}

func foreign(table, rel string) string {
	return "partition " + rel + " of outbox table " + table + " is a foreign table, so its rows are stored on another server and never reach the relay"
}

func unlogged(table, rel string) string {
	what := "partition " + rel + " of outbox table " + table
	if rel == table {
		what = "outbox table " + table
	}
	return what + " is UNLOGGED, so its inserts are not written to the WAL and never reach the relay"
}

func sanitizeTable(t string) string {
	schema, name, _ := SplitTable(t)
	return pgx.Identifier{schema, name}.Sanitize()
}

func (s CoverageState) sortedTables() []string {
	out := make([]string, 0, len(s.Tables))
	for t := range s.Tables {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// CoverageError says that inserts into an outbox table may not have reached
// the relay, and since when.
type CoverageError struct {
	Problems []string
	// Since is the last moment coverage was known to be complete.
	Since time.Time
}

func (e *CoverageError) Error() string {
	since := "since the relay last checked"
	if !e.Since.IsZero() {
		since = "since " + e.Since.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("coverage lost: %s; inserts committed %s may not have been relayed: fix the publication, republish the rows created since then from the outbox table, then start the relay with --accept-config-change",
		strings.Join(e.Problems, "; "), since)
}

// ConsumerError says that the slot was consumed with another publication or
// other tables, or that a table changed identity since.
type ConsumerError struct{ Msg string }

func (e *ConsumerError) Error() string { return e.Msg }

// Consumer is how a slot is consumed: through which publication, for which
// tables, and the state of each table then. The relay keeps it in its
// record of the slot (see Record).
type Consumer struct {
	Publication string
	Tables      []string
	Relations   map[string]TableState
}

// Record is what setup and the Guard read of the relay's record of its slot,
// which the relay keeps in PostgreSQL (internal/store's Checkpoint
// implements it; cdc does not write it). Implementations must be safe for
// concurrent use when given to a Guard.
type Record interface {
	// Ready fails with a *SetupError naming the fix when the record cannot
	// be kept: the relay's schema is missing or from an older version.
	Ready(ctx context.Context) error
	// Consumer returns how the slot was last consumed; ok is false when
	// nothing is recorded.
	Consumer(ctx context.Context) (c Consumer, ok bool, err error)
	// Confirmed returns the position last recorded as confirmed for the
	// slot; ok is false when none is.
	Confirmed(ctx context.Context) (lsn LSN, ok bool, err error)
}

// CompareConsumer returns a *ConsumerError when cur is not a continuation
// of rec: another publication, a recorded table left out, or a recorded
// table whose identity or publication membership changed. Adding tables is
// a continuation.
func CompareConsumer(slot string, rec, cur Consumer) error {
	fix := "if the change is intended, start the relay once with --accept-config-change"
	if rec.Publication != cur.Publication {
		return &ConsumerError{fmt.Sprintf("slot %s is consumed through publication %s, but this relay is configured with %s: a relay with another configuration (a standby?) would lose the inserts the first one relays; use the same postgres.publication and postgres.tables, or another postgres.slot; %s",
			slot, rec.Publication, cur.Publication, fix)}
	}
	var dropped, changed, left []string
	for _, t := range rec.Tables {
		if !slices.Contains(cur.Tables, t) {
			dropped = append(dropped, t)
			continue
		}
		was, now := rec.Relations[t], cur.Relations[t]
		if was != (TableState{}) && was != now && now.Member == 0 && now.OID != 0 {
			left = append(left, fmt.Sprintf("%s (table oid %d, now %d)", t, was.OID, now.OID))
			continue
		}
		if was != (TableState{}) && was != now {
			changed = append(changed, fmt.Sprintf("%s (table oid %d, publication member %d; now %d, %d)", t, was.OID, was.Member, now.OID, now.Member))
		}
	}
	if len(dropped) > 0 {
		return &ConsumerError{fmt.Sprintf("slot %s is consumed for tables %s, but this relay is not configured for %s: its inserts would be lost; use the same postgres.tables, or another postgres.slot; %s",
			slot, strings.Join(rec.Tables, ", "), strings.Join(dropped, ", "), fix)}
	}
	if len(left) > 0 {
		return &ConsumerError{fmt.Sprintf("outbox table %s is no longer in publication %s, through which slot %s consumed it: inserts since it left were not relayed; add it back (`outboxrelay migrate` or ALTER PUBLICATION %s ADD TABLE ...), republish the rows inserted meanwhile from the outbox table, then %s",
			strings.Join(left, ", "), cur.Publication, slot, pgx.Identifier{cur.Publication}.Sanitize(), fix)}
	}
	if len(changed) > 0 {
		return &ConsumerError{fmt.Sprintf("outbox table %s was replaced or dropped from publication %s and added back since slot %s was last consumed, without the coverage trigger: inserts in between may not have been relayed; republish the rows created in that time, then %s",
			strings.Join(changed, ", "), cur.Publication, slot, fix)}
	}
	return nil
}

// Guard keeps checking, while the relay streams, that the publication
// covers the outbox tables as when the relay started. Its methods are safe
// for concurrent use.
type Guard struct {
	db       Querier
	rec      Record
	pub      string
	tables   []string
	ignored  []string
	interval time.Duration
	log      *zap.Logger

	mu     sync.Mutex
	rels   map[string]TableState
	goodAt time.Time
}

// GuardConfig configures a Guard.
type GuardConfig struct {
	Publication string
	Tables      []string // schema.name
	// Ignored are tables (schema.name) whose inserts the operator chose not
	// to relay.
	Ignored []string
	// Interval between checks (default 1s).
	Interval time.Duration
}

// NewGuard returns a Guard for the state found at start, rels. It reads the
// catalog through db and the slot's consumer record through rec.
func NewGuard(db Querier, rec Record, cfg GuardConfig, rels map[string]TableState, log *zap.Logger) *Guard {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Guard{db: db, rec: rec, pub: cfg.Publication, tables: cfg.Tables, ignored: cfg.Ignored, interval: cfg.Interval,
		log: log.Named("coverage"), rels: maps(rels), goodAt: time.Now()}
}

func maps(m map[string]TableState) map[string]TableState {
	out := make(map[string]TableState, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Run checks coverage every interval until ctx is done. When coverage is
// lost it calls fail with a *CoverageError and returns. A check that cannot
// reach PostgreSQL is retried at the next tick.
func (g *Guard) Run(ctx context.Context, fail func(error)) {
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := g.Check(ctx); err != nil {
			var ce *CoverageError
			if errors.As(err, &ce) {
				fail(err)
				return
			}
			if ctx.Err() == nil {
				g.log.Warn("coverage check failed; retrying", zap.Error(err))
			}
		}
	}
}

// Check compares the catalog with the state the relay started with. A table
// whose identity changed is accepted only when the coverage trigger
// recorded the change (it added the new table to the publication in the
// transaction that created it).
func (g *Guard) Check(ctx context.Context) error {
	checkCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	started := time.Now()
	s, err := ReadCoverage(checkCtx, g.db, g.pub, g.tables)
	if err != nil {
		return err
	}
	g.mu.Lock()
	since := g.goodAt
	g.mu.Unlock()
	problems := s.Problems()
	for _, t := range s.sortedTables() {
		now := s.Tables[t]
		g.mu.Lock()
		was := g.rels[t]
		g.mu.Unlock()
		if now == was || now.OID == 0 || !s.Published[t] {
			continue // unchanged, gone (nothing can be inserted under the name), or reported above
		}
		rec, ok, err := g.rec.Consumer(checkCtx)
		if err != nil {
			return err
		}
		if ok && rec.Relations[t] == now && s.Guarded {
			g.log.Info("outbox table replaced; the coverage trigger added the new table to the publication in the same transaction",
				zap.String("table", t), zap.Uint32("old_oid", was.OID), zap.Uint32("new_oid", now.OID))
			g.mu.Lock()
			g.rels[t] = now
			g.mu.Unlock()
			continue
		}
		problems = append(problems, fmt.Sprintf("outbox table %s was replaced or dropped from the publication and added back while the relay ran (table oid %d, publication member %d; now %d, %d)",
			t, was.OID, was.Member, now.OID, now.Member))
	}
	if len(problems) > 0 {
		return &CoverageError{Problems: problems, Since: since}
	}
	g.mu.Lock()
	g.goodAt = started
	g.mu.Unlock()
	return nil
}

// Resolve maps a relation pgoutput announced to the configured table its
// inserts belong to: the table itself, or the partitioned table it is a
// partition of. It returns "" for a table the operator chose to ignore, and
// a *SetupError for any other table: its inserts would otherwise be
// skipped silently. A configured table announced with an unexpected OID
// triggers an immediate coverage check.
func (g *Guard) Resolve(ctx context.Context, rel *Relation) (string, error) {
	name := rel.QualifiedName()
	if slices.Contains(g.tables, name) {
		g.mu.Lock()
		want := g.rels[name].OID
		g.mu.Unlock()
		if rel.ID != want {
			// Replayed WAL from before a swap carries the old OID, which is
			// fine; a new OID is fine only if coverage holds.
			if err := g.Check(ctx); err != nil {
				return "", err
			}
		}
		return name, nil
	}
	var root string
	err := g.db.QueryRow(ctx, `SELECT rn.nspname || '.' || rc.relname FROM pg_class rc JOIN pg_namespace rn ON rn.oid = rc.relnamespace
		WHERE rc.oid = pg_partition_root($1::oid)`, rel.ID).Scan(&root)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("look up relation %s (oid %d): %w", name, rel.ID, err)
	}
	if slices.Contains(g.tables, root) {
		return root, nil
	}
	if slices.Contains(g.ignored, name) {
		return "", nil
	}
	return "", UnknownRelation(g.pub, rel)
}

// UnknownRelation is the error for inserts of a table the relay is not
// configured for.
func UnknownRelation(pub string, rel *Relation) error {
	if pub == "" {
		pub = "the relay's"
	}
	return &SetupError{Msg: fmt.Sprintf("publication %s sent inserts into table %s (oid %d), which is not in postgres.tables: an outbox table was renamed and its producers followed, or a table was added to the publication; add it to postgres.tables (or to postgres.ignore_tables to skip it, counted in outboxrelay_skipped_inserts_total), or remove it from the publication, then restart; nothing from this transaction on was confirmed",
		pub, rel.QualifiedName(), rel.ID)}
}
