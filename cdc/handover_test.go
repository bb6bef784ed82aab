package cdc

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

// windowHandler models the relay's in-flight window on the stream's side:
// every change is acknowledged at once, until the fillAt-th row, from which
// on the window is full and nothing is acknowledged until the test calls
// release. Its Reset reports keeps.
type windowHandler struct {
	fixedHandler
	fillAt int
	keeps  bool
	// unconfirmed: commits do not move the confirmed position, as while the
	// broker has not acknowledged them yet.
	unconfirmed bool
	room        chan struct{} // closed by release
	// stall, when set, keeps the window from filling: the fillAt-th row's
	// Insert closes stalled and returns once stall is closed.
	stall, stalled chan struct{}

	full  atomic.Bool
	rows  atomic.Int64 // rows handed over
	mu    sync.Mutex
	got   []int // each row's id, as handed over
	reset []bool
}

func (h *windowHandler) Insert(_ context.Context, ins *Insert) error {
	id, err := strconv.Atoi(string(ins.Values[0]))
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.got = append(h.got, id)
	h.mu.Unlock()
	if h.rows.Add(1) != int64(h.fillAt) {
		return nil
	}
	if h.stall != nil {
		close(h.stalled)
		<-h.stall
		return nil
	}
	h.full.Store(true)
	return nil
}

func (h *windowHandler) Commit(_ context.Context, c Commit) error {
	if !h.unconfirmed {
		h.pos.Store(uint64(c.EndLSN)) // the transaction's rows were acknowledged
	}
	return nil
}

func (h *windowHandler) Room() <-chan struct{} {
	if h.full.Load() {
		return h.room
	}
	return nil
}

func (h *windowHandler) Unacknowledged() int {
	if h.full.Load() {
		return 1
	}
	return 0
}

func (h *windowHandler) Reset() bool {
	h.mu.Lock()
	h.reset = append(h.reset, h.keeps)
	h.mu.Unlock()
	return h.keeps
}

func (h *windowHandler) release() {
	h.full.Store(false)
	close(h.room)
}

func (h *windowHandler) handed() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.got...)
}

// TestResumeAfterFullWindowHandsOverTheRest fills the window in the middle
// of a transaction, long enough for the stream to read on and drop what it
// receives, and then frees it: the stream resumes from the slot, at the
// start of that transaction. A Handler that keeps what it was handed of it
// (every sink but exactly-once Kafka) must get only the rest of it; one that
// drops it must get all of it again. Before, both got all of it again.
func TestResumeAfterFullWindowHandsOverTheRest(t *testing.T) {
	srv := pgservertest.Start(t, pgserver.Options{})
	const txSize, txs, fillAt = 70, 4, 100 // the window fills in the second transaction
	for _, keeps := range []bool{true, false} {
		t.Run(fmt.Sprintf("keeps=%v", keeps), func(t *testing.T) {
			url := prepareHandover(t, srv, fmt.Sprintf("handover_%v", keeps), slices.Repeat([]int{txSize}, txs)...)
			core, logs := observer.New(zap.InfoLevel)
			s, err := NewStream(Config{URL: url, Slot: "handover", Publication: "handover",
				StatusInterval: 100 * time.Millisecond, ReconnectMin: 10 * time.Millisecond}, zap.New(core))
			if err != nil {
				t.Fatal(err)
			}
			h := &windowHandler{fillAt: fillAt, keeps: keeps, room: make(chan struct{})}
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx, h) }()

			waitLog(t, logs, "dropping the changes received from now on", done)
			h.release()
			waitLog(t, logs, "resuming from the slot", done)
			for h.rows.Load() < txSize*txs && ctx.Err() == nil {
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(300 * time.Millisecond) // a row handed twice would be counted by now
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("stream: %v", err)
			}

			got := h.handed()
			want := make([]int, 0, txSize*txs)
			for id := 1; id <= txSize*txs; id++ {
				want = append(want, id)
			}
			if !keeps {
				// The second transaction again from its start, after the rows
				// handed over before the window filled.
				want = append(append([]int(nil), want[:fillAt]...), want[txSize:]...)
			}
			count := map[int]int{}
			dups := 0
			for _, id := range got {
				if count[id]++; count[id] == 2 {
					dups++
				}
			}
			t.Logf("rows %d, handed over %d, handed over twice %d, resets %v", txSize*txs, len(got), dups, h.reset)
			if !slices.Equal(got, want) {
				t.Fatalf("handed over %d rows (%d of them twice), want %d in order:\n got %s\nwant %s",
					len(got), dups, len(want), summary(got), summary(want))
			}
		})
	}
}

