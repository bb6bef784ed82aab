package relay

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/rules"
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
	// names holds the aggregate types and event types seen so far, so
	// that a row's copies of them are not allocated again (intern).
	names map[string]string
	// one is the slice route returns for a row's one message; the
	// stream's caller is done with it before the next row.
	one [1]*Message
	// row is what the routing rules see of the row being built, and
	// decision what they made of it: both reused from row to row.
	row      rules.Row
	decision rules.Decision
}

// maxNames bounds Builder.names: an outbox whose types are unbounded
// (a type per aggregate) gets its strings allocated per row beyond it.
const maxNames = 4096

// intern returns val as a string, the same one for every row that holds
// the same bytes while Builder.names has room.
func (b *Builder) intern(val []byte) string {
	if s, ok := b.names[string(val)]; ok {
		return s
	}
	s := string(val)
	if len(b.names) < maxNames {
		b.names[s] = s
	}
	return s
}

// NewBuilder returns a Builder for the pipeline configuration cfg (its
// Database, Tables, Resolve, Columns, Format and CloudEventsSource count).
func NewBuilder(cfg Config, opts Options) *Builder {
	s := newSettings(cfg, opts)
	return newBuilder(&s, zap.NewNop().Named("relay"))
}

// newBuilder returns a Builder for cfg, which must have its defaults set.
func newBuilder(cfg *settings, log *zap.Logger) *Builder {
	return &Builder{cfg: cfg, log: log, mappings: make(map[uint32]*mapping), names: make(map[string]string)}
}

// Row builds the message for one row of rel, whose Values are in
// PostgreSQL's text output, one per column of rel, as pgoutput sends them.
// tx is the row's transaction as far as it is known. As in the relay, an
// invalid row still yields a message, with the reason it cannot be sent.
// With routing rules it is the row's first message (see Rows).
func (b *Builder) Row(ctx context.Context, rel *cdc.Relation, ins *cdc.Insert, tx cdc.Begin) (*Message, error) {
	ms, err := b.Rows(ctx, rel, ins, tx)
	if len(ms) == 0 {
		return nil, err
	}
	return ms[0], err
}

