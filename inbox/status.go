package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Prune deletes this consumer's processed records older than
// Config.Retention, batch rows per statement (1000 if batch <= 0), until
// none is left, and returns how many it deleted. Each statement is short
// and locks only its batch, so Prune can run beside the consumer; call it
// from a ticker. Cancelling ctx stops it between batches, keeping what was
// deleted.
func (in *Inbox) Prune(ctx context.Context, batch int) (int64, error) {
	if batch <= 0 {
		batch = 1000
	}
	q := fmt.Sprintf(`DELETE FROM %[1]s.processed WHERE ctid IN (
	SELECT ctid FROM %[1]s.processed
	WHERE consumer = $1 AND processed_at < now() - make_interval(secs => $2)
	LIMIT $3)`, in.q.schema)
	var total int64
	for {
		tag, err := in.db.Exec(ctx, q, in.consumer, in.cfg.Retention.Seconds(), batch)
		if err != nil {
			return total, fmt.Errorf("prune inbox records of consumer %s: %w", in.consumer, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}

// Status is what an operator needs to know about one consumer's inbox.
type Status struct {
	Consumer string
	// LastMessageID and LastProcessedAt are the newest processed record;
	// empty and zero when there is none in the window.
	LastMessageID   string
	LastProcessedAt time.Time
	// DeadLetters are the dead letters not yet released, oldest first.
	DeadLetters []DeadLetter
	// Parked are the aggregates held behind a dead letter.
	Parked []ParkedAggregate
}

// DeadLetter is one stored dead letter. Status fills the fields up to
// CreatedAt; Letters fills them all.
type DeadLetter struct {
	ID            int64  `json:"id"`
	Consumer      string `json:"consumer"`
	MessageID     string `json:"message_id"`
	AggregateType string `json:"aggregate_type"`
	AggregateID   string `json:"aggregate_id"`
	Error         string `json:"error"`
	Attempts      int    `json:"attempts"`
	// State is parked (its aggregate waits), dead (no aggregate to hold)
	// or released.
	State     string    `json:"state"`
	CreatedAt time.Time `json:"created_at"`

	// Key, Body and Headers are the message as received (Headers as
	// stored: a JSON object, its values base64 where jsonb could not hold
	// them).
	Key     []byte          `json:"key,omitempty"`
	Body    []byte          `json:"body"`
	Headers json.RawMessage `json:"headers"`
	// HeadDoneAt is when a replay ran the message or a discard gave it up;
	// ReleasedAt when its aggregate was released.
	HeadDoneAt *time.Time `json:"head_done_at,omitempty"`
	ReleasedAt *time.Time `json:"released_at,omitempty"`
	// DiscardedAt, DiscardReason and DiscardedBy record a discard.
	DiscardedAt   *time.Time `json:"discarded_at,omitempty"`
	DiscardReason string     `json:"discard_reason,omitempty"`
	DiscardedBy   string     `json:"discarded_by,omitempty"`
	// ReplayRequestedAt and ReplayRequestedBy record a RequestReplay (or
	// the replay a RequestDiscard leaves to the runner); the request is
	// pending while the letter is not released. ReplayError is why the
	// last requested replay failed.
	ReplayRequestedAt *time.Time `json:"replay_requested_at,omitempty"`
	ReplayRequestedBy string     `json:"replay_requested_by,omitempty"`
	ReplayError       string     `json:"replay_error,omitempty"`
	// Parked are the messages parked behind it, in the order a replay
	// runs them.
	Parked []ParkedMessage `json:"parked,omitempty"`
}

// ParkedMessage is a message parked behind a dead letter.
type ParkedMessage struct {
	Seq       int64           `json:"seq"`
	MessageID string          `json:"message_id"`
	Key       []byte          `json:"key,omitempty"`
	Body      []byte          `json:"body"`
	Headers   json.RawMessage `json:"headers"`
	ParkedAt  time.Time       `json:"parked_at"`
}

// ParkedAggregate is an aggregate held behind dead letter DeadLetterID,
// with Waiting messages parked behind it.
type ParkedAggregate struct {
	AggregateType string
	AggregateID   string
	DeadLetterID  int64
	Waiting       int
}

// Status reads the consumer's status. It reads only indexed rows: the
// newest processed record, the unreleased dead letters and the parked
// messages.
func (in *Inbox) Status(ctx context.Context) (Status, error) {
	st := Status{Consumer: in.consumer}
	err := in.db.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(max(message_id), ''), coalesce(max(processed_at), 'epoch')
FROM (SELECT message_id, processed_at FROM %s.processed WHERE consumer = $1 ORDER BY processed_at DESC LIMIT 1) AS newest`, in.q.schema),
		in.consumer).Scan(&st.LastMessageID, &st.LastProcessedAt)
	if err != nil {
		return st, fmt.Errorf("inbox status of consumer %s: %w", in.consumer, err)
	}
	if st.LastMessageID == "" {
		st.LastProcessedAt = time.Time{}
	}
	rows, err := in.db.Query(ctx, fmt.Sprintf(`SELECT d.id, d.message_id, d.aggregate_type, d.aggregate_id, d.error, d.attempts, d.state, d.created_at,
	(SELECT count(*) FROM %[1]s.parked p WHERE p.consumer = d.consumer AND p.aggregate_type = d.aggregate_type AND p.aggregate_id = d.aggregate_id)
FROM %[1]s.dead_letters d WHERE d.consumer = $1 AND d.state <> 'released' ORDER BY d.id`, in.q.schema), in.consumer)
	if err != nil {
		return st, fmt.Errorf("inbox status of consumer %s: %w", in.consumer, err)
	}
	defer rows.Close()
	for rows.Next() {
		d := DeadLetter{Consumer: in.consumer}
		var waiting int
		if err := rows.Scan(&d.ID, &d.MessageID, &d.AggregateType, &d.AggregateID, &d.Error, &d.Attempts, &d.State, &d.CreatedAt, &waiting); err != nil {
			return st, fmt.Errorf("inbox status of consumer %s: %w", in.consumer, err)
		}
		st.DeadLetters = append(st.DeadLetters, d)
		if d.State == "parked" {
			st.Parked = append(st.Parked, ParkedAggregate{AggregateType: d.AggregateType, AggregateID: d.AggregateID, DeadLetterID: d.ID, Waiting: waiting})
		}
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("inbox status of consumer %s: %w", in.consumer, err)
	}
	return st, nil
}

// ConsumerStatus is one row of the status view: one consumer of the
// inbox tables in a schema.
type ConsumerStatus struct {
	Consumer string
	// LastMessageID and LastProcessedAt are the newest processed record;
	// empty and zero when none is in the window.
	LastMessageID   string
	LastProcessedAt time.Time
	// DeadLetters counts the dead letters not released, ParkedAggregates
	// the aggregates held behind one, ParkedMessages the messages waiting
	// behind those.
	DeadLetters      int64
	ParkedAggregates int64
	ParkedMessages   int64
}

// Querier is what StatusAll needs: a *pgx.Conn, a *pgxpool.Pool or a
// pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// StatusAll reads the status view of schema ("" means DefaultSchema):
// every consumer with processed records in the window or dead letters not
// released, by name.
func StatusAll(ctx context.Context, db Querier, schema string) ([]ConsumerStatus, error) {
	rows, err := db.Query(ctx, fmt.Sprintf(`SELECT consumer, coalesce(last_message_id, ''), last_processed_at,
	dead_letters, parked_aggregates, parked_messages FROM %s.status ORDER BY consumer`, quoteSchema(schema)))
	if err != nil {
		return nil, fmt.Errorf("read the inbox status view in schema %s (created by Migrate): %w", quoteSchema(schema), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ConsumerStatus, error) {
		var c ConsumerStatus
		var at *time.Time
		err := r.Scan(&c.Consumer, &c.LastMessageID, &at, &c.DeadLetters, &c.ParkedAggregates, &c.ParkedMessages)
		if at != nil {
			c.LastProcessedAt = *at
		}
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the inbox status view in schema %s: %w", quoteSchema(schema), err)
	}
	return out, nil
}