// TestResumeAfterLostConnectionHandsOverTheRest: the replication connection
// is lost in the middle of a transaction, after the transaction before it
// was confirmed. The next session receives the transaction again from its
// start, and a Handler that keeps what it was handed gets only the rest.
func TestResumeAfterLostConnectionHandsOverTheRest(t *testing.T) {
	srv := pgservertest.Start(t, pgserver.Options{})
	// The connection is lost in the second transaction, which is larger
	// than the socket buffers: the rest of it is still to be sent.
	sizes := []int{70, 20000, 70}
	const cutAt = 100
	url := prepareHandover(t, srv, "handover_cut", sizes...)
	rows := 0
	for _, n := range sizes {
		rows += n
	}
	db, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	s, err := NewStream(Config{URL: url, Slot: "handover", Publication: "handover",
		StatusInterval: 100 * time.Millisecond, ReconnectMin: 10 * time.Millisecond}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	h := &windowHandler{fillAt: cutAt, keeps: true, stall: make(chan struct{}), stalled: make(chan struct{})}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, h) }()

	select {
	case <-h.stalled:
	case err := <-done:
		t.Fatalf("stream ended (%v) before row %d", err, cutAt)
	case <-ctx.Done():
		t.Fatalf("row %d not handed over within 2 minutes", cutAt)
	}
	// The first transaction is confirmed, so that only the second comes again.
	for confirmed := false; !confirmed; time.Sleep(20 * time.Millisecond) {
		if err := db.QueryRow(t.Context(), "SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'handover'",
			LSN(h.pos.Load()).String()).Scan(&confirmed); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec(t.Context(), "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'handover'"); err != nil {
		t.Fatal(err)
	}
	close(h.stall)
	for h.rows.Load() < int64(rows) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // a row handed twice would be counted by now
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("stream: %v", err)
	}
	got := h.handed()
	want := make([]int, 0, rows)
	for id := 1; id <= rows; id++ {
		want = append(want, id)
	}
	t.Logf("rows %d, handed over %d, resets %v", rows, len(got), h.reset)
	if len(h.reset) < 2 {
		t.Fatalf("%d sessions ended, want the lost one and the last", len(h.reset))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("handed over %d rows, want %d once, in order:\n got %s\nwant %s", len(got), len(want), summary(got), summary(want))
	}
}

