package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// workload is one shape of outbox backlog.
type workload struct {
	Name       string `json:"name"`
	Rows       int    `json:"rows"`
	Payload    int    `json:"payload_bytes"` // bytes of the payload's jsonb text
	RowsPerTxn int    `json:"rows_per_txn"`
	// Toast stores the payload out of line, uncompressed
	// (ALTER COLUMN payload SET STORAGE EXTERNAL).
	Toast bool `json:"toast"`
	// HotAggregate gives every row the same aggregate_id, where the other
	// workloads spread rows over 1,000: against 1kb-x100 it shows what the
	// per-aggregate ordering guarantee costs when nothing can overlap.
	HotAggregate bool `json:"hot_aggregate,omitempty"`
	// Aggregates spreads the rows over this many aggregate_ids instead of
	// 1,000 (0): 64 shows a backlog with few active aggregates.
	Aggregates int  `json:"aggregates,omitempty"`
	Headline   bool `json:"headline"`
}

// aggregates returns how many aggregate_ids w's rows are spread over.
func (w workload) aggregates() int {
	switch {
	case w.HotAggregate:
		return 1
	case w.Aggregates > 0:
		return w.Aggregates
	}
	return 1000
}

func (w workload) payloadBytes() float64 { return float64(w.Rows) * float64(w.Payload) }

// maxRowsPerStatement bounds one INSERT: 4 parameters a row stay far
// below the protocol's 65,535.
const maxRowsPerStatement = 1000

// roundBytes is how much parameter data the loader sends before it waits
// for the results, so that neither side's socket buffer fills up.
const roundBytes = 4 << 20

// rowGen makes outbox rows whose payload is a jsonb object of exactly the
// workload's size in PostgreSQL's text output. The data is random hex:
// incompressible for the broker's snappy and for TOAST, the worst case for
// both.
type rowGen struct {
	size int
	rnd  *rand.Rand
	raw  []byte
	seq  int
	aggs int // aggregate_ids the rows are spread over; 1 is order-hot
}

func newRowGen(size int) *rowGen {
	return &rowGen{size: size, rnd: rand.New(rand.NewPCG(1, uint64(size))), aggs: 1000}
}

// next appends the four parameters of the next row: aggregate_type,
// aggregate_id, event_type, payload.
func (g *rowGen) next(params [][]byte) [][]byte {
	g.seq++
	seq := strconv.Itoa(g.seq)
	// jsonb prints {"seq": 1, "data": "..."}: shorter keys first.
	const open, mid, end = `{"seq": `, `, "data": "`, `"}`
	n := max(g.size-len(open)-len(seq)-len(mid)-len(end), 0)
	need := (n + 1) / 2
	if cap(g.raw) < need {
		g.raw = make([]byte, need)
	}
	raw := g.raw[:need]
	for i := 0; i < need; i += 8 {
		v := g.rnd.Uint64()
		for j := i; j < min(i+8, need); j++ {
			raw[j] = byte(v)
			v >>= 8
		}
	}
	p := make([]byte, 0, g.size)
	p = append(p, open...)
	p = append(p, seq...)
	p = append(p, mid...)
	p = hex.AppendEncode(p, raw)[:len(p)+n]
	p = append(p, end...)
	agg := "order-hot"
	if g.aggs > 1 {
		agg = "order-" + strconv.Itoa(g.seq%g.aggs)
	}
	return append(params, []byte("order"), []byte(agg), []byte("order.created"), p)
}

func insertSQL(rows int) string {
	var b strings.Builder
	b.WriteString("INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ")
	for i := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "($%d,$%d,$%d,$%d)", 4*i+1, 4*i+2, 4*i+3, 4*i+4)
	}
	return b.String()
}

