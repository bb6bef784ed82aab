// Package outbox writes events for outboxrelay from a service, inside the
// service's own database transaction.
//
// Write inserts a row into the outbox table (described in the outboxrelay
// README, "The outbox table and the envelope"), WriteBatch inserts many
// rows in one statement, and Emit writes a table-less outbox message with
// pg_logical_emit_message. The event becomes
// visible to the relay exactly when the caller's transaction commits, and
// never if it rolls back: that is the whole point of an outbox.
//
//	id, err := outbox.Write(ctx, tx, outbox.Event{ // tx is a *sql.Tx
//		AggregateType: "order", AggregateID: "42", EventType: "order.created",
//		Payload: order,
//	})
//
// With pgx, wrap the transaction: outbox.Write(ctx, outboxpgx.Tx(tx), ev).
//
// Every event gets a UUIDv7 message id, generated here rather than by the
// database so that the caller knows it before commit (for logs, for
// idempotency keys) and so that ids from one process sort in the order they
// were made. When ctx carries a valid OpenTelemetry span context, its W3C
// traceparent is stored with the event, and consumers continue that trace.
//
// Events are validated before anything is sent: an invalid event returns an
// error wrapping ErrInvalidEvent, and the transaction is left untouched and
// usable. A database error, on the other hand, aborts a PostgreSQL
// transaction, as any failed statement does.
//
// With the Schemas option, an event's payload must also match the JSON
// Schema of its event type and version, the same folder the relay checks
// (relay.schemas.dir):
//
//	set, err := schema.Load("schemas") // github.com/outboxrelay/outboxrelay/outbox/schema
//	w, err := outbox.New(outbox.Schemas(set))
//
// A payload that does not match is refused like any invalid event, before
// any SQL runs.
//
// The package depends only on the standard library, github.com/google/uuid
// and the OpenTelemetry trace API; it pulls in no database driver, and no
// schema validator unless the caller passes one.
package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"
)

// Execer runs one SQL statement with $1, $2, ... parameters. *sql.Tx,
// *sql.Conn and *sql.DB satisfy it; outboxpgx.Tx adapts pgx.
//
// Pass a transaction: an event written through *sql.DB or a pool commits on
// its own, independently of any business change.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// ErrInvalidEvent is wrapped by every error about an event that was refused
// before anything was sent to the database.
var ErrInvalidEvent = errors.New("invalid outbox event")

// Event is one outbox event.
type Event struct {
	// AggregateType routes the event: it becomes the Kafka topic or AMQP
	// routing key (through the relay's templates). Required.
	AggregateType string
	// AggregateID is the Kafka record key: events of one aggregate keep their
	// commit order. Required.
	AggregateID string
	// EventType names what happened, such as "order.created". Required.
	EventType string
	// Payload is the event body. json.RawMessage, []byte and string are taken
	// as JSON text and must be valid JSON; any other value is encoded with
	// encoding/json. A nil Payload is refused, so that a forgotten payload
	// is caught here; write json.RawMessage("null") for an event without one.
	Payload any
	// Headers become broker headers (Kafka record headers, AMQP headers).
	// Optional; ignored when the table has no headers column.
	Headers map[string]string
	// SchemaVersion is the version of the payload's schema; 0 means 1.
	// Ignored when the table has no schema_version column.
	SchemaVersion int
}

// Columns names the outbox table's columns. ID, AggregateType, AggregateID,
// EventType and Payload are required; an empty optional name means the
// table has no such column, and that part of the event is not stored.
// The payload column must be json, jsonb or text.
type Columns struct {
	ID            string
	AggregateType string
	AggregateID   string
	EventType     string
	Payload       string
	Headers       string
	Traceparent   string
	SchemaVersion string
}

// DefaultColumns are the columns of the table `outboxrelay migrate` creates.
func DefaultColumns() Columns {
	return Columns{
		ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id", EventType: "event_type",
		Payload: "payload", Headers: "headers", Traceparent: "traceparent", SchemaVersion: "schema_version",
	}
}

// DebeziumColumns are the columns of a Debezium outbox table (id,
// aggregatetype, aggregateid, type, payload, tracingspancontext). Such a
// table has no headers and no schema version.
func DebeziumColumns() Columns {
	return Columns{
		ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid", EventType: "type",
		Payload: "payload", Traceparent: "tracingspancontext",
	}
}

// Defaults of the options.
const (
	DefaultTable         = "public.outbox"
	DefaultDebeziumTable = "public.outboxevent"
	DefaultMessagePrefix = "outboxrelay"
)

