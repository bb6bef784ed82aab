package cdc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// LSN is a PostgreSQL WAL position.
type LSN = pglogrepl.LSN

// Type OIDs the relay cares about when it decides how to read a column.
const (
	OIDBytea       = 17
	OIDText        = 25
	OIDJSON        = 114
	OIDVarchar     = 1043
	OIDTimestamp   = 1114
	OIDTimestamptz = 1184
	OIDUUID        = 2950
	OIDJSONB       = 3802
)

// Column describes one column of a relation as pgoutput announced it.
type Column struct {
	Name    string
	TypeOID uint32
	// Key reports whether the column is part of the replica identity.
	Key bool
}

// Relation is the shape of a published table, sent by pgoutput before the
// first change of a table in a session and again whenever the table changes.
// A Relation is immutable once decoded: a new announcement for the same table
// produces a new *Relation, so callers may cache derived data per pointer.
type Relation struct {
	ID        uint32
	Namespace string
	Name      string
	Columns   []Column
}

// QualifiedName returns schema.name.
func (r *Relation) QualifiedName() string { return r.Namespace + "." + r.Name }

// Begin opens a transaction. pgoutput sends a transaction only once it has
// committed (the relay does not ask for streaming), so FinalLSN and
// CommitTime are already known here.
type Begin struct {
	FinalLSN   LSN
	CommitTime time.Time
	XID        uint32
}

// Commit closes a transaction. EndLSN is the position to confirm once every
// message of the transaction is acknowledged.
type Commit struct {
	CommitLSN  LSN
	EndLSN     LSN
	CommitTime time.Time
}

// Insert is one inserted row.
type Insert struct {
	Relation *Relation
	// Values holds one entry per column in Relation.Columns, as PostgreSQL's
	// text output; nil is SQL NULL. The slices alias the received WAL data and
	// are valid only during the Handler call.
	Values [][]byte
	// LSN is the WAL position of the insert.
	LSN LSN
}

// LogicalMessage is a message written with pg_logical_emit_message.
type LogicalMessage struct {
	Transactional bool
	LSN           LSN
	Prefix        string
	// Content aliases the received WAL data; valid only during the Handler call.
	Content []byte
}

// ErrMalformed is returned (wrapped) for pgoutput data the decoder cannot parse.
var ErrMalformed = errors.New("malformed pgoutput message")

// Decoder turns pgoutput protocol version 1 messages into values. It keeps
// the relations announced so far. A Decoder is not safe for concurrent use.
type Decoder struct {
	relations map[uint32]*Relation
	values    [][]byte
}

// NewDecoder returns a Decoder with no known relations.
func NewDecoder() *Decoder {
	return &Decoder{relations: make(map[uint32]*Relation)}
}

// Kind identifies a decoded pgoutput message.
type Kind byte

// The pgoutput message kinds the decoder reports.
const (
	KindBegin    Kind = 'B'
	KindCommit   Kind = 'C'
	KindRelation Kind = 'R'
	KindInsert   Kind = 'I'
	KindMessage  Kind = 'M'
	// KindIgnored covers messages the relay has no use for: updates, deletes,
	// truncates, types and origins.
	KindIgnored Kind = 0
)

// Event is the result of decoding one message. Only the field named by Kind
// is set. Event and the slices it holds are reused by the next Decode call.
type Event struct {
	Kind     Kind
	Begin    Begin
	Commit   Commit
	Relation *Relation
	Insert   Insert
	Message  LogicalMessage
}

