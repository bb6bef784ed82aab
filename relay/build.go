package relay

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/envelope"
)

// A Builder makes the relay's messages: the envelope (or CloudEvent or
// Debezium body), message_id, trace id, headers and destination fields of
// an outbox row or a table-less message. The relay builds with one on its
// stream goroutine; replay and recovery build, with NewBuilder, the
// messages of rows read back from their table exactly as the relay made
// them from the WAL. Only what the table does not hold differs: the
// source's WAL positions are those the caller passes in tx and LSN (zero
// when unknown).
//
// A Builder is not safe for concurrent use.
type Builder struct {
	cfg *settings
	log *zap.Logger
	// mappings are by relation id; one is replaced when its relation is
	// announced again.
	mappings map[uint32]*mapping
	// tx is the transaction whose messages are being built.
	tx cdc.Begin
}

// NewBuilder returns a Builder for the pipeline configuration cfg (its
// Database, Tables, Resolve, Columns, Format and CloudEventsSource count).
func NewBuilder(cfg Config, opts Options) *Builder {
	return newBuilder(&settings{Config: cfg.WithDefaults(), Options: opts}, zap.NewNop().Named("relay"))
}

// newBuilder returns a Builder for cfg, which must have its defaults set.
func newBuilder(cfg *settings, log *zap.Logger) *Builder {
	return &Builder{cfg: cfg, log: log, mappings: make(map[uint32]*mapping)}
}

// Row builds the message for one row of rel, whose Values are in
// PostgreSQL's text output, one per column of rel, as pgoutput sends them.
// tx is the row's transaction as far as it is known. As in the relay, an
// invalid row still yields a message, with the reason it cannot be sent.
func (b *Builder) Row(ctx context.Context, rel *cdc.Relation, ins *cdc.Insert, tx cdc.Begin) (*Message, error) {
	mp, err := b.mapping(ctx, rel)
	if err != nil {
		return nil, err
	}
	if mp.skip {
		return nil, fmt.Errorf("table %s is not relayed", rel.QualifiedName())
	}
	b.tx = tx
	m, buildErr := b.buildRow(mp, ins)
	// The caller owns the message: its buffer never returns to the pool.
	m.pooled = false
	return m, buildErr
}

// begin starts the messages of transaction tx.
func (b *Builder) begin(tx cdc.Begin) { b.tx = tx }

// reset forgets the relations announced so far: a new replication session
// announces them again.
func (b *Builder) reset() { clear(b.mappings) }

// mapping locates the configured columns in a relation.
type mapping struct {
	rel *cdc.Relation
	// skip: the operator chose not to relay the table's inserts.
	skip                                           bool
	table                                          string
	id, aggType, aggID, eventType, payload         int
	headers, traceparent, schemaVersion, createdAt int
	key, timestamp                                 int
	headerColumns                                  []int
	payloadFormat                                  envelope.PayloadFormat
}

func (b *Builder) mapping(ctx context.Context, rel *cdc.Relation) (*mapping, error) {
	if mp, ok := b.mappings[rel.ID]; ok && mp.rel == rel {
		return mp, nil
	}
	idx := func(name string) int {
		if name == "" {
			return -1
		}
		for i, c := range rel.Columns {
			if c.Name == name {
				return i
			}
		}
		return -1
	}
	c := b.cfg.Columns
	table := rel.QualifiedName()
	if b.cfg.Resolver != nil {
		var err error
		if table, err = b.cfg.Resolver.Resolve(ctx, rel); err != nil {
			return nil, err
		}
	} else if len(b.cfg.Tables) > 0 && !slices.Contains(b.cfg.Tables, table) {
		return nil, cdc.UnknownRelation("", rel)
	}
	if table == "" {
		b.log.Warn("skipping the inserts of a table in postgres.ignore_tables", zap.String("table", rel.QualifiedName()))
		mp := &mapping{rel: rel, skip: true}
		b.mappings[rel.ID] = mp
		return mp, nil
	}
	mp := &mapping{
		table: table,
		id:    idx(c.ID), aggType: idx(c.AggregateType), aggID: idx(c.AggregateID), eventType: idx(c.EventType),
		payload: idx(c.Payload), headers: idx(c.Headers), traceparent: idx(c.Traceparent),
		schemaVersion: idx(c.SchemaVersion), createdAt: idx(c.CreatedAt),
		key: idx(c.Key), timestamp: idx(c.Timestamp),
	}
	for _, k := range []struct {
		key, name string
		i         int
	}{{"columns.key", c.Key, mp.key}, {"columns.timestamp", c.Timestamp, mp.timestamp}} {
		if k.name != "" && k.i < 0 {
			return nil, &cdc.SetupError{Msg: fmt.Sprintf("outbox table %s has no column %q that postgres.%s names", mp.table, k.name, k.key)}
		}
	}
	for _, h := range b.cfg.HeaderColumns {
		i := idx(h)
		if i < 0 {
			return nil, &cdc.SetupError{Msg: fmt.Sprintf("outbox table %s has no column %q that postgres.header_columns names", mp.table, h)}
		}
		mp.headerColumns = append(mp.headerColumns, i)
	}
	for name, i := range map[string]int{c.ID: mp.id, c.AggregateType: mp.aggType, c.AggregateID: mp.aggID, c.EventType: mp.eventType, c.Payload: mp.payload} {
		if i < 0 {
			return nil, &cdc.SetupError{Msg: fmt.Sprintf("outbox table %s has no column %q; add it or map it in postgres.columns", mp.table, name)}
		}
	}
	switch rel.Columns[mp.payload].TypeOID {
	case cdc.OIDJSONB, cdc.OIDJSON:
		mp.payloadFormat = envelope.PayloadJSON
	case cdc.OIDBytea:
		mp.payloadFormat = envelope.PayloadBinary
	default:
		mp.payloadFormat = envelope.PayloadText
	}
	mp.rel = rel
	b.mappings[rel.ID] = mp
	return mp, nil
}