// maxParams is PostgreSQL's limit on the parameters of one statement.
const maxParams = math.MaxUint16

type config struct {
	schemas           Validator
	table             string
	columns           *Columns
	debezium          bool
	deleteAfterInsert bool
	prefix            string
}

// Option configures a Writer.
type Option func(*config)

// TableName sets the outbox table, "schema.table" or "table" (in schema
// public), as the relay's postgres.tables names it. Default public.outbox,
// or public.outboxevent with Debezium. Names are used exactly as given
// (quoted), so they are case-sensitive.
func TableName(name string) Option { return func(c *config) { c.table = name } }

// ColumnNames maps the event onto the table's columns (the relay's
// postgres.columns must name the same ones). Default DefaultColumns, or
// DebeziumColumns with Debezium.
func ColumnNames(cols Columns) Option { return func(c *config) { c.columns = &cols } }

// Debezium writes to a Debezium-shaped outbox table: DebeziumColumns, table
// public.outboxevent unless TableName says otherwise, and the trace context
// written as Debezium writes its tracingspancontext column (Java properties
// text, "traceparent=00-...").
func Debezium() Option { return func(c *config) { c.debezium = true } }

// DeleteAfterInsert deletes each row again, in the same transaction, right
// after inserting it, so that the outbox table stays empty and needs no
// cleanup. The relay still publishes the row: it reads the insert from the
// WAL and ignores deletes. It costs a second statement per Write and
// WriteBatch call. Emit writes no row and ignores it.
func DeleteAfterInsert() Option { return func(c *config) { c.deleteAfterInsert = true } }

// MessagePrefix sets the logical decoding message prefix Emit uses; it must
// equal the relay's postgres.message_prefix. Default "outboxrelay".
func MessagePrefix(prefix string) Option { return func(c *config) { c.prefix = prefix } }

// Validator checks a payload, JSON text, against the schema of its event
// type and schema version. *schema.Set is one. It must be safe for
// concurrent use.
type Validator interface {
	Validate(eventType string, schemaVersion int, payload []byte) error
}

// Schemas makes the Writer refuse an event whose payload v rejects (one
// that does not match its schema, or has none, as v decides), with an
// error wrapping ErrInvalidEvent and v's error, before any SQL runs.
func Schemas(v Validator) Option { return func(c *config) { c.schemas = v } }

// Writer writes outbox events. It is immutable and safe for concurrent use.
type Writer struct {
	table            string // quoted
	name             string // as configured, for errors
	cols             Columns
	insertPrefix     string // INSERT INTO t (cols) VALUES
	rowParams        int
	deleteAfter      bool
	debeziumTracing  bool
	prefix           string
	deletePrefix     string // DELETE FROM t WHERE id IN (
	maxRowsPerInsert int
	schemas          Validator
}

// New returns a Writer. It fails when an option is invalid.
func New(opts ...Option) (*Writer, error) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.table == "" {
		c.table = DefaultTable
		if c.debezium {
			c.table = DefaultDebeziumTable
		}
	}
	cols := DefaultColumns()
	if c.debezium {
		cols = DebeziumColumns()
	}
	if c.columns != nil {
		cols = *c.columns
	}
	if c.prefix == "" {
		c.prefix = DefaultMessagePrefix
	}
	table, err := quoteTable(c.table)
	if err != nil {
		return nil, err
	}
	for name, v := range map[string]string{"ID": cols.ID, "AggregateType": cols.AggregateType,
		"AggregateID": cols.AggregateID, "EventType": cols.EventType, "Payload": cols.Payload} {
		if v == "" {
			return nil, fmt.Errorf("outbox: column name %s is required", name)
		}
	}
	w := &Writer{
		table: table, name: c.table, cols: cols, deleteAfter: c.deleteAfterInsert,
		debeziumTracing: c.debezium, prefix: c.prefix, schemas: c.schemas,
	}
	var names []string
	for _, n := range []string{cols.ID, cols.AggregateType, cols.AggregateID, cols.EventType, cols.Payload,
		cols.Headers, cols.Traceparent, cols.SchemaVersion} {
		if n != "" {
			names = append(names, quoteIdent(n))
		}
	}
	w.rowParams = len(names)
	w.maxRowsPerInsert = maxParams / w.rowParams
	w.insertPrefix = "INSERT INTO " + table + " (" + strings.Join(names, ", ") + ") VALUES "
	w.deletePrefix = "DELETE FROM " + table + " WHERE " + quoteIdent(cols.ID) + " IN ("
	return w, nil
}

