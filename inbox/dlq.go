package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The functions in this file serve an operator outside the consumer
// service (`outboxrelay inbox dlq`): they read the dead letters of every
// consumer in a schema and record decisions on them, but never run a
// handler, which only the consumer's process has. A replay they request is
// run by the consumer's runner (ReplayRequested), through Replay.

// ErrUnknownConsumer is returned for a consumer name that has neither
// processed records nor dead letters in the schema.
var ErrUnknownConsumer = errors.New("no such consumer")

// ErrReplayPending is returned by RequestReplay and RequestDiscard for a
// dead letter whose requested replay the consumer's runner has not run yet.
var ErrReplayPending = errors.New("a replay is already requested")

// LetterFilter selects the dead letters Letters reads.
type LetterFilter struct {
	// Consumer, if set, keeps that consumer's letters; Letters fails with
	// ErrUnknownConsumer when the schema has never seen it.
	Consumer string
	// ID, if set, keeps that one letter.
	ID int64
	// IncludeReleased also keeps released letters (replayed or discarded).
	IncludeReleased bool
}

// Letters reads the dead letters of schema ("" means DefaultSchema) that f
// selects, oldest first, each with the messages parked behind it in the
// order a replay runs them.
func Letters(ctx context.Context, db Querier, schema string, f LetterFilter) ([]DeadLetter, error) {
	s := quoteSchema(schema)
	if f.Consumer != "" {
		if err := checkConsumer(ctx, db, s, f.Consumer); err != nil {
			return nil, err
		}
	}
	rows, err := db.Query(ctx, fmt.Sprintf(`SELECT id, consumer, message_id, aggregate_type, aggregate_id, error, attempts, state, created_at,
	record_key, body, headers, head_done_at, released_at, discarded_at, coalesce(discard_reason, ''), coalesce(discarded_by, ''),
	replay_requested_at, coalesce(replay_requested_by, ''), coalesce(replay_error, '')
FROM %s.dead_letters
WHERE ($1 = '' OR consumer = $1) AND ($2 = 0 OR id = $2) AND ($3 OR state <> 'released')
ORDER BY id`, s), f.Consumer, f.ID, f.IncludeReleased)
	if err != nil {
		return nil, fmt.Errorf("read the inbox dead letters in schema %s (created by Migrate): %w", s, err)
	}
	letters, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		err := r.Scan(&d.ID, &d.Consumer, &d.MessageID, &d.AggregateType, &d.AggregateID, &d.Error, &d.Attempts, &d.State, &d.CreatedAt,
			&d.Key, &d.Body, &d.Headers, &d.HeadDoneAt, &d.ReleasedAt, &d.DiscardedAt, &d.DiscardReason, &d.DiscardedBy,
			&d.ReplayRequestedAt, &d.ReplayRequestedBy, &d.ReplayError)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the inbox dead letters in schema %s: %w", s, err)
	}
	for i := range letters {
		if letters[i].State != "parked" {
			continue
		}
		if letters[i].Parked, err = parkedBehind(ctx, db, s, &letters[i]); err != nil {
			return nil, err
		}
	}
	return letters, nil
}