func col(vals [][]byte, i int) []byte {
	if i < 0 {
		return nil
	}
	return vals[i]
}

// buildRow makes the message for an inserted row. When the row is invalid it
// still returns a message (with as much of the envelope as could be built)
// and the reason, so that the row is dead-lettered rather than lost.
func (b *Builder) buildRow(mp *mapping, ins *cdc.Insert) (*Message, error) {
	v := ins.Values
	var errs []error
	req := func(i int, name string) string {
		val := col(v, i)
		if len(val) == 0 {
			errs = append(errs, fmt.Errorf("column %s is null or empty", name))
		}
		return string(val)
	}
	c := b.cfg.Columns
	em := envelope.Message{
		MessageID:     req(mp.id, c.ID),
		AggregateType: req(mp.aggType, c.AggregateType),
		AggregateID:   req(mp.aggID, c.AggregateID),
		EventType:     req(mp.eventType, c.EventType),
		SchemaVersion: 1,
		Headers:       col(v, mp.headers),
		Payload:       col(v, mp.payload),
		PayloadFormat: mp.payloadFormat,
	}
	if mp.payloadFormat == envelope.PayloadBinary && em.Payload != nil {
		raw, err := decodeBytea(em.Payload)
		if err != nil {
			errs = append(errs, fmt.Errorf("column %s: %w", c.Payload, err))
		}
		em.Payload = raw
	}
	if em.Payload == nil && b.cfg.Format != FormatDebezium {
		// The debezium format sends a tombstone instead (finish).
		errs = append(errs, fmt.Errorf("column %s is null", c.Payload))
	}
	if val := col(v, mp.schemaVersion); val != nil {
		n, err := strconv.Atoi(string(val))
		if err != nil {
			errs = append(errs, fmt.Errorf("column %s: %q is not an integer", c.SchemaVersion, val))
		} else {
			em.SchemaVersion = n
		}
	}
	em.OccurredAt = b.tx.CommitTime
	if val := col(v, mp.createdAt); val != nil {
		if t, err := envelope.ParseTimestamp(val); err == nil {
			em.OccurredAt = t
		}
	}
	var ts time.Time
	if mp.timestamp >= 0 {
		t, err := envelope.ParseTimestamp(v[mp.timestamp])
		if err != nil {
			errs = append(errs, fmt.Errorf("column %s (postgres.columns.timestamp): %w", c.Timestamp, err))
		} else {
			em.OccurredAt, ts = t, t
		}
	}
	key := em.AggregateID
	if mp.key >= 0 {
		key = req(mp.key, c.Key)
	}
	m, err := b.finish(&em, mp.table, envelope.TraceparentColumn(string(col(v, mp.traceparent))), ins.LSN, errs)
	m.Key, m.Timestamp = key, ts
	for j, i := range mp.headerColumns {
		if v[i] != nil {
			m.Headers = append(m.Headers, envelope.Header{Key: b.cfg.HeaderColumns[j], Value: string(v[i])})
		}
	}
	return m, err
}

