package relay

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/cdc"
)

// TestCheckpointerConfirmsUnrecordedOnlyWhenPostgresStops: a checkpoint
// write on a terminated connection (57P01, as pg_terminate_backend, a
// pooler or a shutdown send) is retried on a new connection; only a server
// that then refuses it (57P03, connection refused) lets the relay confirm
// what it could not record.
func TestCheckpointerConfirmsUnrecordedOnlyWhenPostgresStops(t *testing.T) {
	terminated := &pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"}
	shuttingDown := &pgconn.PgError{Severity: "FATAL", Code: "57P03", Message: "the database system is shutting down"}
	refused := fmt.Errorf("failed to connect: %w", syscall.ECONNREFUSED)
	lockTimeout := &pgconn.PgError{Code: "55P03", Message: "canceling statement due to lock timeout"}
	for _, tc := range []struct {
		name       string
		errs       []error // what successive Checkpoint calls return, then nil
		recorded   bool
		unrecorded bool
		calls      int
	}{
		{"terminated, then a new connection works", []error{terminated}, true, false, 2},
		{"two dead pooled connections, then a new one", []error{terminated, terminated}, true, false, 3},
		{"terminated, then the server refuses as shutting down", []error{terminated, shuttingDown}, false, true, 2},
		{"terminated, then nothing listens", []error{terminated, refused}, false, true, 2},
		{"shutting down at once", []error{shuttingDown}, false, true, 1},
		{"a lock timeout holds", []error{lockTimeout}, false, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			cfg := &settings{Options: Options{Checkpoint: confirmFunc(func(context.Context, cdc.LSN) error {
				calls++
				if calls <= len(tc.errs) {
					return tc.errs[calls-1]
				}
				return nil
			})}}
			tr := newTracker()
			c := newCheckpointer(cfg, zap.NewNop(), tr)
			tr.idle(100, time.Time{})
			err := c.record(t.Context())
			if (err == nil) != tc.recorded {
				t.Fatalf("record: %v, want recorded %v", err, tc.recorded)
			}
			if calls != tc.calls {
				t.Errorf("Checkpoint called %d times, want %d", calls, tc.calls)
			}
			if got := c.unrecorded.Load(); got != tc.unrecorded {
				t.Errorf("confirming unrecorded: %v, want %v", got, tc.unrecorded)
			}
			want := cdc.LSN(0) // held: the slot must not pass the record
			if tc.recorded || tc.unrecorded {
				want = 100
			}
			if got := c.confirmed(); got != want {
				t.Errorf("confirmed %s, want %s", got, want)
			}
		})
	}
}

// confirmFunc is a Checkpoint whose Confirm is the function and whose
// CheckSlot accepts every slot.
type confirmFunc func(ctx context.Context, lsn cdc.LSN) error

func (f confirmFunc) Confirm(ctx context.Context, lsn cdc.LSN) error { return f(ctx, lsn) }
func (confirmFunc) CheckSlot(context.Context, cdc.LSN) error         { return nil }

// TestCheckpointerIdlePace: a record writes WAL that the walsender's next
// keepalive reports, which moves the watermark. Such a position is recorded
// once per IdleCheckpointInterval, not at every tick: before, each record
// caused the next, ten a second on an idle relay. A position that passed
// messages is recorded at the next tick, and a walsender that waits for a
// reply has the position recorded at once.
func TestCheckpointerIdlePace(t *testing.T) {
	tr := newTracker()
	var mu sync.Mutex
	var records []cdc.LSN
	wal := cdc.LSN(1000)
	cfg := &settings{Config: Config{CheckpointInterval: time.Millisecond, IdleCheckpointInterval: time.Hour},
		Options: Options{Checkpoint: confirmFunc(func(_ context.Context, lsn cdc.LSN) error {
			mu.Lock()
			defer mu.Unlock()
			records = append(records, lsn)
			wal += 200 // the record's own WAL, which the next keepalive reports
			tr.idle(wal, time.Time{})
			return nil
		})}}
	c := newCheckpointer(cfg, zap.NewNop(), tr)
	c.started(wal)
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(records)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()

	mu.Lock()
	wal += 500 // a heartbeat's transaction, and a keepalive after it
	tr.idle(wal, time.Time{})
	mu.Unlock()
	time.Sleep(200 * time.Millisecond) // 200 ticks
	if n := count(); n != 0 {
		t.Fatalf("%d records in 200 ticks of an idle relay, want 0 before IdleCheckpointInterval", n)
	}
	if got := c.confirmed(); got != 1000 {
		t.Fatalf("confirmed %s, want the unrecorded position held back at 0/3E8", got)
	}

	// Rows delivered: recorded at the next tick, once.
	mu.Lock()
	tx := tr.begin()
	tr.add(tx, 0)
	tr.commit(wal + 100)
	tr.ack(tx, 0)
	delivered := wal + 100
	mu.Unlock()
	waitUntil(t, "the delivered position recorded", func() bool { return c.confirmed() >= delivered })
	time.Sleep(100 * time.Millisecond) // 100 ticks, with the record's own WAL reported
	if n := count(); n != 1 {
		t.Fatalf("%d records after one delivered transaction, want 1: %v", n, records)
	}

	// A walsender that waits for the relay's position: recorded at once.
	mu.Lock()
	wal += 300
	asked := wal
	mu.Unlock()
	h := &handler{tracker: tr, cp: c}
	h.Idle(asked, time.Time{}, true)
	waitUntil(t, "the position the walsender waits for recorded", func() bool { return c.confirmed() >= asked })
	if n := count(); n != 2 {
		t.Fatalf("%d records, want 2: %v", n, records)
	}
}

// TestCheckpointerDue: when a tick records.
func TestCheckpointerDue(t *testing.T) {
	cfg := &settings{Config: Config{IdleCheckpointInterval: 10 * time.Second}, Options: Options{Checkpoint: confirmFunc(func(context.Context, cdc.LSN) error { return nil })}}
	tr := newTracker()
	c := newCheckpointer(cfg, zap.NewNop(), tr)
	now := time.Now()
	c.started(100)
	if c.due(now) {
		t.Errorf("due with the watermark at the recorded position")
	}
	tr.idle(200, time.Time{})
	if c.due(now.Add(9 * time.Second)) {
		t.Errorf("due 9s after the last record with only a keepalive's position to record")
	}
	if !c.due(now.Add(11 * time.Second)) {
		t.Errorf("not due 11s after the last record with a keepalive's position to record")
	}
	tx := tr.begin()
	tr.add(tx, 0)
	tr.commit(300)
	if c.due(now) {
		t.Errorf("due with the delivered transaction still in flight")
	}
	tr.ack(tx, 0)
	if !c.due(now) {
		t.Errorf("not due with a delivered transaction past the record")
	}
	if err := c.record(t.Context()); err != nil {
		t.Fatal(err)
	}
	tr.idle(400, time.Time{})
	c.unrecorded.Store(true)
	if !c.due(now) {
		t.Errorf("not due while confirming unrecorded: the record must catch up at once")
	}
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
