package cdc

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

// msg builds pgoutput messages by hand, as the protocol documentation lays them out.
type msg []byte

func (m msg) u8(v byte) msg    { return append(m, v) }
func (m msg) u16(v uint16) msg { return binary.BigEndian.AppendUint16(m, v) }
func (m msg) u32(v uint32) msg { return binary.BigEndian.AppendUint32(m, v) }
func (m msg) u64(v uint64) msg { return binary.BigEndian.AppendUint64(m, v) }
func (m msg) str(s string) msg { return append(append(m, s...), 0) }
func (m msg) text(s string) msg {
	return append(m.u8('t').u32(uint32(len(s))), s...)
}

func pgMicros(t time.Time) uint64 { return uint64(t.UnixMicro() - pgEpochMicros) }

func relationMsg(id uint32) msg {
	m := msg{'R'}.u32(id).str("public").str("outbox").u8('d').u16(3)
	m = m.u8(1).str("id").u32(OIDUUID).u32(0xffffffff)
	m = m.u8(0).str("payload").u32(OIDJSONB).u32(0xffffffff)
	m = m.u8(0).str("traceparent").u32(OIDText).u32(0xffffffff)
	return m
}

func TestDecodeTransaction(t *testing.T) {
	commit := time.Date(2026, 11, 29, 8, 0, 0, 130001000, time.UTC)
	d := NewDecoder()
	var ev Event

	begin := msg{'B'}.u64(0x1A2B400).u64(pgMicros(commit)).u32(1234)
	if err := d.Decode(begin, 0x1A2B000, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Kind != KindBegin || ev.Begin.FinalLSN != 0x1A2B400 || ev.Begin.XID != 1234 || !ev.Begin.CommitTime.Equal(commit) {
		t.Fatalf("begin = %+v", ev.Begin)
	}

	if err := d.Decode(relationMsg(16384), 0, &ev); err != nil {
		t.Fatal(err)
	}
	rel := ev.Relation
	if ev.Kind != KindRelation || rel.QualifiedName() != "public.outbox" || len(rel.Columns) != 3 ||
		rel.Columns[0] != (Column{Name: "id", TypeOID: OIDUUID, Key: true}) || rel.Columns[1].TypeOID != OIDJSONB {
		t.Fatalf("relation = %+v", rel)
	}

	ins := msg{'I'}.u32(16384).u8('N').u16(3).text("0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a").text(`{"a": 1}`).u8('n')
	if err := d.Decode(ins, 0x1A2B3C4, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Kind != KindInsert || ev.Insert.Relation != rel || ev.Insert.LSN != 0x1A2B3C4 {
		t.Fatalf("insert = %+v", ev.Insert)
	}
	if got := ev.Insert.Values; string(got[0]) != "0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a" || string(got[1]) != `{"a": 1}` || got[2] != nil {
		t.Fatalf("values = %q", got)
	}

	empty := msg{'I'}.u32(16384).u8('N').u16(3).text("x").text("").u8('n')
	if err := d.Decode(empty, 0, &ev); err != nil {
		t.Fatal(err)
	}
	if v := ev.Insert.Values[1]; v == nil || len(v) != 0 {
		t.Fatalf("empty text value must be non-nil and empty, got %#v", v)
	}

	lm := msg{'M'}.u8(1).u64(0x1A2B3D0).str("outboxrelay").u32(5).u8('h').u8('e').u8('l').u8('l').u8('o')
	if err := d.Decode(lm, 0, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Kind != KindMessage || !ev.Message.Transactional || ev.Message.Prefix != "outboxrelay" || string(ev.Message.Content) != "hello" || ev.Message.LSN != 0x1A2B3D0 {
		t.Fatalf("message = %+v", ev.Message)
	}

	cm := msg{'C'}.u8(0).u64(0x1A2B400).u64(0x1A2B430).u64(pgMicros(commit))
	if err := d.Decode(cm, 0, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Kind != KindCommit || ev.Commit.CommitLSN != 0x1A2B400 || ev.Commit.EndLSN != 0x1A2B430 || !ev.Commit.CommitTime.Equal(commit) {
		t.Fatalf("commit = %+v", ev.Commit)
	}
}

func TestDecodeIgnoresOtherChanges(t *testing.T) {
	d := NewDecoder()
	var ev Event
	for _, m := range []msg{
		msg{'U'}.u32(1).u8('N').u16(0),
		msg{'D'}.u32(1).u8('K').u16(0),
		msg{'T'}.u32(1).u8(0).u32(1),
		msg{'Y'}.u32(1).str("public").str("mytype"),
		msg{'O'}.u64(1).str("origin"),
	} {
		if err := d.Decode(m, 0, &ev); err != nil || ev.Kind != KindIgnored {
			t.Fatalf("%c: kind %v err %v", m[0], ev.Kind, err)
		}
	}
}

func TestDecodeMalformed(t *testing.T) {
	full := msg{'I'}.u32(7).u8('N').u16(3).text("a").text("{}").u8('n')
	cases := map[string]msg{
		"empty":            {},
		"unknown type":     {'Z', 1, 2},
		"short begin":      msg{'B'}.u32(1),
		"short commit":     msg{'C'}.u8(0).u64(1),
		"insert before R":  msg{'I'}.u32(99).u8('N').u16(0),
		"wrong tuple tag":  msg{'I'}.u32(7).u8('K').u16(3),
		"column count":     msg{'I'}.u32(7).u8('N').u16(2).text("a").text("b"),
		"length too big":   msg{'I'}.u32(7).u8('N').u16(3).u8('t').u32(1 << 30),
		"bad column kind":  msg{'I'}.u32(7).u8('N').u16(3).u8('x'),
		"truncated insert": full[:len(full)-3],
		"unterminated str": msg{'R'}.u32(1).u8('p').u8('u'),
		"relation columns": msg{'R'}.u32(8).str("s").str("t").u8('d').u16(60000),
		"short message":    msg{'M'}.u8(1).u64(1).str("p").u32(100).u8('x'),
	}
	for name, m := range cases {
		t.Run(name, func(t *testing.T) {
			d := NewDecoder()
			var ev Event
			if err := d.Decode(relationMsg(7), 0, &ev); err != nil {
				t.Fatal(err)
			}
			err := d.Decode(m, 0, &ev)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("err = %v, want ErrMalformed", err)
			}
		})
	}
}

func TestRelationReplacedOnNewAnnouncement(t *testing.T) {
	d := NewDecoder()
	var ev Event
	_ = d.Decode(relationMsg(5), 0, &ev)
	first := ev.Relation
	_ = d.Decode(relationMsg(5), 0, &ev)
	if ev.Relation == first {
		t.Fatal("a new relation message must produce a new *Relation so per-pointer caches are invalidated")
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(msg{'I'}.u32(7).u8('N').u16(3).text("a").text("{}").u8('n')))
	f.Add([]byte(relationMsg(7)))
	f.Add([]byte(msg{'B'}.u64(1).u64(2).u32(3)))
	f.Add([]byte(msg{'M'}.u8(1).u64(1).str("outboxrelay").u32(2).u8('{').u8('}')))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := NewDecoder()
		var ev Event
		_ = d.Decode(relationMsg(7), 0, &ev)
		if err := d.Decode(data, 0, &ev); err != nil {
			return
		}
		if ev.Kind == KindInsert && len(ev.Insert.Values) != len(ev.Insert.Relation.Columns) {
			t.Fatalf("insert with %d values for %d columns", len(ev.Insert.Values), len(ev.Insert.Relation.Columns))
		}
	})
}

func BenchmarkDecodeInsert1KB(b *testing.B) {
	d := NewDecoder()
	var ev Event
	_ = d.Decode(relationMsg(7), 0, &ev)
	payload := make([]byte, 1024)
	for i := range payload {
		payload[i] = 'a'
	}
	m := msg{'I'}.u32(7).u8('N').u16(3).text("0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a").text(`"` + string(payload[:1022]) + `"`).u8('n')
	b.SetBytes(int64(len(m)))
	b.ReportAllocs()
	for b.Loop() {
		if err := d.Decode(m, 0, &ev); err != nil {
			b.Fatal(err)
		}
	}
}
