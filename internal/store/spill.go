package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
)

// Spill is the relay's spill store (relay.Spill) in outboxrelay.spilled:
// the messages of a sink that fell behind the others, per slot and sink.
type Spill struct {
	DB   DB
	Slot string
}

var _ relay.Spill = Spill{}

// spilledMessage is what outboxrelay.spilled.message holds of a message:
// every field a sink reads but the body.
type spilledMessage struct {
	ID               string            `json:"id"`
	AggregateType    string            `json:"aggregate_type"`
	AggregateID      string            `json:"aggregate_id"`
	EventType        string            `json:"event_type"`
	Table            string            `json:"table,omitempty"`
	Traceparent      string            `json:"traceparent,omitempty"`
	Tracestate       string            `json:"tracestate,omitempty"`
	Headers          []envelope.Header `json:"headers,omitempty"`
	ContentType      string            `json:"content_type,omitempty"`
	Attributes       []envelope.Header `json:"attributes,omitempty"`
	Format           relay.Format      `json:"format,omitempty"`
	Key              string            `json:"key,omitempty"`
	Timestamp        time.Time         `json:"timestamp,omitzero"`
	Tombstone        bool              `json:"tombstone,omitempty"`
	CommitTime       time.Time         `json:"commit_time"`
	LSN              uint64            `json:"lsn"`
	CommitLSN        uint64            `json:"commit_lsn"`
	Route            string            `json:"route,omitempty"`
	RouteDestination string            `json:"route_destination,omitempty"`
}

func spilledOf(m *relay.Message) spilledMessage {
	return spilledMessage{
		ID: m.ID, AggregateType: m.AggregateType, AggregateID: m.AggregateID, EventType: m.EventType, Table: m.Table,
		Traceparent: m.Traceparent, Tracestate: m.Tracestate, Headers: m.Headers, ContentType: m.ContentType,
		Attributes: m.Attributes, Format: m.Format, Key: m.Key, Timestamp: m.Timestamp, Tombstone: m.Tombstone,
		CommitTime: m.CommitTime, LSN: uint64(m.LSN), CommitLSN: uint64(m.CommitLSN), Route: m.Route,
		RouteDestination: m.RouteDestination,
	}
}

func (s spilledMessage) message(body []byte) *relay.Message {
	return &relay.Message{
		ID: s.ID, AggregateType: s.AggregateType, AggregateID: s.AggregateID, EventType: s.EventType, Table: s.Table,
		Traceparent: s.Traceparent, Tracestate: s.Tracestate, Headers: s.Headers, Envelope: body, ContentType: s.ContentType,
		Attributes: s.Attributes, Format: s.Format, Key: s.Key, Timestamp: s.Timestamp, Tombstone: s.Tombstone,
		CommitTime: s.CommitTime, LSN: pglogrepl.LSN(s.LSN), CommitLSN: pglogrepl.LSN(s.CommitLSN), Route: s.Route,
		RouteDestination: s.RouteDestination,
	}
}

// Add implements relay.Spill: one statement stores ms in their order.
func (s Spill) Add(ctx context.Context, sink string, ms []*relay.Message) ([]int64, error) {
	ids := make([]string, len(ms))
	commits := make([]string, len(ms))
	metas := make([]string, len(ms))
	bodies := make([][]byte, len(ms))
	for i, m := range ms {
		meta, err := json.Marshal(spilledOf(m))
		if err != nil {
			return nil, fmt.Errorf("encode message %s: %w", m.ID, err)
		}
		ids[i], commits[i], metas[i], bodies[i] = clean(m.ID), m.CommitLSN.String(), string(meta), bodyOf(m)
	}
	// The ids are taken in the order of the rows selected (ORDER BY n),
	// and returned sorted, which is that order.
	rows, err := s.DB.Query(ctx, `WITH added AS (
		INSERT INTO outboxrelay.spilled (slot, sink, message_id, commit_lsn, message, body)
		SELECT $1, $2, m.id, m.commit_lsn::pg_lsn, m.message::jsonb, m.body
		FROM unnest($3::text[], $4::text[], $5::text[], $6::bytea[]) WITH ORDINALITY AS m(id, commit_lsn, message, body, n) ORDER BY m.n
		RETURNING id)
		SELECT id FROM added ORDER BY id`,
		s.Slot, sink, ids, commits, metas, bodies)
	if err == nil {
		var seqs []int64
		if seqs, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err == nil && len(seqs) == len(ms) {
			return seqs, nil
		} else if err == nil {
			err = fmt.Errorf("%d ids for %d messages", len(seqs), len(ms))
		}
	}
	return nil, fmt.Errorf("store %d messages of sink %q in outboxrelay.spilled: %w", len(ms), sink, err)
}