func parkedBehind(ctx context.Context, db Querier, s string, d *DeadLetter) ([]ParkedMessage, error) {
	rows, err := db.Query(ctx, fmt.Sprintf(`SELECT seq, message_id, record_key, body, headers, parked_at FROM %s.parked
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 ORDER BY seq`, s), d.Consumer, d.AggregateType, d.AggregateID)
	if err != nil {
		return nil, fmt.Errorf("read the messages parked behind dead letter %d: %w", d.ID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedMessage, error) {
		var p ParkedMessage
		err := r.Scan(&p.Seq, &p.MessageID, &p.Key, &p.Body, &p.Headers, &p.ParkedAt)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the messages parked behind dead letter %d: %w", d.ID, err)
	}
	return out, nil
}

func checkConsumer(ctx context.Context, db Querier, s, consumer string) error {
	rows, err := db.Query(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %[1]s.processed WHERE consumer = $1)
	OR EXISTS (SELECT 1 FROM %[1]s.dead_letters WHERE consumer = $1)`, s), consumer)
	if err != nil {
		return fmt.Errorf("look up consumer %s in schema %s (created by Migrate): %w", consumer, s, err)
	}
	known, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	if err != nil {
		return fmt.Errorf("look up consumer %s in schema %s: %w", consumer, s, err)
	}
	if !known {
		return fmt.Errorf("consumer %q has no processed records or dead letters in schema %s: %w", consumer, s, ErrUnknownConsumer)
	}
	return nil
}

// RequestReplay asks consumer's runner to replay dead letter id of schema
// ("" means DefaultSchema): it records when and by whom (by) on the
// letter, and the runner's next ReplayRequested runs Replay for it with
// the consumer's handler. Nothing runs here: the handler lives in the
// consumer's process. consumer, if set, must be the letter's. A letter
// that does not exist or was released fails with ErrNotParked, one whose
// requested replay has not run yet with ErrReplayPending.
func RequestReplay(ctx context.Context, db DB, schema string, id int64, consumer, by string) (DeadLetter, error) {
	s := quoteSchema(schema)
	tag, err := db.Exec(ctx, fmt.Sprintf(`UPDATE %s.dead_letters
SET replay_requested_at = now(), replay_requested_by = $3, replay_claimed_until = NULL, replay_error = NULL
WHERE id = $1 AND ($2 = '' OR consumer = $2) AND state <> 'released' AND replay_requested_at IS NULL`, s),
		id, consumer, by)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("request the replay of dead letter %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return DeadLetter{}, whyNot(ctx, db, s, "replay", id, consumer)
	}
	return oneLetter(ctx, db, schema, id)
}

// RequestDiscard records an operator's decision (reason, by) that dead
// letter id's message will never run, as Discard does, without running
// anything. A letter with nothing parked behind it is released at once;
// otherwise its chain waits for consumer's runner, whose ReplayRequested
// runs it as Replay does and releases the aggregate (released reports
// which). Errors as RequestReplay's; a letter whose message a replay ran
// already cannot be discarded (ErrNotParked).
func RequestDiscard(ctx context.Context, db DB, schema string, id int64, consumer, reason, by string) (d DeadLetter, released bool, err error) {
	if reason == "" {
		return d, false, fmt.Errorf("discard dead letter %d: %w", id, ErrDiscardReason)
	}
	s := quoteSchema(schema)
	tx, err := db.Begin(ctx)
	if err != nil {
		return d, false, fmt.Errorf("discard dead letter %d: %w", id, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// The UPDATE waits for every claim holding the letter FOR SHARE (see
	// release), so the parked check after it sees each message parked
	// behind it.
	var state, aggType, aggID string
	err = tx.QueryRow(ctx, fmt.Sprintf(`UPDATE %s.dead_letters
SET head_done_at = now(), discarded_at = now(), discard_reason = $3, discarded_by = $4
WHERE id = $1 AND ($2 = '' OR consumer = $2) AND state <> 'released' AND head_done_at IS NULL AND replay_requested_at IS NULL
RETURNING consumer, state, aggregate_type, aggregate_id`, s), id, consumer, reason, by).Scan(&consumer, &state, &aggType, &aggID)
	if errors.Is(err, pgx.ErrNoRows) {
		return d, false, whyNot(ctx, db, s, "discard", id, consumer)
	}
	if err != nil {
		return d, false, fmt.Errorf("discard dead letter %d: %w", id, err)
	}
	more := false
	if state == "parked" {
		err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s.parked WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3)`, s),
			consumer, aggType, aggID).Scan(&more)
		if err != nil {
			return d, false, fmt.Errorf("discard dead letter %d: %w", id, err)
		}
	}
	next, args := `state = 'released', released_at = now()`, []any{id}
	if more {
		next, args = `replay_requested_at = now(), replay_requested_by = $2, replay_claimed_until = NULL, replay_error = NULL`, []any{id, by}
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s.dead_letters SET %s WHERE id = $1`, s, next), args...); err != nil {
		return d, false, fmt.Errorf("discard dead letter %d: %w", id, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return d, false, fmt.Errorf("discard dead letter %d: %w", id, err)
	}
	d, err = oneLetter(ctx, db, schema, id)
	return d, !more, err
}

func oneLetter(ctx context.Context, db Querier, schema string, id int64) (DeadLetter, error) {
	ls, err := Letters(ctx, db, schema, LetterFilter{ID: id, IncludeReleased: true})
	if err != nil {
		return DeadLetter{}, err
	}
	if len(ls) != 1 {
		return DeadLetter{}, fmt.Errorf("dead letter %d: gone after the change: %w", id, ErrNotParked)
	}
	return ls[0], nil
}

// whyNot says why a request for letter id changed nothing, in one
// sentence with the sentinel the caller checks.
func whyNot(ctx context.Context, db DB, s, what string, id int64, consumer string) error {
	var owner, state string
	var released, requested, discarded, headDone *time.Time
	var requestedBy string
	err := db.QueryRow(ctx, fmt.Sprintf(`SELECT consumer, state, released_at, replay_requested_at, coalesce(replay_requested_by, ''), discarded_at, head_done_at
FROM %s.dead_letters WHERE id = $1`, s), id).Scan(&owner, &state, &released, &requested, &requestedBy, &discarded, &headDone)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if consumer != "" {
			if err := checkConsumer(ctx, db, s, consumer); err != nil {
				return err
			}
		}
		return fmt.Errorf("%s: there is no dead letter %d in schema %s: %w", what, id, s, ErrNotParked)
	case err != nil:
		return fmt.Errorf("%s dead letter %d: %w", what, id, err)
	case consumer != "" && owner != consumer:
		if err := checkConsumer(ctx, db, s, consumer); err != nil {
			return err
		}
		return fmt.Errorf("%s: dead letter %d belongs to consumer %s, not %s: %w", what, id, owner, consumer, ErrNotParked)
	case state == "released":
		how := "replayed"
		if discarded != nil {
			how = "discarded"
		}
		return fmt.Errorf("%s: dead letter %d of consumer %s was %s and released at %s; nothing is left to do: %w",
			what, id, owner, how, released.UTC().Format(time.RFC3339), ErrNotParked)
	case requested != nil && discarded != nil:
		return fmt.Errorf("%s: dead letter %d of consumer %s was discarded at %s; the messages parked behind it wait for the consumer's runner: %w",
			what, id, owner, discarded.UTC().Format(time.RFC3339), ErrReplayPending)
	case requested != nil:
		return fmt.Errorf("%s: the replay of dead letter %d of consumer %s was requested at %s by %s and waits for the consumer's runner: %w",
			what, id, owner, requested.UTC().Format(time.RFC3339), requestedBy, ErrReplayPending)
	case headDone != nil:
		return fmt.Errorf("%s: a replay ran the message of dead letter %d of consumer %s already; replay it to run the messages parked behind it: %w",
			what, id, owner, ErrNotParked)
	}
	return fmt.Errorf("%s dead letter %d of consumer %s: it changed meanwhile; try again", what, id, owner)
}

// replayLease bounds how long one process holds a requested replay: past
// it, another process of the consumer may take it up (a second run of the
// same chain is safe: each message is deduplicated as in Replay).
const replayLease = time.Minute

// ReplayRequested runs, one at a time and oldest first, every replay that
// RequestReplay or RequestDiscard requested for this consumer, through
// Replay with h, and returns what they ran together. A replay that fails
// (a handler failing every attempt) records its error on the letter
// (ReplayError) and ends its request, so that it is not retried without
// the operator, and ReplayRequested goes on with the next; the messages
// stay parked, as after a failed Replay, and the error returned at the
// end joins these failures. A replay stopped by the database or ctx
// returns at once and keeps its request, which the lease gives back a
// minute later. The runners call it every
// Config.ReplayInterval; call it from a ticker when you use Process or
// Receive directly. Cancelling ctx stops it as it stops Replay.
func (in *Inbox) ReplayRequested(ctx context.Context, h Handler) (ReplayResult, error) {
	var total ReplayResult
	var failures []error
	for {
		var id int64
		err := in.db.QueryRow(ctx, fmt.Sprintf(`UPDATE %[1]s.dead_letters SET replay_claimed_until = now() + make_interval(secs => $2)
WHERE id = (SELECT id FROM %[1]s.dead_letters
	WHERE consumer = $1 AND replay_requested_at IS NOT NULL AND state <> 'released'
		AND (replay_claimed_until IS NULL OR replay_claimed_until < now())
	ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id`, in.q.schema), in.consumer, replayLease.Seconds()).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return total, errors.Join(failures...)
		}
		if err != nil {
			return total, fmt.Errorf("claim a requested replay of consumer %s: %w", in.consumer, err)
		}
		res, rerr := in.Replay(ctx, id, h)
		total.Processed += res.Processed
		total.Duplicates += res.Duplicates
		var failed handlerFailed
		switch {
		case rerr == nil || errors.Is(rerr, ErrNotParked): // released, by this run or another
		case errors.As(rerr, &failed):
			_, err = in.db.Exec(ctx, fmt.Sprintf(`UPDATE %s.dead_letters
SET replay_claimed_until = NULL, replay_requested_at = NULL, replay_error = $2 WHERE id = $1`, in.q.schema), id, rerr.Error())
			if err != nil {
				return total, fmt.Errorf("record the failed replay of dead letter %d: %w", id, err)
			}
			failures = append(failures, fmt.Errorf("requested replay of dead letter %d stopped, recorded on the letter; request it again once fixed: %w", id, rerr))
			continue
		default:
			// The database or ctx failed, not the handler: the request
			// stays, and the lease lets a later call take it up again.
			return total, rerr
		}
		if _, err := in.db.Exec(ctx, fmt.Sprintf(`UPDATE %s.dead_letters SET replay_claimed_until = NULL WHERE id = $1`, in.q.schema), id); err != nil {
			return total, fmt.Errorf("end the requested replay of dead letter %d: %w", id, err)
		}
	}
}