func (b *Builder) buildEmitted(lm *cdc.LogicalMessage) (*Message, error) {
	e, err := envelope.ParseEmitted(lm.Content)
	if err != nil {
		// Keep the content so the dead letter shows what was sent.
		em := envelope.Message{MessageID: e.ID, Payload: lm.Content, PayloadFormat: envelope.PayloadText, OccurredAt: b.tx.CommitTime}
		return b.finish(&em, "", "", lm.LSN, []error{err})
	}
	em := envelope.Message{
		MessageID: e.ID, AggregateType: e.AggregateType, AggregateID: e.AggregateID, EventType: e.EventType,
		SchemaVersion: e.SchemaVersion, Headers: e.Headers, Payload: e.Payload, PayloadFormat: envelope.PayloadJSON,
		OccurredAt: b.tx.CommitTime,
	}
	return b.finish(&em, "", e.Traceparent, lm.LSN, nil)
}

func (b *Builder) finish(em *envelope.Message, table, traceparent string, lsn cdc.LSN, errs []error) (*Message, error) {
	tombstone := b.cfg.Format == FormatDebezium && em.Payload == nil
	if len(errs) == 0 && b.cfg.Validator != nil && !tombstone {
		if err := b.cfg.Validator.Validate(em); err != nil {
			errs = append(errs, err)
		}
	}
	em.TraceID, em.Traceparent = envelope.Trace(traceparent, em.MessageID)
	headers, err := envelope.ParseHeaders(em.Headers)
	if err != nil {
		errs = append(errs, err)
		em.Headers = nil
	}
	em.Source = envelope.Source{
		Database: b.cfg.Database, Table: table, LSN: uint64(lsn), CommitLSN: uint64(b.tx.FinalLSN),
		XID: b.tx.XID, CommittedAt: b.tx.CommitTime,
	}
	m := &Message{
		ID: em.MessageID, AggregateType: em.AggregateType, AggregateID: em.AggregateID, EventType: em.EventType,
		Key: em.AggregateID, Table: table, Traceparent: em.Traceparent, Format: b.cfg.Format, Tombstone: tombstone,
		CommitTime: b.tx.CommitTime, LSN: lsn, CommitLSN: b.tx.FinalLSN,
	}
	m.Headers, m.Tracestate = b.brokerHeaders(m, headers, traceparent)
	b.startSpan(m, em, traceparent != "" && m.Traceparent == traceparent)
	size := em.SizeHint() + len(b.cfg.CloudEventsSource)
	switch b.cfg.Format {
	case FormatCloudEvents:
		m.Envelope = em.AppendCloudEvent(getBuffer(size), b.cfg.CloudEventsSource)
		m.pooled = true
		m.ContentType = "application/cloudevents+json"
	case FormatCloudEventsBinary:
		// The body is a copy of its own, outside the pool: taking a pooled
		// buffer here only to drop it cost a pool round trip per message.
		body, ct := em.CloudEventData()
		m.Envelope = append(make([]byte, 0, len(body)), body...)
		m.ContentType = ct
		m.Attributes = em.CloudEventAttributes(b.cfg.CloudEventsSource)
	case FormatDebezium:
		d := em.Debezium()
		m.Envelope = append(getBuffer(size), d.Value...)
		m.pooled = true
		m.ContentType = d.ContentType
	default:
		m.Envelope = em.AppendJSON(getBuffer(size))
		m.pooled = true
	}
	return m, errors.Join(errs...)
}

// decodeBytea decodes PostgreSQL's hex bytea output (\x...).
func decodeBytea(b []byte) ([]byte, error) {
	if len(b) < 2 || b[0] != '\\' || b[1] != 'x' {
		return nil, errors.New("bytea value is not in hex format")
	}
	out := make([]byte, hex.DecodedLen(len(b)-2))
	if _, err := hex.Decode(out, b[2:]); err != nil {
		return nil, fmt.Errorf("decode bytea: %w", err)
	}
	return out, nil
}

// Envelope buffers are pooled: allocating and zeroing a fresh one per row
// was a tenth of the relay's CPU. A message's buffer returns to the pool
// once the sink is done with it (publisher.complete).
var buffers sync.Pool

const maxPooledBuffer = 64 << 10

func getBuffer(size int) []byte {
	if bp, ok := buffers.Get().(*[]byte); ok && cap(*bp) >= size {
		return (*bp)[:0]
	}
	return make([]byte, 0, max(size, 2048))
}

func putBuffer(b []byte) {
	if cap(b) > maxPooledBuffer {
		return
	}
	b = b[:0]
	buffers.Put(&b)
}