// Read implements relay.Spill.
func (s Spill) Read(ctx context.Context, sink string, after int64, n int) ([]relay.Spilled, error) {
	rows, err := s.DB.Query(ctx, `SELECT id, message, body FROM outboxrelay.spilled
		WHERE slot = $1 AND sink = $2 AND id > $3 ORDER BY id LIMIT $4`, s.Slot, sink, after, n)
	if err != nil {
		return nil, fmt.Errorf("read outboxrelay.spilled: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (relay.Spilled, error) {
		var seq int64
		var meta, body []byte
		if err := row.Scan(&seq, &meta, &body); err != nil {
			return relay.Spilled{}, err
		}
		var sm spilledMessage
		if err := json.Unmarshal(meta, &sm); err != nil {
			return relay.Spilled{}, fmt.Errorf("message %d: %w", seq, err)
		}
		return relay.Spilled{Seq: seq, Message: sm.message(body)}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("read outboxrelay.spilled: %w", err)
	}
	return out, nil
}

// Delete implements relay.Spill.
func (s Spill) Delete(ctx context.Context, sink string, seqs []int64) error {
	_, err := s.DB.Exec(ctx, `DELETE FROM outboxrelay.spilled WHERE slot = $1 AND sink = $2 AND id = ANY($3::bigint[])`, s.Slot, sink, seqs)
	if err != nil {
		return fmt.Errorf("delete delivered messages from outboxrelay.spilled: %w", err)
	}
	return nil
}

// Trim implements relay.Spill.
func (s Spill) Trim(ctx context.Context, sink string, from pglogrepl.LSN) (int64, error) {
	tag, err := s.DB.Exec(ctx, `DELETE FROM outboxrelay.spilled WHERE slot = $1 AND sink = $2 AND commit_lsn >= $3::pg_lsn`, s.Slot, sink, from.String())
	if err != nil {
		return 0, fmt.Errorf("delete from outboxrelay.spilled the messages the slot delivers again: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Count implements relay.Spill.
func (s Spill) Count(ctx context.Context, sink string) (int64, error) {
	var n int64
	err := s.DB.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled WHERE slot = $1 AND sink = $2`, s.Slot, sink).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count outboxrelay.spilled: %w", err)
	}
	return n, nil
}

// SpillReady fails with one error naming the fix when the relay cannot
// spill or would strand what was spilled: spills is whether it spills
// (several sinks and relay.behind: spill) and sinks are then the names of
// its sinks. outboxrelay.spilled must exist when it spills (a schema from
// before it lacks it), and may hold messages of the slot only for those
// sinks: the slot has passed them, so messages no sink reads back would
// never be delivered.
func SpillReady(ctx context.Context, db DB, slot string, spills bool, sinks []string) error {
	var exists bool
	if err := db.QueryRow(ctx, "SELECT to_regclass('outboxrelay.spilled') IS NOT NULL").Scan(&exists); err != nil {
		return fmt.Errorf("look for outboxrelay.spilled: %w", err)
	}
	switch {
	case !exists && spills:
		return fmt.Errorf("schema outboxrelay is from an older version without outboxrelay.spilled, which a relay with several sinks stores a sink's messages in while it is behind; run `outboxrelay migrate` to update it, or set relay.behind: hold")
	case !exists:
		return nil
	}
	if sinks == nil {
		sinks = []string{} // NOT sink = ANY(NULL) would match nothing
	}
	var orphan string
	var n int64
	err := db.QueryRow(ctx, `SELECT sink, count(*) FROM outboxrelay.spilled WHERE slot = $1 AND NOT sink = ANY($2::text[])
		GROUP BY sink ORDER BY sink LIMIT 1`, slot, sinks).Scan(&orphan, &n)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case !spills && errors.As(err, &pgErr) && pgErr.Code == "42501":
		// A role that may not read the table cannot have stored into it.
		return nil
	case err != nil:
		return fmt.Errorf("read outboxrelay.spilled: %w", err)
	}
	why := "the configuration has no such sink"
	if !spills {
		why = "this configuration does not read such messages back (it has one sink, or relay.behind: hold)"
	}
	return fmt.Errorf("outboxrelay.spilled holds %d messages of sink %q for slot %s, stored while it was behind and past the slot's position, and %s; "+
		"start with that sink in sinks and relay.behind: spill until they are delivered, or discard them with DELETE FROM outboxrelay.spilled WHERE slot = '%s' AND sink = '%s'",
		n, orphan, slot, why, slot, orphan)
}