var defaultWriter, _ = New()

// Write writes e to the default outbox table public.outbox in the caller's
// transaction and returns its message id. See Writer.Write.
func Write(ctx context.Context, tx Execer, e Event) (uuid.UUID, error) {
	return defaultWriter.Write(ctx, tx, e)
}

// WriteBatch writes events to public.outbox. See Writer.WriteBatch.
func WriteBatch(ctx context.Context, tx Execer, events []Event) ([]uuid.UUID, error) {
	return defaultWriter.WriteBatch(ctx, tx, events)
}

// Emit writes e as a table-less outbox message. See Writer.Emit.
func Emit(ctx context.Context, tx Execer, e Event) (uuid.UUID, error) {
	return defaultWriter.Emit(ctx, tx, e)
}

// Write inserts e into the outbox table in the caller's transaction tx and
// returns its message id, a new UUIDv7. It is one statement (two with
// DeleteAfterInsert). The relay publishes the event once tx commits, and
// never if tx rolls back.
//
// An invalid event returns an error wrapping ErrInvalidEvent and sends
// nothing. Cancelling ctx cancels the statement as the driver does, which
// in PostgreSQL aborts the transaction.
func (w *Writer) Write(ctx context.Context, tx Execer, e Event) (uuid.UUID, error) {
	ids, err := w.WriteBatch(ctx, tx, []Event{e})
	if err != nil {
		return uuid.Nil, err
	}
	return ids[0], nil
}

// WriteBatch inserts events, in order, in one INSERT statement (one more
// per 65535 parameters, that is about 8000 events; and the deletes with
// DeleteAfterInsert), in the caller's transaction tx. It returns their
// message ids in the same order; they increase. Events of one aggregate
// are published in slice order.
//
// All events are validated first: if one is invalid, nothing is sent and
// the error, wrapping ErrInvalidEvent, names its index. An empty slice
// sends nothing.
func (w *Writer) WriteBatch(ctx context.Context, tx Execer, events []Event) ([]uuid.UUID, error) {
	if len(events) == 0 {
		return nil, nil
	}
	tp := w.traceColumn(traceparent(ctx))
	args := make([]any, 0, len(events)*w.rowParams)
	ids := make([]uuid.UUID, len(events))
	for i := range events {
		v, err := w.validate(&events[i])
		if err != nil {
			if len(events) > 1 {
				return nil, fmt.Errorf("outbox: event %d: %w", i, err)
			}
			return nil, fmt.Errorf("outbox: %w", err)
		}
		if ids[i], err = uuid.NewV7(); err != nil {
			return nil, fmt.Errorf("outbox: generate message id: %w", err)
		}
		args = append(args, ids[i].String(), events[i].AggregateType, events[i].AggregateID, events[i].EventType, string(v.payload))
		if w.cols.Headers != "" {
			args = append(args, string(v.headers))
		}
		if w.cols.Traceparent != "" {
			args = append(args, tp)
		}
		if w.cols.SchemaVersion != "" {
			args = append(args, v.schemaVersion)
		}
	}
	for start := 0; start < len(events); start += w.maxRowsPerInsert {
		end := min(start+w.maxRowsPerInsert, len(events))
		if _, err := tx.ExecContext(ctx, w.insertSQL(end-start), args[start*w.rowParams:end*w.rowParams]...); err != nil {
			return nil, fmt.Errorf("outbox: insert into %s: %w", w.name, err)
		}
	}
	if w.deleteAfter {
		for start := 0; start < len(ids); start += maxParams {
			end := min(start+maxParams, len(ids))
			if err := w.delete(ctx, tx, ids[start:end]); err != nil {
				return nil, err
			}
		}
	}
	return ids, nil
}

func (w *Writer) insertSQL(rows int) string {
	var b strings.Builder
	b.Grow(len(w.insertPrefix) + rows*(w.rowParams*8+4))
	b.WriteString(w.insertPrefix)
	n := 1
	for r := range rows {
		if r > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for c := range w.rowParams {
			if c > 0 {
				b.WriteString(", ")
			}
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			n++
		}
		b.WriteByte(')')
	}
	return b.String()
}

func (w *Writer) delete(ctx context.Context, tx Execer, ids []uuid.UUID) error {
	var b strings.Builder
	b.WriteString(w.deletePrefix)
	args := make([]any, len(ids))
	for i, id := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('$')
		b.WriteString(strconv.Itoa(i + 1))
		args[i] = id.String()
	}
	b.WriteByte(')')
	if _, err := tx.ExecContext(ctx, b.String(), args...); err != nil {
		return fmt.Errorf("outbox: delete from %s after insert: %w", w.name, err)
	}
	return nil
}

