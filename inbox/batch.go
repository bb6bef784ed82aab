package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ProcessBatch processes ms, in order, in one transaction: one commit for
// many messages, where Process commits each. Each message gets the same
// dedupe as in Process; the records of all are inserted by one statement.
// When a handler fails, that transaction rolls back as a whole and the
// batch runs again with each message in a savepoint of its own, so that a
// failing handler rolls back only its own message's writes (and its dedupe
// record), never the others'.
//
// A message whose handler failed in the batch, and every later message of
// its aggregate in ms, is processed after the batch's commit, one by one
// with Process: retried with backoff, dead-lettered after the last attempt
// (its successors then park behind it), so the aggregate's order holds.
//
// The Results are in the order of ms, each durable when ProcessBatch
// returns. An error means nothing was decided for the messages without a
// Result: the batch's transaction did not commit (or its commit's outcome
// is unknown; the redelivery finds out), or a message processed after it
// failed as Process fails. The Results returned with an error are durable;
// acknowledge only those. The messages of one aggregate must not be in two
// concurrent calls, as for Process.
func (in *Inbox) ProcessBatch(ctx context.Context, ms []Message, h Handler) ([]Result, error) {
	for _, m := range ms {
		if m.ID == "" {
			return nil, errors.New("inbox: message has no id; decode it with Decode")
		}
	}
	if len(ms) == 0 {
		return nil, nil
	}
	start := time.Now()
	outs, later, err := in.tryBatch(ctx, ms, h)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "23") || strings.HasPrefix(pe.Code, "40")) {
		// A constraint checked at commit (deferred) or a serialization
		// failure: the batch rolled back, and which message caused it is
		// unknown. Process them one by one.
		outs, later, err = make([]Outcome, len(ms)), make([]bool, len(ms)), nil
		for i := range later {
			later[i] = true
		}
	}
	if err != nil {
		return nil, err
	}
	results := make([]Result, 0, len(ms))
	for i, m := range ms {
		if later[i] {
			continue
		}
		if f := in.cfg.Observer.Stale; f != nil && !m.OccurredAt.IsZero() && time.Since(m.OccurredAt) > in.cfg.Retention {
			f(m)
		}
		in.observe(outs[i], m, start)
		results = append(results, Result{Outcome: outs[i], Message: m, Attempts: attempts(outs[i])})
	}
	// The messages left for later, in order, after the ones that committed;
	// Results go back in the order of ms.
	for i, m := range ms {
		if !later[i] {
			continue
		}
		res, err := in.Process(ctx, m, h)
		if err != nil {
			return inOrder(ms, results), err
		}
		results = append(results, res)
	}
	return inOrder(ms, results), nil
}

func attempts(o Outcome) int {
	if o == Processed {
		return 1
	}
	return 0
}

// inOrder sorts results, one per message of ms at most, into the order of
// ms.
func inOrder(ms []Message, results []Result) []Result {
	at := make(map[string][]Result, len(results))
	for _, r := range results {
		at[r.Message.ID] = append(at[r.Message.ID], r)
	}
	out := make([]Result, 0, len(results))
	for _, m := range ms {
		if rs := at[m.ID]; len(rs) > 0 {
			out = append(out, rs[0])
			at[m.ID] = rs[1:]
		}
	}
	return out
}

// tryBatch runs ms in one transaction: first without savepoints, the
// dedupe records of all in one statement; if a handler fails, that
// transaction rolls back as a whole and the batch runs again, each message
// in a savepoint (trySavepoints).
func (in *Inbox) tryBatch(ctx context.Context, ms []Message, h Handler) (outs []Outcome, later []bool, err error) {
	outs, ok, err := in.tryFast(ctx, ms, h)
	if err != nil {
		return nil, nil, err
	}
	if ok {
		return outs, make([]bool, len(ms)), nil
	}
	return in.trySavepoints(ctx, ms, h)
}

// tryFast runs ms in one transaction with one claim statement; false when
// a handler failed and the transaction rolled back.
func (in *Inbox) tryFast(ctx context.Context, ms []Message, h Handler) (outs []Outcome, ok bool, err error) {
	tx, end, err := in.begin(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("process a batch of %d messages: begin: %w", len(ms), err)
	}
	defer end()
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after Commit: a no-op

	claimed := map[string]bool{}
	if in.noDedupe {
		for _, m := range ms {
			claimed[m.ID] = true
		}
	} else if claimed, err = in.claimAll(ctx, tx, ms); err != nil {
		return nil, false, err
	}
	outs = make([]Outcome, len(ms))
	for i, m := range ms {
		if !claimed[m.ID] {
			// Processed before, or earlier in ms, or its aggregate is parked.
			if outs[i], err = in.notClaimed(ctx, tx, m, false); err != nil {
				return nil, false, err
			}
			continue
		}
		if !in.noDedupe {
			delete(claimed, m.ID) // a second copy in ms is a duplicate
		}
		if err := call(ctx, tx, m, h); err != nil {
			if ctx.Err() != nil {
				return nil, false, fmt.Errorf("process message %s: %w", m.ID, context.Cause(ctx))
			}
			return nil, false, nil
		}
		outs[i] = Processed
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, false, fmt.Errorf("process a batch of %d messages: commit: %w", len(ms), err)
	}
	return outs, true, nil
}