// Rows builds the messages of one row as Row does: one, or with routing
// rules one per route the row takes (a row the rules drop is one message
// with Filtered set). The error is the row's, shared by its messages.
func (b *Builder) Rows(ctx context.Context, rel *cdc.Relation, ins *cdc.Insert, tx cdc.Begin) ([]*Message, error) {
	mp, err := b.mapping(ctx, rel)
	if err != nil {
		return nil, err
	}
	if mp.skip {
		return nil, fmt.Errorf("table %s is not relayed", rel.QualifiedName())
	}
	b.tx = tx
	ms, buildErr := b.buildRows(mp, ins)
	ms = slices.Clone(ms) // the caller keeps it; the Builder reuses its own
	for _, m := range ms {
		// The caller owns the message: its buffer never returns to the pool.
		m.buf = nil
	}
	return ms, buildErr
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
	headerColumns, envelopeColumns                 []int
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
	for _, name := range b.cfg.EnvelopeColumns {
		i := idx(name)
		if i < 0 {
			return nil, &cdc.SetupError{Msg: fmt.Sprintf("outbox table %s has no column %q that postgres.envelope_columns names", mp.table, name)}
		}
		mp.envelopeColumns = append(mp.envelopeColumns, i)
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

// rowFields is what an inserted row gives the envelope and the rules,
// before the rules run.
type rowFields struct {
	em envelope.Message
	// errs are why the row is invalid: it is dead-lettered as it is.
	errs []error
	// ts is the record timestamp (postgres.columns.timestamp), or zero.
	ts  time.Time
	key string
}

// columns are the row v of mp's table as the rules see it: its non-NULL
// columns as text.
func columns(mp *mapping, v [][]byte) map[string]string {
	cols := make(map[string]string, len(v))
	for i, val := range v {
		if val != nil && i < len(mp.rel.Columns) {
			cols[mp.rel.Columns[i].Name] = string(val)
		}
	}
	return cols
}

// fields reads an inserted row's columns as mp maps them.
func (b *Builder) fields(mp *mapping, ins *cdc.Insert) rowFields {
	v := ins.Values
	var errs []error
	req := func(i int, name string, str func([]byte) string) string {
		val := col(v, i)
		if len(val) == 0 {
			errs = append(errs, fmt.Errorf("column %s is null or empty", name))
		}
		return str(val)
	}
	c := b.cfg.Columns
	em := envelope.Message{
		MessageID:     newString(col(v, mp.id)),
		AggregateType: b.intern(col(v, mp.aggType)),
		AggregateID:   newString(col(v, mp.aggID)),
		EventType:     b.intern(col(v, mp.eventType)),
		SchemaVersion: 1,
		Headers:       col(v, mp.headers),
		Payload:       col(v, mp.payload),
		PayloadFormat: mp.payloadFormat,
	}
	if err := c.Missing(&em); err != nil {
		errs = append(errs, err)
	}
	if len(mp.envelopeColumns) > 0 {
		em.Fields = make([]envelope.Field, len(mp.envelopeColumns))
		for j, i := range mp.envelopeColumns {
			em.Fields[j] = envelope.Field{Name: b.cfg.EnvelopeColumns[j], Value: string(v[i]), Null: v[i] == nil}
		}
	}
	if mp.payloadFormat == envelope.PayloadBinary && em.Payload != nil {
		raw, err := decodeBytea(em.Payload)
		if err != nil {
			errs = append(errs, fmt.Errorf("column %s: %w", c.Payload, err))
		}
		em.Payload = raw
	}
	if em.Payload == nil && b.cfg.Format != FormatDebezium && b.cfg.rules == nil {
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
		key = req(mp.key, c.Key, newString)
	}
	return rowFields{em: em, errs: errs, ts: ts, key: key}
}

// buildRows makes the messages for an inserted row: one, or one per route
// the row takes (see route). When the row is invalid it still returns a
// message (with as much of the envelope as could be built) and the reason,
// so that the row is dead-lettered rather than lost.
func (b *Builder) buildRows(mp *mapping, ins *cdc.Insert) ([]*Message, error) {
	f := b.fields(mp, ins)
	v := ins.Values
	var cols func() map[string]string
	if b.cfg.rules != nil {
		cols = func() map[string]string { return columns(mp, v) }
	}
	ms, err := b.route(&f.em, mp.table, envelope.TraceparentColumn(string(col(v, mp.traceparent))), ins.LSN, f.errs, cols, f.key)
	for _, m := range ms {
		m.Timestamp = f.ts
		for j, i := range mp.headerColumns {
			if v[i] != nil {
				m.Headers = append(m.Headers, envelope.Header{Key: b.cfg.HeaderColumns[j], Value: string(v[i])})
			}
		}
	}
	return ms, err
}

// RuleRow returns what the routing rules see of one row of rel, read as
// Rows reads it, without running them: `outboxrelay rules test
// --from-table` decides on it. The error is why the relay dead-letters the
// row before any rule runs (a required column that is empty, say), or the
// relation's own (a table that is not relayed, a mapped column it lacks).
func (b *Builder) RuleRow(ctx context.Context, rel *cdc.Relation, ins *cdc.Insert, tx cdc.Begin) (*rules.Row, error) {
	mp, err := b.mapping(ctx, rel)
	if err != nil {
		return nil, err
	}
	if mp.skip {
		return nil, fmt.Errorf("table %s is not relayed", rel.QualifiedName())
	}
	b.tx = tx
	f := b.fields(mp, ins)
	row := ruleRow(&f.em, mp.table, nil, f.key)
	row.Columns = map[string]string{}
	if b.cfg.rules != nil {
		row.Columns = columns(mp, ins.Values)
	}
	return row, errors.Join(f.errs...)
}

// ruleRow is what the rules see of em; cols, when not nil, makes its
// columns the first time a rule reads them.
func ruleRow(em *envelope.Message, table string, cols func() map[string]string, key string) *rules.Row {
	row := new(rules.Row)
	fillRuleRow(row, em, table, cols, key)
	return row
}

// fillRuleRow sets row to what the rules see of em, as ruleRow makes it.
func fillRuleRow(row *rules.Row, em *envelope.Message, table string, cols func() map[string]string, key string) {
	*row = rules.Row{
		MessageID: em.MessageID, AggregateType: em.AggregateType, AggregateID: em.AggregateID, EventType: em.EventType,
		Table: table, SchemaVersion: em.SchemaVersion, Payload: em.Payload, ReadColumns: cols, Key: key,
	}
	// No headers read as the empty map; a row without any has no map.
	if hs, err := envelope.ParseHeaders(em.Headers); err == nil && len(hs) > 0 {
		row.Headers = make(map[string]string, len(hs))
		for _, h := range hs {
			row.Headers[h.Key] = h.Value
		}
	}
	if em.PayloadFormat != envelope.PayloadJSON {
		row.Payload = nil // payload reads null: only JSON has fields
	} else {
		row.PayloadValid = true // PostgreSQL or ParseEmitted checked it
	}
}

// route finishes em into its messages as the routing rules decide: one
// message without rules, or for a row that is invalid already (it is
// dead-lettered as it is); else one per route the row takes, each with
// that route's destination, key, headers and format, or one filtered
// message for a row unmatched: drop drops. A rule that fails on the row
// dead-letters it with the rule's error. key is the row's record key.
func (b *Builder) route(em *envelope.Message, table, traceparent string, lsn cdc.LSN, errs []error, cols func() map[string]string, key string) ([]*Message, error) {
	if b.cfg.rulesErr != nil {
		errs = append(errs, b.cfg.rulesErr)
	}
	if b.cfg.rules == nil || len(errs) > 0 {
		m, err := b.finish(em, table, b.cfg.Format, traceparent, lsn, errs)
		m.Key = key
		b.one[0] = m
		return b.one[:1:1], err
	}
	fillRuleRow(&b.row, em, table, cols, key)
	d := &b.decision
	err := b.cfg.rules.DecideTo(d, &b.row)
	b.row = rules.Row{} // hold nothing of the row
	if err != nil {
		m, ferr := b.finish(em, table, b.cfg.Format, traceparent, lsn, nil)
		m.Key = key
		return []*Message{m}, errors.Join(err, ferr)
	}
	if d.Dropped {
		m := &Message{ID: em.MessageID, AggregateType: em.AggregateType, AggregateID: em.AggregateID, EventType: em.EventType,
			Key: key, Table: table, LSN: lsn, CommitLSN: b.tx.FinalLSN, CommitTime: b.tx.CommitTime, Filtered: FilteredUnmatched}
		return []*Message{m}, nil
	}
	transformed := d.Payload != nil
	if transformed {
		em.Payload = d.Payload
	}
	out := b.one[:0:1] // one route, the common case, allocates no slice
	var routeErrs []error
	for _, r := range d.Matches {
		e := *em
		format := cmp.Or(Format(r.Format), b.cfg.Format)
		var errs []error
		if e.Payload == nil && format != FormatDebezium {
			errs = append(errs, fmt.Errorf("column %s is null", b.cfg.Columns.Payload))
		}
		m, err := b.finishAs(&e, table, format, traceparent, lsn, errs, transformed)
		m.Route, m.RouteDestination, m.Key, m.Sink = r.Route, r.Destination, r.Key, r.Sink
		for _, h := range r.Headers {
			m.Headers = append(m.Headers, envelope.Header{Key: h.Name, Value: h.Value})
		}
		out = append(out, m)
		if err != nil {
			routeErrs = append(routeErrs, err)
		}
	}
	// One error for the row: every route's message shares it.
	return out, errors.Join(routeErrs...)
}

func (b *Builder) buildEmitted(lm *cdc.LogicalMessage) ([]*Message, error) {
	e, err := envelope.ParseEmitted(lm.Content)
	if err != nil {
		// Keep the content so the dead letter shows what was sent.
		em := envelope.Message{MessageID: e.ID, Payload: lm.Content, PayloadFormat: envelope.PayloadText, OccurredAt: b.tx.CommitTime}
		m, err := b.finish(&em, "", b.cfg.Format, "", lm.LSN, []error{err})
		return []*Message{m}, err
	}
	em := envelope.Message{
		MessageID: e.ID, AggregateType: e.AggregateType, AggregateID: e.AggregateID, EventType: e.EventType,
		SchemaVersion: e.SchemaVersion, Headers: e.Headers, Payload: e.Payload, PayloadFormat: envelope.PayloadJSON,
		OccurredAt: b.tx.CommitTime,
	}
	return b.route(&em, "", e.Traceparent, lm.LSN, nil, nil, em.AggregateID)
}

func (b *Builder) finish(em *envelope.Message, table string, format Format, traceparent string, lsn cdc.LSN, errs []error) (*Message, error) {
	return b.finishAs(em, table, format, traceparent, lsn, errs, false)
}

// finishAs is finish for a message whose payload transform.payload made
// (transformed): that payload is what the schema folder checks, and its
// error says the transform made it.
func (b *Builder) finishAs(em *envelope.Message, table string, format Format, traceparent string, lsn cdc.LSN, errs []error, transformed bool) (*Message, error) {
	tombstone := format == FormatDebezium && em.Payload == nil
	errs = append(errs, b.checkUTF8(em, table)...)
	if len(errs) == 0 && b.cfg.Validator != nil && !tombstone {
		if err := b.cfg.Validator.Validate(em); err != nil {
			if transformed {
				err = fmt.Errorf("the payload transform.payload made: %w", err)
			}
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
		Key: em.AggregateID, Table: table, Traceparent: em.Traceparent, Format: format, Tombstone: tombstone,
		CommitTime: b.tx.CommitTime, LSN: lsn, CommitLSN: b.tx.FinalLSN,
	}
	m.Headers, m.Tracestate = b.brokerHeaders(m, headers, traceparent)
	b.startSpan(m, em, traceparent != "" && m.Traceparent == traceparent)
	size := em.SizeHint() + len(b.cfg.CloudEventsSource)
	switch format {
	case FormatCloudEvents:
		m.buf = getBuffer(size)
		m.Envelope = em.AppendCloudEvent(*m.buf, b.cfg.CloudEventsSource)
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
		m.buf = getBuffer(size)
		m.Envelope = append(*m.buf, d.Value...)
		m.ContentType = d.ContentType
	default:
		m.buf = getBuffer(size)
		m.Envelope = em.AppendJSON(*m.buf)
	}
	return m, errors.Join(errs...)
}

// checkUTF8 returns why em's body would not be UTF-8: its JSON payload or
// its headers object holds bytes that are not, which a SQL_ASCII database
// stores as they came. The body embeds both verbatim, and ParseHeaders
// reads such a header as U+FFFD, so the message would carry one value in
// its broker header and another in its body. Such a message is
// dead-lettered with the reason rather than repaired (docs/sinks.md). A
// table-less message (table "") names its fields, not columns.
func (b *Builder) checkUTF8(em *envelope.Message, table string) []error {
	payloadOK := em.PayloadFormat != envelope.PayloadJSON || utf8.Valid(em.Payload)
	if payloadOK && utf8.Valid(em.Headers) {
		return nil // the common case: no name formatted, nothing allocated
	}
	payload, headers := "column "+b.cfg.Columns.Payload, "column "+b.cfg.Columns.Headers
	if table == "" {
		payload, headers = "the payload", "the headers"
	}
	var errs []error
	if !payloadOK {
		errs = append(errs, invalidUTF8(payload, em.Payload))
	}
	if err := invalidUTF8(headers, em.Headers); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// invalidUTF8 returns an error naming what and the first byte of v that is
// not UTF-8, or nil when v is UTF-8. It does not quote v, which may be a
// whole payload.
func invalidUTF8(what string, v []byte) error {
	if utf8.Valid(v) {
		return nil
	}
	i := 0
	for i < len(v) {
		r, n := utf8.DecodeRune(v[i:])
		if r == utf8.RuneError && n == 1 {
			break
		}
		i += n
	}
	return fmt.Errorf("%s is not valid UTF-8 (byte 0x%02X at offset %d); write the row's values as UTF-8 (a SQL_ASCII database stores any bytes)", what, v[i], i)
}

func newString(b []byte) string { return string(b) }

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
// once the sink is done with it (publisher.complete), in the same box
// (*[]byte) it came out in: boxing it anew allocated once per message.
var buffers sync.Pool

const maxPooledBuffer = 64 << 10

// getBuffer returns a box holding an empty buffer of at least size bytes.
func getBuffer(size int) *[]byte {
	if bp, ok := buffers.Get().(*[]byte); ok && cap(*bp) >= size {
		*bp = (*bp)[:0]
		return bp
	}
	b := make([]byte, 0, max(size, 2048))
	return &b
}

// putBuffer returns b, the buffer last taken out of bp (or grown from it),
// to the pool in bp.
func putBuffer(bp *[]byte, b []byte) {
	if cap(b) > maxPooledBuffer {
		return
	}
	*bp = b[:0]
	buffers.Put(bp)
}
