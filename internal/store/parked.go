package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/relay"
)

// DeadLetters serialises the relay, which parks messages, with Replay and
// Purge, which release a head, through the head's row lock: Park locks the
// head row (FOR UPDATE) and stores the message before it commits; a release
// takes the same lock, and only then looks at the chain in a statement of
// its own (READ COMMITTED: it sees every message committed before it got
// the lock). So either a message is in the chain the release publishes or
// deletes, or Park finds the head released and the relay publishes the
// message itself, after the chain.

var _ relay.Parking = (*DeadLetters)(nil)

// ParkedMessage is a message waiting behind a dead letter.
type ParkedMessage struct {
	ID            int64           `json:"id"`
	HeadID        int64           `json:"head_id"`
	MessageID     string          `json:"message_id"`
	AggregateType string          `json:"aggregate_type"`
	AggregateID   string          `json:"aggregate_id"`
	EventType     string          `json:"event_type"`
	Table         string          `json:"source_table"`
	Traceparent   string          `json:"traceparent"`
	Headers       json.RawMessage `json:"headers"`
	ContentType   string          `json:"content_type,omitempty"`
	Attributes    json.RawMessage `json:"attributes,omitempty"`
	CommittedAt   time.Time       `json:"committed_at"`
	CreatedAt     time.Time       `json:"created_at"`
	Body          []byte          `json:"-"`
	// Envelope is Body as text, when it is UTF-8 (a binary format's body
	// is left out), as a dead letter's envelope is shown.
	Envelope string `json:"envelope,omitempty"`
	// rec is what the outbox router's options made of the row.
	rec record
}

// Heads returns the slot's parked aggregates (relay.Parking).
func (s *DeadLetters) Heads(ctx context.Context) ([]relay.Head, error) {
	rows, err := s.DB.Query(ctx, `SELECT id, aggregate_type, aggregate_id, sink FROM outboxrelay.dead_letters
		WHERE slot = $1 AND parks ORDER BY id`, s.Slot)
	if err != nil {
		return nil, fmt.Errorf("list parked aggregates: %w", err)
	}
	heads, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (relay.Head, error) {
		var h relay.Head
		err := row.Scan(&h.ID, &h.AggregateType, &h.AggregateID, &h.Sink)
		return h, err
	})
	if err != nil {
		return nil, fmt.Errorf("list parked aggregates: %w", err)
	}
	return heads, nil
}

// Park stores m behind the dead letter that parks its aggregate
// (relay.Parking).
func (s *DeadLetters) Park(ctx context.Context, m *relay.Message) (bool, error) {
	hj, attrs, err := encodeHeaders(m)
	if err != nil {
		return false, err
	}
	parked := false
	err = pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		var head int64
		var commitLSN, lsn string
		err := tx.QueryRow(ctx, `SELECT id, coalesce(commit_lsn, '0/0')::text, coalesce(lsn, '0/0')::text FROM outboxrelay.dead_letters
			WHERE slot = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND sink = $4 AND parks ORDER BY id LIMIT 1 FOR UPDATE`,
			s.Slot, clean(m.AggregateType), clean(m.AggregateID), m.Sink).Scan(&head, &commitLSN, &lsn)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // released
		}
		if err != nil {
			return err
		}
		parked = true
		if before(m, commitLSN, lsn) {
			return nil // the head itself, or delivered before it
		}
		rec := recordOf(m)
		_, err = tx.Exec(ctx, `INSERT INTO outboxrelay.parked
			(slot, head_id, message_id, aggregate_type, aggregate_id, event_type, source_table, traceparent, headers, body, content_type, attributes,
			 commit_lsn, lsn, committed_at, record_key, record_timestamp, tombstone, sink)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::pg_lsn, $14::pg_lsn, $15, $16, $17, $18, $19)
			ON CONFLICT (head_id, lsn) DO NOTHING`,
			s.Slot, head, clean(m.ID), clean(m.AggregateType), clean(m.AggregateID), clean(m.EventType), m.Table, m.Traceparent,
			string(hj), bodyOf(m), m.ContentType, nullJSON(attrs), m.CommitLSN.String(), m.LSN.String(), m.CommitTime,
			rec.Key, rec.Timestamp, rec.Tombstone, m.Sink)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("park message %s: %w", m.ID, err)
	}
	return parked, nil
}