// load writes w's rows in transactions of w.RowsPerTxn rows, pipelined over
// one connection with synchronous_commit off. It returns the WAL position
// after the last row: every consumer is done once it has passed it.
func load(ctx context.Context, url string, w workload) (end pglogrepl.LSN, err error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, fmt.Errorf("connect loader: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if w.Toast {
		if _, err := conn.Exec(ctx, "ALTER TABLE public.outbox ALTER COLUMN payload SET STORAGE EXTERNAL"); err != nil {
			return 0, fmt.Errorf("store payload out of line: %w", err)
		}
	}
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		return 0, err
	}
	pc := conn.PgConn()
	gen := newRowGen(w.Payload)
	gen.aggs = w.aggregates()
	prepared := map[int]bool{}
	p := pc.StartPipeline(ctx)
	defer func() {
		if cerr := p.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("loader pipeline: %w", cerr)
		}
	}()
	var (
		queued  []string // what each queued request returns, in order
		pending int      // parameter bytes queued
		params  [][]byte
	)
	flush := func() error {
		if len(queued) == 0 {
			return nil
		}
		if queued[len(queued)-1] != "sync" {
			// Make the server send what it has without ending the
			// transaction; after a Sync it does so anyway.
			p.SendFlushRequest()
		}
		if err := p.Flush(); err != nil {
			return err
		}
		for _, what := range queued {
			res, err := p.GetResults()
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			switch r := res.(type) {
			case *pgconn.ResultReader:
				if _, err := r.Close(); err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
			}
		}
		queued, pending = queued[:0], 0
		return nil
	}
	for done := 0; done < w.Rows; {
		txRows := min(w.RowsPerTxn, w.Rows-done)
		multi := txRows > maxRowsPerStatement
		if multi {
			p.SendQueryParams("BEGIN", nil, nil, nil, nil)
			queued = append(queued, "begin")
		}
		for left := txRows; left > 0; {
			n := min(left, maxRowsPerStatement)
			name := "ins" + strconv.Itoa(n)
			if !prepared[n] {
				p.SendPrepare(name, insertSQL(n), nil)
				queued = append(queued, "prepare insert")
				prepared[n] = true
			}
			params = params[:0]
			for range n {
				params = gen.next(params)
			}
			for _, v := range params {
				pending += len(v)
			}
			p.SendQueryPrepared(name, params, nil, nil)
			queued = append(queued, "insert")
			left -= n
			if pending >= roundBytes {
				if err := flush(); err != nil {
					return 0, err
				}
			}
		}
		if multi {
			p.SendQueryParams("COMMIT", nil, nil, nil, nil)
			queued = append(queued, "commit")
		}
		// Without an explicit BEGIN, everything up to a Sync is one
		// implicit transaction: one Sync per transaction.
		p.SendPipelineSync()
		queued = append(queued, "sync")
		done += txRows
		if pending >= roundBytes || len(queued) >= 512 {
			if err := flush(); err != nil {
				return 0, err
			}
		}
	}
	if err := flush(); err != nil {
		return 0, err
	}
	if err := p.Close(); err != nil {
		return 0, fmt.Errorf("loader pipeline: %w", err)
	}
	return markEnd(ctx, conn)
}

// markEnd returns the WAL insert position after the backlog and then
// commits a marker transaction with synchronous_commit on. The marker
// flushes all the WAL before it and gives every consumer a record past the
// end: pg_recvlogical's --endpos and the relay's confirmation both finish on
// it. It is a logical decoding message with a prefix the relay ignores.
func markEnd(ctx context.Context, conn *pgx.Conn) (pglogrepl.LSN, error) {
	var s string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
		return 0, fmt.Errorf("read end of WAL: %w", err)
	}
	end, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return 0, err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx) // no-op after Commit
	if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = on"); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(true, 'outboxrelay-bench.end', '')"); err != nil {
		return 0, fmt.Errorf("write end marker: %w", err)
	}
	return end, tx.Commit(ctx)
}

// createSlots creates one pgoutput slot per consumer before the load, so
// that every consumer decodes the same WAL.
func createSlots(ctx context.Context, url string, names []string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, n := range names {
		if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", n); err != nil {
			return fmt.Errorf("create slot %s: %w", n, err)
		}
	}
	return nil
}

// dropDatabase drops the workload's slots and database to free their WAL
// and disk space.
func dropDatabase(ctx context.Context, adminURL, db string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err = conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1", db)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // a walsender may still be exiting
	}
	if err != nil {
		return fmt.Errorf("drop slots of %s: %w", db, err)
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", db, err)
	}
	return nil
}