// TestResumeAfterLostConnectionSkipsHandedTransactions: the replication
// connection is lost in the third transaction while the first two, handed
// over whole, are not confirmed yet (the broker has not acknowledged them).
// The next session receives all three again from the slot's position. A
// Handler that keeps what it was handed gets the first two not again, and
// only the rest of the third; one that drops gets them all again.
func TestResumeAfterLostConnectionSkipsHandedTransactions(t *testing.T) {
	srv := pgservertest.Start(t, pgserver.Options{})
	sizes := []int{70, 70, 20000, 70}
	const cutAt = 200
	rows := 0
	for _, n := range sizes {
		rows += n
	}
	for _, keeps := range []bool{true, false} {
		t.Run(fmt.Sprintf("keeps=%v", keeps), func(t *testing.T) {
			url := prepareHandover(t, srv, fmt.Sprintf("handover_unconfirmed_%v", keeps), sizes...)
			db, err := pgx.Connect(t.Context(), url)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close(context.Background())
			s, err := NewStream(Config{URL: url, Slot: "handover", Publication: "handover",
				StatusInterval: 100 * time.Millisecond, ReconnectMin: 10 * time.Millisecond}, zap.NewNop())
			if err != nil {
				t.Fatal(err)
			}
			h := &windowHandler{fillAt: cutAt, keeps: keeps, unconfirmed: true, stall: make(chan struct{}), stalled: make(chan struct{})}
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx, h) }()
			select {
			case <-h.stalled:
			case err := <-done:
				t.Fatalf("stream ended (%v) before row %d", err, cutAt)
			case <-ctx.Done():
				t.Fatalf("row %d not handed over within 2 minutes", cutAt)
			}
			if _, err := db.Exec(t.Context(), "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'handover'"); err != nil {
				t.Fatal(err)
			}
			close(h.stall)
			want := make([]int, 0, rows)
			for id := 1; id <= rows; id++ {
				want = append(want, id)
			}
			// A Handler that drops gets everything from the slot's position
			// again, after what the lost session handed over (the rows up to
			// the cut and those still buffered).
			for done := false; !done && ctx.Err() == nil; time.Sleep(20 * time.Millisecond) {
				got := h.handed()
				done = len(got) >= rows && got[len(got)-1] == rows
			}
			time.Sleep(300 * time.Millisecond) // a row handed twice would be counted by now
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("stream: %v", err)
			}
			got := h.handed()
			t.Logf("rows %d, handed over %d, resets %v", rows, len(got), h.reset)
			if len(h.reset) < 2 {
				t.Fatalf("%d sessions ended, want the lost one and the last", len(h.reset))
			}
			if keeps && !slices.Equal(got, want) {
				t.Fatalf("handed over %d rows, want %d once, in order:\n got %s\nwant %s", len(got), len(want), summary(got), summary(want))
			}
			if !keeps && (len(got) < rows+cutAt || !slices.Equal(got[len(got)-rows:], want)) {
				t.Fatalf("handed over %d rows, want all %d again after the %d or more of the lost session:\n got %s", len(got), rows, cutAt, summary(got))
			}
		})
	}
}

// prepareHandover creates database name with a published table of rows
// with ids from 1, in transactions of the sizes given, committed after the
// slot, and returns its URL.
func prepareHandover(t *testing.T, srv *pgserver.Server, name string, sizes ...int) string {
	t.Helper()
	url, err := srv.CreateDatabase(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	db, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	for _, sql := range []string{
		"CREATE TABLE rows (id int PRIMARY KEY, body text)",
		"CREATE PUBLICATION handover FOR TABLE rows WITH (publish = 'insert')",
		"SELECT pg_create_logical_replication_slot('handover', 'pgoutput')",
	} {
		if _, err := db.Exec(t.Context(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	next := 1
	for _, n := range sizes {
		if _, err := db.Exec(t.Context(), "INSERT INTO rows SELECT g, repeat('x', 1000) FROM generate_series($1::int, $2::int) g",
			next, next+n-1); err != nil {
			t.Fatal(err)
		}
		next += n
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), url)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "SELECT pg_drop_replication_slot('handover')")
	})
	return url
}

// waitLog waits until the stream has logged msg, failing if it ends first.
func waitLog(t *testing.T, logs *observer.ObservedLogs, msg string, done <-chan error) {
	t.Helper()
	deadline := time.After(time.Minute)
	for logs.FilterMessageSnippet(msg).Len() == 0 {
		select {
		case err := <-done:
			t.Fatalf("stream ended (%v) before it logged %q", err, msg)
		case <-deadline:
			t.Fatalf("stream did not log %q within a minute", msg)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// summary writes ids as runs: 1-70 71-100 71-280.
func summary(ids []int) string {
	var b strings.Builder
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		fmt.Fprintf(&b, "%d-%d ", ids[i], ids[j])
		i = j + 1
	}
	return b.String()
}
