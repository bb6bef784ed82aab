package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotParked is returned by Replay for a dead letter that does not exist
// for this consumer or was released already.
var ErrNotParked = errors.New("no such dead letter waiting for replay")

// ReplayResult reports one Replay.
type ReplayResult struct {
	Processed  int // messages whose handler ran and committed
	Duplicates int // messages found processed already
}

// Replay runs dead letter id and then, in arrival order, every message
// parked behind it, each through h with the same dedupe as Process, and
// releases the aggregate: messages that arrive afterwards are processed as
// usual. A message that arrives during the replay is parked and replayed
// too, or processed after the release, never ahead of the chain.
//
// A handler that fails every attempt stops the replay with an error; what
// ran before it stays done, the failing message and the rest stay parked,
// and a later Replay of the same id goes on from there. Replay of a dead
// letter without an aggregate (state dead, such as an undecodable message)
// runs only that message. Run one Replay per dead letter at a time.
func (in *Inbox) Replay(ctx context.Context, id int64, h Handler) (ReplayResult, error) {
	var res ReplayResult
	var state string
	var headDone *time.Time
	var head Message
	var raw Raw
	var hdr []byte
	err := in.db.QueryRow(ctx, fmt.Sprintf(`SELECT state, head_done_at, aggregate_type, aggregate_id, record_key, body, headers
FROM %s.dead_letters WHERE id = $1 AND consumer = $2`, in.q.schema), id, in.consumer).
		Scan(&state, &headDone, &head.AggregateType, &head.AggregateID, &raw.Key, &raw.Value, &hdr)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && state == "released" {
		return res, fmt.Errorf("replay dead letter %d of consumer %s: %w", id, in.consumer, ErrNotParked)
	}
	if err != nil {
		return res, fmt.Errorf("replay dead letter %d: %w", id, err)
	}
	if err := json.Unmarshal(hdr, &raw.Headers); err != nil {
		return res, fmt.Errorf("replay dead letter %d: headers: %w", id, err)
	}
	markHead := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s.dead_letters SET head_done_at = now() WHERE id = $1`, in.q.schema), id)
		return err
	}
	if headDone == nil {
		m, err := in.decodeStored(raw)
		if err != nil {
			return res, fmt.Errorf("replay dead letter %d: %w", id, err)
		}
		if err := in.replayOne(ctx, m, h, markHead, &res); err != nil {
			return res, fmt.Errorf("replay dead letter %d: %w", id, err)
		}
	}
	if state == "dead" {
		return res, in.release(ctx, id, head, true)
	}
	for {
		n, err := in.replayParked(ctx, head, h, &res)
		if err != nil {
			return res, fmt.Errorf("replay dead letter %d: %w", id, err)
		}
		if n > 0 {
			continue
		}
		if err := in.release(ctx, id, head, false); err == nil || !errors.Is(err, errMoreParked) {
			return res, err
		}
	}
}

var errMoreParked = errors.New("more messages parked")

// release marks the dead letter released, unless messages were parked
// behind it meanwhile. The UPDATE waits for every claim that holds the row
// FOR SHARE, so once it has the row, each such message is in the parked
// table, and the check below sees it.
func (in *Inbox) release(ctx context.Context, id int64, head Message, dead bool) error {
	tx, end, err := in.begin(ctx)
	if err != nil {
		return fmt.Errorf("release dead letter %d: %w", id, err)
	}
	defer end()
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s.dead_letters SET state = 'released', released_at = now() WHERE id = $1`, in.q.schema), id); err != nil {
		return fmt.Errorf("release dead letter %d: %w", id, err)
	}
	if !dead {
		var more bool
		err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s.parked WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3)`, in.q.schema),
			in.consumer, head.AggregateType, head.AggregateID).Scan(&more)
		if err != nil {
			return fmt.Errorf("release dead letter %d: %w", id, err)
		}
		if more {
			return errMoreParked
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("release dead letter %d: %w", id, err)
	}
	return nil
}

// replayParked runs the first parked message of head's aggregate and
// removes it from the parked table in the same transaction. It returns 0
// when none is left.
func (in *Inbox) replayParked(ctx context.Context, head Message, h Handler, res *ReplayResult) (int, error) {
	var seq int64
	var raw Raw
	var hdr []byte
	err := in.db.QueryRow(ctx, fmt.Sprintf(`SELECT seq, record_key, body, headers FROM %s.parked
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 ORDER BY seq LIMIT 1`, in.q.schema),
		in.consumer, head.AggregateType, head.AggregateID).Scan(&seq, &raw.Key, &raw.Value, &hdr)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read parked messages: %w", err)
	}
	if err := json.Unmarshal(hdr, &raw.Headers); err != nil {
		return 0, fmt.Errorf("parked message %d: headers: %w", seq, err)
	}
	m, err := in.decodeStored(raw)
	if err != nil {
		return 0, fmt.Errorf("parked message %d: %w", seq, err)
	}
	unpark := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, fmt.Sprintf(`DELETE FROM %s.parked WHERE seq = $1`, in.q.schema), seq)
		return err
	}
	return 1, in.replayOne(ctx, m, h, unpark, res)
}

// replayOne runs m with retries, then in the same transaction.
func (in *Inbox) replayOne(ctx context.Context, m Message, h Handler, then func(pgx.Tx) error, res *ReplayResult) error {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		out, herr, err := in.try(ctx, m, h, true, then)
		if err != nil {
			return err
		}
		if herr == nil {
			in.observe(out, m, start)
			if out == Processed {
				res.Processed++
			} else {
				res.Duplicates++
			}
			return nil
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		var p permanent
		if attempt >= in.cfg.MaxAttempts || errors.As(herr, &p) {
			return handlerFailed{fmt.Errorf("message %s failed %d attempts, it stays parked: %w", m.ID, attempt, herr)}
		}
		if f := in.cfg.Observer.Retried; f != nil {
			f(m, attempt, herr)
		}
		if err := sleep(ctx, in.backoff(attempt)); err != nil {
			return err
		}
	}
}

// handlerFailed is a replay stopped by a handler that failed every
// attempt, as opposed to the database or a cancelled ctx.
type handlerFailed struct{ error }

func (h handlerFailed) Unwrap() error { return h.error }

// ErrDiscardReason is returned by Discard without a reason.
var ErrDiscardReason = errors.New("a discard needs a reason: it is the operator's recorded decision")

// Discard gives up on dead letter id: an operator's decision, recorded on
// the dead letter with reason and the time (discarded_at,
// discard_reason), that its message will not run. A redelivery of the
// message stays a duplicate. The messages parked behind it then run as
// Replay runs them, in arrival order through h, and the aggregate is
// released; the result counts those. A dead letter whose message a
// Replay already ran, or that was released, cannot be discarded
// (ErrNotParked).
func (in *Inbox) Discard(ctx context.Context, id int64, reason string, h Handler) (ReplayResult, error) {
	if reason == "" {
		return ReplayResult{}, fmt.Errorf("discard dead letter %d: %w", id, ErrDiscardReason)
	}
	tag, err := in.db.Exec(ctx, fmt.Sprintf(`UPDATE %s.dead_letters SET head_done_at = now(), discarded_at = now(), discard_reason = $3
WHERE id = $1 AND consumer = $2 AND state <> 'released' AND head_done_at IS NULL`, in.q.schema), id, in.consumer, reason)
	if err != nil {
		return ReplayResult{}, fmt.Errorf("discard dead letter %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return ReplayResult{}, fmt.Errorf("discard dead letter %d of consumer %s: %w", id, in.consumer, ErrNotParked)
	}
	res, err := in.Replay(ctx, id, h)
	if err != nil {
		return res, fmt.Errorf("discard dead letter %d: recorded; its chain: %w", id, err)
	}
	return res, nil
}
