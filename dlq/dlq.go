// Package dlq stores messages the broker will never take in
// outboxrelay.dead_letters, and lists, replays and purges them.
//
// A dead letter holds everything needed to publish the message again: the
// routing fields, the row headers and the exact envelope bytes.
package dlq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
)

// DB is what the store needs from a connection or pool. It must be safe for
// concurrent use when Store.Add is used as relay.Config.DeadLetter
// (*pgxpool.Pool is).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Store is the dead-letter table of one slot.
type Store struct {
	DB   DB
	Slot string
}

// Letter is one stored dead letter.
type Letter struct {
	ID            int64           `json:"id"`
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
}

// Add stores m. It returns once the row is committed, so the relay may
// confirm past the message. It has the signature of relay.DeadLetterFunc.
func (s *Store) Add(ctx context.Context, m *relay.Message) error {
	headers := map[string]string{}
	for _, h := range m.Headers {
		headers[h.Key] = h.Value
	}
	hj, err := json.Marshal(headers)
	if err != nil {
		return fmt.Errorf("encode headers: %w", err)
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
	var attrs []byte
	if len(m.Attributes) > 0 {
		a := map[string]string{}
		for _, h := range m.Attributes {
			a[h.Key] = h.Value
		}
		if attrs, err = json.Marshal(a); err != nil {
			return fmt.Errorf("encode attributes: %w", err)
		}
	}
	_, err = s.DB.Exec(ctx, `INSERT INTO outboxrelay.dead_letters
		(slot, message_id, destination, aggregate_type, aggregate_id, event_type, source_table, traceparent, headers, envelope, error, attempts, first_failed_at, last_failed_at,
		 body, content_type, attributes)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)`,
		s.Slot, clean(m.ID), clean(m.Destination), clean(m.AggregateType), clean(m.AggregateID), clean(m.EventType), m.Table,
		m.Traceparent, string(hj), clean(string(m.Envelope)), clean(errText), m.Attempts, first, last,
		m.Envelope, m.ContentType, nullJSON(attrs))
	if err != nil {
		return fmt.Errorf("store dead letter %s: %w", m.ID, err)
	}
	return nil
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

// Filter selects dead letters.
type Filter struct {
	ID              int64 // 0: any
	IncludeReplayed bool
}

// List returns the slot's dead letters, oldest first.
func (s *Store) List(ctx context.Context, f Filter) ([]Letter, error) {
	q := `SELECT id, message_id, destination, aggregate_type, aggregate_id, event_type, source_table, traceparent, headers,
		envelope, error, attempts, first_failed_at, last_failed_at, created_at, replayed_at,
		body, coalesce(content_type, ''), attributes
		FROM outboxrelay.dead_letters WHERE slot = $1 AND ($2 = 0 OR id = $2) AND ($3 OR replayed_at IS NULL) ORDER BY id`
	rows, err := s.DB.Query(ctx, q, s.Slot, f.ID, f.IncludeReplayed)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	letters, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Letter, error) {
		var l Letter
		var headers, attrs []byte
		err := row.Scan(&l.ID, &l.MessageID, &l.Destination, &l.AggregateType, &l.AggregateID, &l.EventType, &l.Table,
			&l.Traceparent, &headers, &l.Envelope, &l.Error, &l.Attempts, &l.FirstFailedAt, &l.LastFailedAt, &l.CreatedAt, &l.ReplayedAt,
			&l.Body, &l.ContentType, &attrs)
		l.Headers = headers
		l.Attributes = attrs
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return letters, nil
}

// Message rebuilds the relay message of a dead letter for publishing again.
func (l *Letter) Message() (*relay.Message, error) {
	headers, err := envelope.ParseHeaders(l.Headers)
	if err != nil {
		return nil, fmt.Errorf("dead letter %d: %w", l.ID, err)
	}
	body := l.Body
	if body == nil { // stored before the body column existed
		body = []byte(l.Envelope)
	}
	var attrs []envelope.Header
	if len(l.Attributes) > 0 {
		if attrs, err = envelope.ParseHeaders(l.Attributes); err != nil {
			return nil, fmt.Errorf("dead letter %d attributes: %w", l.ID, err)
		}
	}
	return &relay.Message{
		ID: l.MessageID, AggregateType: l.AggregateType, AggregateID: l.AggregateID, EventType: l.EventType,
		Table: l.Table, Traceparent: l.Traceparent, Headers: headers, Envelope: body,
		ContentType: l.ContentType, Attributes: attrs, CommitTime: l.CreatedAt,
	}, nil
}

// Replay publishes each selected dead letter again through sink, one at a
// time, and marks it replayed once the broker has acknowledged it. It stops
// at the first failure and returns how many were replayed.
func (s *Store) Replay(ctx context.Context, sink relay.Sink, f Filter) (int, error) {
	letters, err := s.List(ctx, f)
	if err != nil {
		return 0, err
	}
	if f.ID != 0 && len(letters) == 0 {
		return 0, fmt.Errorf("no pending dead letter with id %d for slot %s", f.ID, s.Slot)
	}
	n := 0
	for i := range letters {
		l := &letters[i]
		m, err := l.Message()
		if err != nil {
			return n, err
		}
		result := make(chan error, 1)
		sink.Publish(ctx, m, func(_ *relay.Message, err error) { result <- err })
		select {
		case err = <-result:
		case <-ctx.Done():
			return n, ctx.Err()
		}
		if err != nil {
			return n, fmt.Errorf("replay dead letter %d (message %s): %w", l.ID, l.MessageID, err)
		}
		if _, err := s.DB.Exec(ctx, "UPDATE outboxrelay.dead_letters SET replayed_at = now() WHERE id = $1", l.ID); err != nil {
			return n, fmt.Errorf("mark dead letter %d replayed (it was published): %w", l.ID, err)
		}
		n++
	}
	return n, nil
}

// Purge deletes the slot's dead letters created before t and returns how many.
func (s *Store) Purge(ctx context.Context, before time.Time) (int64, error) {
	if before.IsZero() {
		return 0, errors.New("purge needs a time")
	}
	tag, err := s.DB.Exec(ctx, "DELETE FROM outboxrelay.dead_letters WHERE slot = $1 AND created_at < $2", s.Slot, before)
	if err != nil {
		return 0, fmt.Errorf("purge dead letters: %w", err)
	}
	return tag.RowsAffected(), nil
}