// claimAll inserts the dedupe records of ms, as the claim does for one, and
// returns the ids it inserted.
func (in *Inbox) claimAll(ctx context.Context, tx pgx.Tx, ms []Message) (map[string]bool, error) {
	ids, types, aggs, events := make([]string, len(ms)), make([]string, len(ms)), make([]string, len(ms)), make([]string, len(ms))
	times := make([]*time.Time, len(ms))
	for i, m := range ms {
		ids[i], types[i], aggs[i], events[i], times[i] = m.ID, m.AggregateType, m.AggregateID, m.EventType, nullTime(m.OccurredAt)
	}
	rows, err := tx.Query(ctx, in.q.claimAll, in.consumer, ids, types, aggs, events, times)
	if err != nil {
		return nil, fmt.Errorf("process a batch of %d messages: record them: %w", len(ms), err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("process a batch of %d messages: record them: %w", len(ms), err)
	}
	set := make(map[string]bool, len(claimed))
	for _, id := range claimed {
		set[id] = true
	}
	return set, nil
}

// trySavepoints runs ms in one transaction, each in a savepoint. later marks the
// messages left for Process: a failed handler's, and those after it of
// its aggregate. err is the inbox's own failure, the commit's included
// (a *pgconn.PgError when PostgreSQL refused it).
func (in *Inbox) trySavepoints(ctx context.Context, ms []Message, h Handler) (outs []Outcome, later []bool, err error) {
	outs, later = make([]Outcome, len(ms)), make([]bool, len(ms))
	tx, end, err := in.begin(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("process a batch of %d messages: begin: %w", len(ms), err)
	}
	defer end()
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after Commit: a no-op

	failed := map[[2]string]bool{}
	for i, m := range ms {
		agg := [2]string{m.AggregateType, m.AggregateID}
		if failed[agg] {
			later[i] = true
			continue
		}
		sp, err := tx.Begin(ctx) // a savepoint
		if err != nil {
			return nil, nil, fmt.Errorf("process message %s: savepoint: %w", m.ID, err)
		}
		out, herr, err := in.trySaved(ctx, sp, m, h)
		if err != nil {
			return nil, nil, err
		}
		if herr != nil {
			if err := sp.Rollback(ctx); err != nil {
				return nil, nil, fmt.Errorf("process message %s: roll back its savepoint: %w", m.ID, err)
			}
			failed[agg] = true
			later[i] = true
			continue
		}
		if err := sp.Commit(ctx); err != nil { // releases the savepoint
			return nil, nil, fmt.Errorf("process message %s: release its savepoint: %w", m.ID, err)
		}
		outs[i] = out
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, fmt.Errorf("process a batch of %d messages: commit: %w", len(ms), err)
	}
	return outs, later, nil
}

// trySaved is one message of a batch in savepoint sp: claim, then the
// handler, as try does.
func (in *Inbox) trySaved(ctx context.Context, sp pgx.Tx, m Message, h Handler) (out Outcome, herr, err error) {
	out = Processed
	if !in.noDedupe {
		tag, err := sp.Exec(ctx, in.q.claim, in.consumer, m.ID, m.AggregateType, m.AggregateID, m.EventType, nullTime(m.OccurredAt))
		if err != nil {
			return 0, nil, fmt.Errorf("process message %s: record it: %w", m.ID, err)
		}
		if tag.RowsAffected() == 0 {
			if out, err = in.notClaimed(ctx, sp, m, false); err != nil {
				return 0, nil, err
			}
		}
	}
	if out == Processed {
		if err := call(ctx, sp, m, h); err != nil {
			return 0, fmt.Errorf("handler: %w", err), nil
		}
	}
	return out, nil, nil
}

// ReceiveBatch decodes raws and processes them as ProcessBatch does, in one
// transaction: the runners' batch mode. A raw that cannot be decoded is
// stored as a dead letter at once, as Receive does. The Results are
// aligned with raws: results[i] is raws[i]'s, and its Outcome is zero when
// nothing was decided for it (the error says why). Acknowledge exactly the
// deliveries whose Outcome is not zero.
func (in *Inbox) ReceiveBatch(ctx context.Context, raws []Raw, h Handler) ([]Result, error) {
	results := make([]Result, len(raws))
	ms := make([]Message, 0, len(raws))
	at := make([]int, 0, len(raws)) // index in raws of ms[j]
	for i, raw := range raws {
		m, err := Decode(in.cfg.Format, raw)
		if err != nil {
			res, err := in.Receive(ctx, raw, h) // stores the dead letter
			if err != nil {
				return results, err
			}
			results[i] = res
			continue
		}
		ms = append(ms, m)
		at = append(at, i)
	}
	rs, err := in.ProcessBatch(ctx, ms, h)
	// A message is decided when a Result names its id: a second copy of it
	// in the batch is the same message, decided with the first.
	byID := make(map[string]Result, len(rs))
	for _, r := range rs {
		if _, seen := byID[r.Message.ID]; !seen {
			byID[r.Message.ID] = r
		}
	}
	for j, m := range ms {
		if r, ok := byID[m.ID]; ok {
			results[at[j]] = r
		}
	}
	return results, err
}