// emitted is the content of a table-less message (the outboxrelay README,
// "Table-less outbox"); its keys are the default column names.
type emitted struct {
	ID            string          `json:"id"`
	AggregateType string          `json:"aggregate_type"`
	AggregateID   string          `json:"aggregate_id"`
	EventType     string          `json:"event_type"`
	Payload       json.RawMessage `json:"payload"`
	Headers       json.RawMessage `json:"headers,omitempty"`
	Traceparent   string          `json:"traceparent,omitempty"`
	SchemaVersion int             `json:"schema_version"`
}

// Emit writes e as a transactional logical decoding message,
// pg_logical_emit_message(true, prefix, content), in the caller's
// transaction tx and returns its message id, a new UUIDv7. No table is
// involved: the message exists only in the WAL, and the relay publishes it
// once tx commits, in commit order with the transaction's outbox rows, and
// never if tx rolls back. The column options do not apply; Headers and
// SchemaVersion are always carried.
//
// The database needs wal_level=logical. An invalid event returns an error
// wrapping ErrInvalidEvent and sends nothing.
func (w *Writer) Emit(ctx context.Context, tx Execer, e Event) (uuid.UUID, error) {
	v, err := w.validate(&e)
	if err != nil {
		return uuid.Nil, fmt.Errorf("outbox: %w", err)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.Nil, fmt.Errorf("outbox: generate message id: %w", err)
	}
	m := emitted{
		ID: id.String(), AggregateType: e.AggregateType, AggregateID: e.AggregateID, EventType: e.EventType,
		Payload: v.payload, Traceparent: traceparent(ctx), SchemaVersion: v.schemaVersion,
	}
	if len(e.Headers) > 0 {
		m.Headers = v.headers
	}
	content, err := marshal(m)
	if err != nil {
		return uuid.Nil, fmt.Errorf("outbox: encode message: %w", err)
	}
	if _, err := tx.ExecContext(ctx, "SELECT pg_logical_emit_message(true, $1::text, $2::text)", w.prefix, string(content)); err != nil {
		return uuid.Nil, fmt.Errorf("outbox: emit message: %w", err)
	}
	return id, nil
}

// valid is what validate derived from an event.
type valid struct {
	payload       []byte // compact-enough JSON text
	headers       []byte // JSON object
	schemaVersion int
}

// validate checks e against what the database and the relay accept, and
// its payload against its schema, so that an event is refused before it can
// abort the caller's transaction.
func (w *Writer) validate(e *Event) (valid, error) {
	var v valid
	for _, f := range []struct{ name, value string }{
		{"aggregate type", e.AggregateType}, {"aggregate id", e.AggregateID}, {"event type", e.EventType},
	} {
		if f.value == "" {
			return v, fmt.Errorf("%w: %s is empty", ErrInvalidEvent, f.name)
		}
		if !validText(f.value) {
			return v, fmt.Errorf("%w: %s %q is not valid UTF-8 text without NUL bytes", ErrInvalidEvent, f.name, f.value)
		}
	}
	switch {
	case e.SchemaVersion == 0:
		v.schemaVersion = 1
	case e.SchemaVersion < 0 || e.SchemaVersion > math.MaxInt32:
		return v, fmt.Errorf("%w: schema version %d is not between 1 and %d", ErrInvalidEvent, e.SchemaVersion, math.MaxInt32)
	default:
		v.schemaVersion = e.SchemaVersion
	}
	var err error
	if v.payload, err = payloadJSON(e.Payload); err != nil {
		return v, fmt.Errorf("%w: payload %w", ErrInvalidEvent, err)
	}
	if w.schemas != nil {
		if err := w.schemas.Validate(e.EventType, v.schemaVersion, v.payload); err != nil {
			return v, fmt.Errorf("%w: %w", ErrInvalidEvent, err)
		}
	}
	for k, val := range e.Headers {
		if !validText(k) || !validText(val) {
			return v, fmt.Errorf("%w: header %q is not valid UTF-8 text without NUL bytes", ErrInvalidEvent, k)
		}
	}
	if k := firstReserved(e.Headers); k != "" {
		return v, fmt.Errorf("%w: header %q is a name the relay sets itself (it would drop the header); rename it, for example to x-%s", ErrInvalidEvent, k, k)
	}
	if len(e.Headers) == 0 {
		v.headers = []byte("{}")
	} else if v.headers, err = marshal(e.Headers); err != nil {
		return v, fmt.Errorf("%w: headers: %w", ErrInvalidEvent, err)
	}
	return v, nil
}

