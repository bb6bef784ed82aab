package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
)

// DeadLetters stores the messages of one slot that the broker will never
// take, in outboxrelay.dead_letters, and lists, replays and purges them. A
// dead letter holds everything needed to publish the message again: the
// routing fields, the row headers and the exact body.
//
// With relay.dead_letter_order: park, a dead letter heads its aggregate
// (parks = true) and the aggregate's later messages wait behind it in
// outboxrelay.parked (see parked.go) until Replay has republished the head
// and the whole chain, or Purge deleted them.
//
// A DeadLetters whose Slot is empty reads and purges the letters of every
// slot (List, Plan, Purge); Add, Park and Replay of a relay always name
// their slot. Its methods are safe for concurrent use if DB is.
type DeadLetters struct {
	DB   TxDB
	Slot string
}

// DeadLetter is one stored dead letter.
type DeadLetter struct {
	ID int64 `json:"id"`
	// Slot is the replication slot whose relay dead-lettered the message.
	Slot string `json:"slot"`
	// Sink is the name of the sink it was bound for, under the sinks
	// section; "" for the one sink of a sink section.
	Sink          string          `json:"sink,omitempty"`
	MessageID     string          `json:"message_id"`
	Destination   string          `json:"destination"`
	AggregateType string          `json:"aggregate_type"`
	AggregateID   string          `json:"aggregate_id"`
	EventType     string          `json:"event_type"`
	Table         string          `json:"source_table"`
	Traceparent   string          `json:"traceparent"`
	Headers       json.RawMessage `json:"headers"`
	Envelope      string          `json:"envelope"`
	Error         string          `json:"error"`
	Attempts      int             `json:"attempts"`
	FirstFailedAt time.Time       `json:"first_failed_at"`
	LastFailedAt  time.Time       `json:"last_failed_at"`
	CreatedAt     time.Time       `json:"created_at"`
	ReplayedAt    *time.Time      `json:"replayed_at"`
	// Body is the exact message body; Envelope is its text form.
	Body        []byte          `json:"-"`
	ContentType string          `json:"content_type,omitempty"`
	Attributes  json.RawMessage `json:"attributes,omitempty"`
	// Parks says the letter heads its parked aggregate: Parked are the
	// messages waiting behind it, in the order Replay publishes them. A
	// head stays listed, replayed or not, until its whole chain is.
	Parks  bool            `json:"parks"`
	Parked []ParkedMessage `json:"parked,omitempty"`
	// Invalid says the relay refused to build the message (Error says
	// why): no broker ever refused it. Replay refuses such a letter unless
	// forced (ReplayOptions.ForcedBy).
	Invalid bool `json:"invalid"`
	// ReplayForcedBy is who published the letter by force although the
	// replay's check refused it (ReplayOptions.ForcedBy), ReplayedAt when.
	ReplayForcedBy string `json:"replay_forced_by,omitempty"`
	// rec is what the outbox router's options made of the row.
	rec record
}

// Add stores m. It returns once the row is committed, so the relay may
// confirm past the message. It has the signature of relay.DeadLetterFunc.
func (s *DeadLetters) Add(ctx context.Context, m *relay.Message) error {
	return s.add(ctx, m, false)
}

// AddHead stores m as a dead letter that parks its aggregate
// (relay.Parking).
func (s *DeadLetters) AddHead(ctx context.Context, m *relay.Message) error {
	return s.add(ctx, m, true)
}

