package cdc

import (
	"context"
	"fmt"
	"slices"
	"testing"
)

// orderHandler records what it is handed, in order.
type orderHandler struct {
	fixedHandler
	got []string
}

func (h *orderHandler) Insert(_ context.Context, ins *Insert) error {
	h.got = append(h.got, "insert "+string(ins.Values[0]))
	return nil
}

func (h *orderHandler) Message(_ context.Context, m *LogicalMessage) error {
	h.got = append(h.got, "message "+string(m.Content))
	return nil
}

// The positions are those PostgreSQL 15 gave a message written in a
// savepoint, the row written after RELEASE, and the rows around them: the
// row at 0/152A818 was decoded before the message that ended there.
func TestWALOrderPutsAMessageBeforeTheInsertItEndsAt(t *testing.T) {
	type event struct {
		insert        bool
		lsn           LSN
		text          string
		transactional bool
	}
	for _, tc := range []struct {
		name   string
		events []event
		want   []string
	}{
		{"decoded swapped", []event{{true, 0x152A790, "1", false}, {true, 0x152A818, "2", false}, {false, 0x152A818, "m", true}, {true, 0x152A900, "3", false}},
			[]string{"insert 1", "message m", "insert 2", "insert 3"}},
		{"decoded in order", []event{{true, 0x152A790, "1", false}, {false, 0x152A818, "m", true}, {true, 0x152A818, "2", false}},
			[]string{"insert 1", "message m", "insert 2"}},
		{"message after the insert", []event{{true, 0x152A818, "1", false}, {false, 0x152A8A0, "m", true}},
			[]string{"insert 1", "message m"}},
		{"non-transactional message", []event{{true, 0x152A818, "1", false}, {false, 0x152A818, "m", false}},
			[]string{"insert 1", "message m"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &orderHandler{}
			var o walOrder
			for _, e := range tc.events {
				var err error
				if e.insert {
					// The decoder reuses its buffers: what walOrder holds must be its own.
					val := []byte(e.text)
					err = o.insert(t.Context(), h, &Insert{Values: [][]byte{val, nil}, LSN: e.lsn})
					copy(val, "x")
				} else {
					err = o.message(t.Context(), h, &LogicalMessage{Transactional: e.transactional, LSN: e.lsn, Content: []byte(e.text)})
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := o.flush(t.Context(), h); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(h.got, tc.want) {
				t.Errorf("handed %v, want %v", h.got, tc.want)
			}
		})
	}
}

func TestWALOrderKeepsNullsAndEmptyValues(t *testing.T) {
	var got [][]byte
	h := &valuesHandler{got: &got}
	var o walOrder
	if err := o.insert(t.Context(), h, &Insert{Values: [][]byte{[]byte("a"), nil, {}, []byte("bc")}}); err != nil {
		t.Fatal(err)
	}
	if err := o.flush(t.Context(), h); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprintf("%q", got) != `["a" "" "" "bc"]` || got[1] != nil || got[2] == nil {
		t.Errorf("values %q (nil at 1: %t, nil at 2: %t)", got, got[1] == nil, got[2] == nil)
	}
	// Only an empty value: nothing to copy, still not NULL.
	o = walOrder{}
	if err := o.insert(t.Context(), h, &Insert{Values: [][]byte{{}}}); err != nil {
		t.Fatal(err)
	}
	if err := o.flush(t.Context(), h); err != nil {
		t.Fatal(err)
	}
	if got[0] == nil {
		t.Error("an empty value was handed on as NULL")
	}
}

type valuesHandler struct {
	fixedHandler
	got *[][]byte
}

func (h *valuesHandler) Insert(_ context.Context, ins *Insert) error {
	*h.got = ins.Values
	return nil
}
