package store

import (
	"testing"

	"github.com/outboxrelay/outboxrelay/migrations"
	"github.com/outboxrelay/outboxrelay/relay"
)

// TestRepublishedCounts: a relay's republished counts are written whole,
// so a second Save adds nothing; a command's count is a row of its own;
// status adds them up by reason, and a slot with none reads 0.
func TestRepublishedCounts(t *testing.T) {
	ctx := t.Context()
	conn := connectT(t, "republished_counts")
	if err := migrations.Apply(ctx, conn, migrations.Options{}); err != nil {
		t.Fatal(err)
	}
	read := func(slot string) Status {
		t.Helper()
		s := Status{Slot: slot}
		if err := readRepublishedTotals(ctx, conn, &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := read("orders"); s.RepublishedTotal != 0 || s.Republished != nil {
		t.Fatalf("before any republish: %d %v", s.RepublishedTotal, s.Republished)
	}
	w := NewProgress(conn, "orders", nil)
	w.Republished(&relay.Message{}, relay.RepublishedRetry)
	w.Republished(&relay.Message{}, relay.RepublishedRetry)
	for range 2 { // the second writes the same whole count again
		if err := w.Save(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w.Republished(&relay.Message{}, relay.RepublishedRetry)
	w.markRepublishedChanged() // as if the reply of the next write were lost
	if err := w.Save(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Save(ctx); err != nil {
		t.Fatal(err)
	}
	if err := AddRepublished(ctx, conn, "orders", relay.RepublishedReplay, 5, nil); err != nil {
		t.Fatal(err)
	}
	if err := AddRepublished(ctx, conn, "orders", relay.RepublishedReplay, 0, nil); err != nil {
		t.Fatal(err)
	}
	s := read("orders")
	if s.RepublishedTotal != 8 || s.Republished["retry"] != 3 || s.Republished["replay"] != 5 {
		t.Errorf("republished %d %v, want 8: retry 3, replay 5", s.RepublishedTotal, s.Republished)
	}
	if s := read("other"); s.RepublishedTotal != 0 {
		t.Errorf("another slot's republished_total %d, want 0", s.RepublishedTotal)
	}
}

// markRepublishedChanged makes the next Save write the counts again, as
// after a write whose reply was lost.
func (w *Progress) markRepublishedChanged() {
	w.mu.Lock()
	w.republishedChanged = true
	w.mu.Unlock()
}