// before reports whether m is at or before the head's position in commit
// order (commit LSN, then LSN within the transaction).
func before(m *relay.Message, headCommit, headLSN string) bool {
	hc, err1 := pglogrepl.ParseLSN(headCommit)
	hl, err2 := pglogrepl.ParseLSN(headLSN)
	if err1 != nil || err2 != nil || hc == 0 {
		return false // a head without a position: park everything behind it
	}
	if m.CommitLSN != hc {
		return m.CommitLSN < hc
	}
	return m.LSN <= hl
}

// chain returns the messages parked behind head, in publishing order.
func (s *DeadLetters) chain(ctx context.Context, head int64) ([]ParkedMessage, error) {
	rows, err := s.DB.Query(ctx, `SELECT id, head_id, message_id, aggregate_type, aggregate_id, event_type, source_table, traceparent,
		headers, coalesce(content_type, ''), attributes, committed_at, created_at, body, record_key, record_timestamp, tombstone
		FROM outboxrelay.parked WHERE head_id = $1 ORDER BY id`, head)
	if err != nil {
		return nil, fmt.Errorf("list messages parked behind dead letter %d: %w", head, err)
	}
	chain, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ParkedMessage, error) {
		var p ParkedMessage
		var headers, attrs []byte
		err := row.Scan(&p.ID, &p.HeadID, &p.MessageID, &p.AggregateType, &p.AggregateID, &p.EventType, &p.Table, &p.Traceparent,
			&headers, &p.ContentType, &attrs, &p.CommittedAt, &p.CreatedAt, &p.Body, &p.rec.Key, &p.rec.Timestamp, &p.rec.Tombstone)
		p.Headers, p.Attributes = headers, attrs
		if utf8.Valid(p.Body) {
			p.Envelope = string(p.Body)
		}
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("list messages parked behind dead letter %d: %w", head, err)
	}
	return chain, nil
}

// Message rebuilds the relay message of a parked message.
func (p *ParkedMessage) Message() (*relay.Message, error) {
	headers, attrs, err := decodeHeaders(p.Headers, p.Attributes)
	if err != nil {
		return nil, fmt.Errorf("parked message %d: %w", p.ID, err)
	}
	m := &relay.Message{
		ID: p.MessageID, AggregateType: p.AggregateType, AggregateID: p.AggregateID, EventType: p.EventType,
		Table: p.Table, Traceparent: p.Traceparent, Headers: headers, Envelope: p.Body,
		ContentType: p.ContentType, Attributes: attrs, CommitTime: p.CommittedAt,
	}
	p.rec.apply(m)
	return m, nil
}

// replayChain publishes the messages parked behind head in order, each once
// the one before it was acknowledged, deleting each once it is, and then
// releases the aggregate. A relay running meanwhile may park more: they are
// published too before the release.
func (s *DeadLetters) replayChain(ctx context.Context, sink relay.Sink, head int64, sinkName string) (int, error) {
	n := 0
	for {
		chain, err := s.chain(ctx, head)
		if err != nil {
			return n, err
		}
		for i := range chain {
			p := &chain[i]
			m, err := p.Message()
			if err != nil {
				return n, err
			}
			m.Sink = sinkName // the head's: a chain waits on one sink
			if err := publish(ctx, sink, m); err != nil {
				return n, fmt.Errorf("replay message %s parked behind dead letter %d: %w", p.MessageID, head, err)
			}
			if _, err := s.DB.Exec(ctx, "DELETE FROM outboxrelay.parked WHERE id = $1", p.ID); err != nil {
				return n, fmt.Errorf("remove parked message %d (it was published): %w", p.ID, err)
			}
			n++
		}
		released, err := s.release(ctx, head)
		if err != nil || released {
			return n, err
		}
	}
}

// release ends head's parking if nothing waits behind it any more, and
// reports whether it did.
func (s *DeadLetters) release(ctx context.Context, head int64) (bool, error) {
	released := false
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT id FROM outboxrelay.dead_letters WHERE id = $1 FOR UPDATE", head); err != nil {
			return err
		}
		var waiting bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM outboxrelay.parked WHERE head_id = $1)", head).Scan(&waiting); err != nil {
			return err
		}
		if waiting {
			return nil
		}
		_, err := tx.Exec(ctx, "UPDATE outboxrelay.dead_letters SET parks = false WHERE id = $1", head)
		released = err == nil
		return err
	})
	if err != nil {
		return false, fmt.Errorf("release the aggregate of dead letter %d: %w", head, err)
	}
	return released, nil
}
