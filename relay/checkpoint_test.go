package relay

import (
	"time"

	"context"
	"fmt"
	"syscall"
	"testing"

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