// Decode decodes one pgoutput message. walStart is the WAL position the
// server gave for the message (XLogData.WALStart). Decode never panics on
// bad input; it returns an error wrapping ErrMalformed.
func (d *Decoder) Decode(data []byte, walStart LSN, ev *Event) error {
	if len(data) == 0 {
		return fmt.Errorf("%w: empty", ErrMalformed)
	}
	r := reader{buf: data[1:]}
	*ev = Event{Kind: Kind(data[0])}
	switch data[0] {
	case 'B':
		ev.Begin.FinalLSN = LSN(r.u64())
		ev.Begin.CommitTime = pgTime(int64(r.u64()))
		ev.Begin.XID = r.u32()
	case 'C':
		r.u8() // flags, unused
		ev.Commit.CommitLSN = LSN(r.u64())
		ev.Commit.EndLSN = LSN(r.u64())
		ev.Commit.CommitTime = pgTime(int64(r.u64()))
	case 'R':
		rel := &Relation{ID: r.u32(), Namespace: r.str(), Name: r.str()}
		r.u8() // replica identity
		n := int(r.u16())
		if r.err == nil && n > len(r.buf) {
			r.err = fmt.Errorf("%w: relation with %d columns in %d bytes", ErrMalformed, n, len(r.buf))
		}
		if r.err == nil {
			rel.Columns = make([]Column, n)
			for i := range rel.Columns {
				flags := r.u8()
				rel.Columns[i] = Column{Key: flags&1 != 0, Name: r.str(), TypeOID: r.u32()}
				r.u32() // type modifier
			}
		}
		if r.err == nil {
			d.relations[rel.ID] = rel
			ev.Relation = rel
		}
	case 'I':
		id := r.u32()
		if r.err != nil {
			break
		}
		rel, ok := d.relations[id]
		if !ok {
			return fmt.Errorf("%w: insert for relation %d before its relation message", ErrMalformed, id)
		}
		if tag := r.u8(); r.err == nil && tag != 'N' {
			return fmt.Errorf("%w: insert tuple tag %q", ErrMalformed, tag)
		}
		vals, err := d.tuple(&r, len(rel.Columns))
		if err != nil {
			return err
		}
		ev.Insert = Insert{Relation: rel, Values: vals, LSN: walStart}
	case 'M':
		flags := r.u8()
		ev.Message.Transactional = flags&1 != 0
		ev.Message.LSN = LSN(r.u64())
		ev.Message.Prefix = r.str()
		n := r.u32()
		ev.Message.Content = r.bytes(int(n))
	case 'U', 'D', 'T', 'Y', 'O':
		ev.Kind = KindIgnored
	default:
		return fmt.Errorf("%w: unknown message type %q", ErrMalformed, data[0])
	}
	if r.err != nil {
		return fmt.Errorf("decode %q: %w", data[0], r.err)
	}
	return nil
}

func (d *Decoder) tuple(r *reader, want int) ([][]byte, error) {
	n := int(r.u16())
	if r.err != nil {
		return nil, fmt.Errorf("decode tuple: %w", r.err)
	}
	if n != want {
		return nil, fmt.Errorf("%w: tuple has %d columns, relation has %d", ErrMalformed, n, want)
	}
	vals := d.values[:0]
	for i := 0; i < n; i++ {
		switch kind := r.u8(); kind {
		case 'n':
			vals = append(vals, nil)
		case 'u':
			// Unchanged TOAST values appear only in updates; an insert always
			// carries its full values. Treat it as absent rather than guess.
			vals = append(vals, nil)
		case 't', 'b':
			l := r.u32()
			if r.err == nil && int64(l) > int64(len(r.buf)) {
				return nil, fmt.Errorf("%w: column %d length %d exceeds message", ErrMalformed, i, l)
			}
			v := r.bytes(int(l))
			if v == nil {
				v = []byte{}
			}
			vals = append(vals, v)
		default:
			if r.err == nil {
				return nil, fmt.Errorf("%w: column %d kind %q", ErrMalformed, i, kind)
			}
		}
		if r.err != nil {
			return nil, fmt.Errorf("decode tuple column %d: %w", i, r.err)
		}
	}
	d.values = vals
	return vals, nil
}

// reader reads big-endian protocol fields, recording the first short read.
type reader struct {
	buf []byte
	err error
}

var errShort = fmt.Errorf("%w: message too short", ErrMalformed)

func (r *reader) need(n int) bool {
	if r.err != nil {
		return false
	}
	if n < 0 || len(r.buf) < n {
		r.err = errShort
		return false
	}
	return true
}

func (r *reader) u8() byte {
	if !r.need(1) {
		return 0
	}
	v := r.buf[0]
	r.buf = r.buf[1:]
	return v
}

func (r *reader) u16() uint16 {
	if !r.need(2) {
		return 0
	}
	v := binary.BigEndian.Uint16(r.buf)
	r.buf = r.buf[2:]
	return v
}

func (r *reader) u32() uint32 {
	if !r.need(4) {
		return 0
	}
	v := binary.BigEndian.Uint32(r.buf)
	r.buf = r.buf[4:]
	return v
}

func (r *reader) u64() uint64 {
	if !r.need(8) {
		return 0
	}
	v := binary.BigEndian.Uint64(r.buf)
	r.buf = r.buf[8:]
	return v
}

func (r *reader) bytes(n int) []byte {
	if !r.need(n) {
		return nil
	}
	v := r.buf[:n:n]
	r.buf = r.buf[n:]
	return v
}

// str reads a NUL-terminated string.
func (r *reader) str() string {
	if r.err != nil {
		return ""
	}
	for i, c := range r.buf {
		if c == 0 {
			s := string(r.buf[:i])
			r.buf = r.buf[i+1:]
			return s
		}
	}
	r.err = fmt.Errorf("%w: unterminated string", ErrMalformed)
	return ""
}

// pgEpochMicros is 2000-01-01, the zero of PostgreSQL timestamps, in Unix microseconds.
const pgEpochMicros = 946684800 * 1000000

func pgTime(micros int64) time.Time {
	return time.UnixMicro(micros + pgEpochMicros).UTC()
}