func (s *DeadLetters) add(ctx context.Context, m *relay.Message, parks bool) error {
	hj, attrs, err := encodeHeaders(m)
	if err != nil {
		return err
	}
	errText := "unknown error"
	if m.LastError != nil {
		errText = m.LastError.Error()
	}
	first, last := m.FirstFailure, m.LastFailure
	if first.IsZero() {
		first = time.Now()
	}
	if last.IsZero() {
		last = first
	}
	rec := recordOf(m)
	invalid := errors.Is(m.LastError, relay.ErrInvalid)
	_, err = s.DB.Exec(ctx, `INSERT INTO outboxrelay.dead_letters
		(slot, message_id, destination, aggregate_type, aggregate_id, event_type, source_table, traceparent, headers, envelope, error, attempts, first_failed_at, last_failed_at,
		 body, content_type, attributes, parks, commit_lsn, lsn, record_key, record_timestamp, tombstone, sink, invalid)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19::pg_lsn, $20::pg_lsn, $21, $22, $23, $24, $25)`,
		s.Slot, clean(m.ID), clean(m.Destination), clean(m.AggregateType), clean(m.AggregateID), clean(m.EventType), m.Table,
		m.Traceparent, string(hj), clean(string(m.Envelope)), clean(errText), m.Attempts, first, last,
		bodyOf(m), m.ContentType, nullJSON(attrs), parks, m.CommitLSN.String(), m.LSN.String(), rec.Key, rec.Timestamp, rec.Tombstone, m.Sink, invalid)
	if err != nil {
		return fmt.Errorf("store dead letter %s: %w", m.ID, err)
	}
	return nil
}

// encodeHeaders encodes m's row headers and its attributes (nil when it
// has none) as the JSON objects the headers and attributes columns hold.
func encodeHeaders(m *relay.Message) (headers, attrs []byte, err error) {
	h := map[string]string{}
	for _, kv := range m.Headers {
		h[kv.Key] = kv.Value
	}
	if headers, err = json.Marshal(h); err != nil {
		return nil, nil, fmt.Errorf("encode headers: %w", err)
	}
	if len(m.Attributes) > 0 {
		a := map[string]string{}
		for _, kv := range m.Attributes {
			a[kv.Key] = kv.Value
		}
		if attrs, err = json.Marshal(a); err != nil {
			return nil, nil, fmt.Errorf("encode attributes: %w", err)
		}
	}
	return headers, attrs, nil
}

// decodeHeaders is the inverse of encodeHeaders: the row headers and the
// attributes (nil when the column is empty) of a stored message.
func decodeHeaders(headers, attrs json.RawMessage) (hs, as []envelope.Header, err error) {
	if hs, err = envelope.ParseHeaders(headers); err != nil {
		return nil, nil, err
	}
	if len(attrs) > 0 {
		if as, err = envelope.ParseHeaders(attrs); err != nil {
			return nil, nil, fmt.Errorf("attributes: %w", err)
		}
	}
	return hs, as, nil
}