func payloadJSON(p any) ([]byte, error) {
	var b []byte
	switch p := p.(type) {
	case nil:
		return nil, errors.New(`is nil; use json.RawMessage("null") for an event without a payload`)
	case json.RawMessage:
		b = p
	case []byte:
		b = p
	case string:
		b = []byte(p)
	default:
		if rv := reflect.ValueOf(p); rv.Kind() == reflect.Pointer && rv.IsNil() {
			return nil, errors.New(`is a nil pointer; use json.RawMessage("null") for an event without a payload`)
		}
		var err error
		if b, err = marshal(p); err != nil {
			return nil, fmt.Errorf("cannot be encoded as JSON: %w", err)
		}
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, errors.New("is empty, want JSON text")
	}
	if !json.Valid(b) {
		var x any
		err := json.Unmarshal(b, &x)
		return nil, fmt.Errorf("is not valid JSON: %w", err)
	}
	if !utf8.Valid(b) {
		return nil, errors.New("is not valid UTF-8")
	}
	if hasNulEscape(b) {
		return nil, errors.New(`contains \u0000, which PostgreSQL jsonb cannot store`)
	}
	return b, nil
}

// validText reports whether PostgreSQL can store s as text (and as a jsonb
// string): valid UTF-8 without NUL.
func validText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// hasNulEscape reports whether valid JSON text b has a \u0000 escape.
// Backslashes occur only inside strings in valid JSON, so every one starts
// an escape.
func hasNulEscape(b []byte) bool {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		if b[i+1] == 'u' && string(b[i+2:i+6]) == "0000" {
			return true
		}
		i++
	}
	return false
}

// marshal is json.Marshal without HTML escaping and without the trailing
// newline, so that payloads keep their text.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// traceparent returns the W3C traceparent of the span context in ctx, or
// "" when there is no valid one.
func traceparent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// traceColumn is the value of the traceparent column: NULL without a
// trace, Java properties text in a Debezium tracingspancontext column.
func (w *Writer) traceColumn(tp string) any {
	switch {
	case tp == "":
		return nil
	case w.debeziumTracing:
		return "traceparent=" + tp
	default:
		return tp
	}
}

func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// quoteTable quotes "schema.table" or "table" (in public), as the relay
// names tables.
func quoteTable(t string) (string, error) {
	schema, name, ok := strings.Cut(t, ".")
	if !ok {
		schema, name = "public", t
	}
	if schema == "" || name == "" || strings.Contains(name, ".") || strings.IndexByte(t, 0) >= 0 {
		return "", fmt.Errorf("outbox: table %q must be schema.table or table", t)
	}
	return quoteIdent(schema) + "." + quoteIdent(name), nil
}

// reservedNames and reservedPrefixes are the header names the relay owns,
// as envelope.Reserved defines them, but tracestate (see ReservedHeader);
// this package depends on no relay package, and a test checks that the two
// rules agree.
var (
	reservedNames    = []string{"id", "message_id", "event_type", "aggregate_id", "aggregate_type", "traceparent", "content-type", "content_type"}
	reservedPrefixes = []string{"ce_", "ce-", "cloudevents:", "cloudevents_", "x-outboxrelay-"}
)

// ReservedHeader reports whether a header named name is one the relay sets
// itself: a row header with such a name is dropped by the relay, so Write,
// WriteBatch and Emit refuse it: id, message_id, event_type, aggregate_id,
// aggregate_type, traceparent, content-type, content_type, and names
// starting with ce_, ce-, cloudEvents: or cloudEvents_, in any case. The
// traceparent travels in its own column. A tracestate header is allowed:
// the relay sends it with the row's traceparent (and drops it when the
// row has none).
func ReservedHeader(name string) bool {
	for _, r := range reservedNames {
		if strings.EqualFold(name, r) {
			return true
		}
	}
	for _, p := range reservedPrefixes {
		if len(name) >= len(p) && strings.EqualFold(name[:len(p)], p) {
			return true
		}
	}
	return false
}

// firstReserved returns the reserved header name of hs that sorts first,
// so that the error names the same header every time, or "".
func firstReserved(hs map[string]string) string {
	var first string
	for k := range hs {
		if ReservedHeader(k) && (first == "" || k < first) {
			first = k
		}
	}
	return first
}