func nullJSON(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// clean makes s storable as PostgreSQL text, which cannot hold NUL bytes or
// invalid UTF-8.
func clean(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// DeadLetterFilter selects dead letters.
type DeadLetterFilter struct {
	ID              int64 // 0: any
	IncludeReplayed bool
}

// List returns the slot's dead letters, oldest first: those not replayed
// yet, and the heads whose chain is not (or, with IncludeReplayed, all).
// Each head comes with its chain.
func (s *DeadLetters) List(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error) {
	q := `SELECT id, slot, message_id, destination, aggregate_type, aggregate_id, event_type, source_table, traceparent, headers,
		envelope, error, attempts, first_failed_at, last_failed_at, created_at, replayed_at,
		body, coalesce(content_type, ''), attributes, coalesce(parks, false), record_key, record_timestamp, tombstone, sink,
		invalid, coalesce(replay_forced_by, '')
		FROM outboxrelay.dead_letters WHERE ($1 = '' OR slot = $1) AND ($2 = 0 OR id = $2) AND ($3 OR replayed_at IS NULL OR parks) ORDER BY id`
	rows, err := s.DB.Query(ctx, q, s.Slot, f.ID, f.IncludeReplayed)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	letters, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadLetter, error) {
		var l DeadLetter
		var headers, attrs []byte
		err := row.Scan(&l.ID, &l.Slot, &l.MessageID, &l.Destination, &l.AggregateType, &l.AggregateID, &l.EventType, &l.Table,
			&l.Traceparent, &headers, &l.Envelope, &l.Error, &l.Attempts, &l.FirstFailedAt, &l.LastFailedAt, &l.CreatedAt, &l.ReplayedAt,
			&l.Body, &l.ContentType, &attrs, &l.Parks, &l.rec.Key, &l.rec.Timestamp, &l.rec.Tombstone, &l.Sink,
			&l.Invalid, &l.ReplayForcedBy)
		l.Headers = headers
		l.Attributes = attrs
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	for i := range letters {
		if letters[i].Parks {
			if letters[i].Parked, err = s.chain(ctx, letters[i].ID); err != nil {
				return nil, err
			}
		}
	}
	return letters, nil
}

// Message rebuilds the relay message of a dead letter for publishing again.
func (l *DeadLetter) Message() (*relay.Message, error) {
	headers, attrs, err := decodeHeaders(l.Headers, l.Attributes)
	if err != nil {
		return nil, fmt.Errorf("dead letter %d: %w", l.ID, err)
	}
	body := l.Body
	if body == nil { // stored before the body column existed
		body = []byte(l.Envelope)
	}
	m := &relay.Message{
		ID: l.MessageID, AggregateType: l.AggregateType, AggregateID: l.AggregateID, EventType: l.EventType,
		Table: l.Table, Traceparent: l.Traceparent, Headers: headers, Envelope: body,
		ContentType: l.ContentType, Attributes: attrs, CommitTime: l.CreatedAt, Sink: l.Sink,
	}
	l.rec.apply(m)
	return m, nil
}

// Replayed counts what Replay published.
type Replayed struct {
	// Letters are the dead letters published again, Parked the messages
	// published from behind them.
	Letters, Parked int
	// Forced are the ids of the letters published although the check
	// refused them (ReplayOptions.ForcedBy).
	Forced []int64
}

// ReplayOptions say how Replay checks the letters it publishes.
type ReplayOptions struct {
	// Columns name the routing fields in a refusal
	// (relay.Columns.Missing); zero means relay.DefaultColumns.
	Columns relay.Columns
	// ForcedBy, when not empty, publishes the letters the check refuses
	// too: the operator's decision, recorded in each such letter's
	// replay_forced_by (who, and through what) next to its replayed_at.
	ForcedBy string
}

// RefusedError is Replay's refusal of a dead letter that is not a valid
// outbox message: the relay's own check refuses it, so it was not
// published.
type RefusedError struct {
	ID        int64
	MessageID string
	Reason    error
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("dead letter %d (message %s) was not published: it is not a valid outbox message (%s); write a corrected row to the outbox and purge this letter, or send it as it is with dlq replay --id %d --force (API: ?force=true), which records who forced it",
		e.ID, e.MessageID, strings.ReplaceAll(e.Reason.Error(), "\n", "; "), e.ID)
}

// refusal is why Replay refuses l unless forced: a routing field it lacks,
// by the relay's own check (relay.Columns.Missing), or else, for a letter
// the relay refused to build, the reason it recorded then (its body is the
// one the relay refused). nil: l may be published.
func (l *DeadLetter) refusal(cols relay.Columns) error {
	em := envelope.Message{MessageID: l.MessageID, AggregateType: l.AggregateType, AggregateID: l.AggregateID, EventType: l.EventType}
	if err := cols.Missing(&em); err != nil {
		return err
	}
	if l.Invalid {
		return errors.New(strings.TrimPrefix(l.Error, relay.ErrInvalid.Error()+": "))
	}
	return nil
}

// Replay publishes each selected dead letter again through sink, one at a
// time (each message naming its sink in Message.Sink, for a sink that
// dispatches among several), and marks it replayed once the broker has acknowledged it. A head
// is followed by its chain, in order, each message published only once the
// one before it was acknowledged and deleted from outboxrelay.parked once it
// was; then the aggregate is released (see release). Replay stops at the
// first failure: what was published stays marked, and replaying the same
// letter again goes on from the first message not acknowledged.
//
// A letter that is not a valid outbox message, as the relay checks one
// (refusal), is not published unless opts.ForcedBy is set: Replay goes on
// with the other letters and returns a RefusedError for each one it
// refused.
func (s *DeadLetters) Replay(ctx context.Context, sink relay.Sink, f DeadLetterFilter, opts ReplayOptions) (Replayed, error) {
	var n Replayed
	letters, err := s.List(ctx, f)
	if err != nil {
		return n, err
	}
	if f.ID != 0 && len(letters) == 0 {
		return n, s.notFound(f.ID)
	}
	if opts.Columns == (relay.Columns{}) {
		opts.Columns = relay.DefaultColumns()
	}
	var refused []error
	for i := range letters {
		l := &letters[i]
		if l.ReplayedAt == nil {
			var forcedBy *string // NULL unless the check refused l
			if why := l.refusal(opts.Columns); why != nil {
				if opts.ForcedBy == "" {
					refused = append(refused, &RefusedError{ID: l.ID, MessageID: l.MessageID, Reason: why})
					continue // its chain, if any, stays parked behind it
				}
				forcedBy = &opts.ForcedBy
			}
			m, err := l.Message()
			if err != nil {
				return n, err
			}
			if err := publish(ctx, sink, m); err != nil {
				return n, fmt.Errorf("replay dead letter %d (message %s): %w", l.ID, l.MessageID, err)
			}
			if _, err := s.DB.Exec(ctx, "UPDATE outboxrelay.dead_letters SET replayed_at = now(), replay_forced_by = $2 WHERE id = $1", l.ID, forcedBy); err != nil {
				return n, fmt.Errorf("mark dead letter %d replayed (it was published): %w", l.ID, err)
			}
			n.Letters++
			if forcedBy != nil {
				n.Forced = append(n.Forced, l.ID)
			}
		}
		if l.Parks {
			parked, err := s.replayChain(ctx, sink, l.ID, l.Sink)
			n.Parked += parked
			if err != nil {
				return n, err
			}
		}
	}
	return n, errors.Join(refused...)
}

func (s *DeadLetters) notFound(id int64) error {
	if s.Slot == "" {
		return fmt.Errorf("no pending dead letter with id %d; outboxrelay dlq list shows the pending ones", id)
	}
	return fmt.Errorf("no pending dead letter with id %d for slot %s; outboxrelay dlq list shows the pending ones", id, s.Slot)
}

// ReplayStep is one message Replay would publish.
type ReplayStep struct {
	// Head is the dead letter the message is, or waits behind.
	Head int64 `json:"head"`
	// Position is 0 for the dead letter itself, then 1, 2, ... along its
	// parked chain.
	Position      int    `json:"position"`
	Slot          string `json:"slot"`
	MessageID     string `json:"message_id"`
	AggregateType string `json:"aggregate_type"`
	AggregateID   string `json:"aggregate_id"`
	EventType     string `json:"event_type"`
	// Destination is where the message went when it failed (dead letters
	// only; a parked message is routed when it is published).
	Destination string `json:"destination,omitempty"`
	// Refused is why Replay refuses this dead letter unless forced (it is
	// not a valid outbox message); "" when it would publish it.
	Refused string `json:"refused,omitempty"`
}

// Plan returns what Replay with f would publish now, in the order it would
// publish it, and changes nothing; cols are ReplayOptions.Columns. A relay
// that is running may park more behind a head before Replay releases it;
// Replay publishes those too.
func (s *DeadLetters) Plan(ctx context.Context, f DeadLetterFilter, cols relay.Columns) ([]ReplayStep, error) {
	if cols == (relay.Columns{}) {
		cols = relay.DefaultColumns()
	}
	letters, err := s.List(ctx, f)
	if err != nil {
		return nil, err
	}
	if f.ID != 0 && len(letters) == 0 {
		return nil, s.notFound(f.ID)
	}
	var steps []ReplayStep
	for _, l := range letters {
		if l.ReplayedAt == nil {
			step := ReplayStep{Head: l.ID, Slot: l.Slot, MessageID: l.MessageID, AggregateType: l.AggregateType,
				AggregateID: l.AggregateID, EventType: l.EventType, Destination: l.Destination}
			if why := l.refusal(cols); why != nil {
				step.Refused = strings.ReplaceAll(why.Error(), "\n", "; ")
			}
			steps = append(steps, step)
		}
		if !l.Parks {
			continue
		}
		for i, p := range l.Parked {
			steps = append(steps, ReplayStep{Head: l.ID, Position: i + 1, Slot: l.Slot, MessageID: p.MessageID,
				AggregateType: p.AggregateType, AggregateID: p.AggregateID, EventType: p.EventType})
		}
	}
	return steps, nil
}

// publish publishes m and waits for the broker's answer.
func publish(ctx context.Context, sink relay.Sink, m *relay.Message) error {
	result := make(chan error, 1)
	sink.Publish(ctx, m, func(_ *relay.Message, err error) { result <- err })
	select {
	case err := <-result:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Purged counts what Purge deleted.
type Purged struct {
	Letters, Parked int64
}

// Purge deletes the slot's (with an empty Slot every slot's) dead letters
// created before t. A head goes with
// the messages parked behind it, and its aggregate is released: a relay
// that is running publishes the aggregate's next message, and nothing of the
// purged chain. Purging is giving up on those messages; to deliver the
// chain, replay the head instead.
func (s *DeadLetters) Purge(ctx context.Context, before time.Time) (Purged, error) {
	var n Purged
	if before.IsZero() {
		return n, errors.New("purge needs a time")
	}
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		// Lock the heads first, in a statement of their own: a relay that
		// parks a message holds its head's lock until the message is
		// committed, and the next statement's snapshot then sees it.
		if _, err := tx.Exec(ctx, `SELECT id FROM outboxrelay.dead_letters WHERE ($1 = '' OR slot = $1) AND created_at < $2 AND parks FOR UPDATE`, s.Slot, before); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM outboxrelay.parked p USING outboxrelay.dead_letters d
			WHERE p.head_id = d.id AND ($1 = '' OR d.slot = $1) AND d.created_at < $2`, s.Slot, before)
		if err != nil {
			return err
		}
		n.Parked = tag.RowsAffected()
		tag, err = tx.Exec(ctx, "DELETE FROM outboxrelay.dead_letters WHERE ($1 = '' OR slot = $1) AND created_at < $2", s.Slot, before)
		if err != nil {
			return err
		}
		n.Letters = tag.RowsAffected()
		return nil
	})
	if err != nil {
		return Purged{}, fmt.Errorf("purge dead letters: %w", err)
	}
	return n, nil
}

// PurgeID deletes the slot's dead letter id, replayed or not, and the
// messages parked behind it, releasing its aggregate as Purge does. A
// letter of another slot is not found: Purged is zero and the error says so.
func (s *DeadLetters) PurgeID(ctx context.Context, id int64) (Purged, error) {
	var n Purged
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		// The head's lock first, as in Purge.
		var found bool
		if err := tx.QueryRow(ctx, `SELECT true FROM outboxrelay.dead_letters WHERE ($1 = '' OR slot = $1) AND id = $2 FOR UPDATE`, s.Slot, id).Scan(&found); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNoDeadLetter
			}
			return err
		}
		tag, err := tx.Exec(ctx, "DELETE FROM outboxrelay.parked WHERE head_id = $1", id)
		if err != nil {
			return err
		}
		n.Parked = tag.RowsAffected()
		tag, err = tx.Exec(ctx, "DELETE FROM outboxrelay.dead_letters WHERE id = $1", id)
		if err != nil {
			return err
		}
		n.Letters = tag.RowsAffected()
		return nil
	})
	if errors.Is(err, ErrNoDeadLetter) {
		return Purged{}, fmt.Errorf("%w %d", ErrNoDeadLetter, id)
	}
	if err != nil {
		return Purged{}, fmt.Errorf("purge dead letter %d: %w", id, err)
	}
	return n, nil
}

// ErrNoDeadLetter is PurgeID's error for an id the slot has no dead
// letter of.
var ErrNoDeadLetter = errors.New("no such dead letter")
