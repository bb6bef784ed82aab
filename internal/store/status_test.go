package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outboxrelay/relay"
)

var now = time.Date(2026, 11, 29, 8, 0, 10, 0, time.UTC)

func healthy() Status {
	return Status{
		Slot: "outboxrelay", Exists: true, Active: true, WALStatus: "reserved",
		ConfirmedFlushLSN: 0x1A2B3C4, RestartLSN: 0x1A2B000, CurrentWALLSN: 0x1A2B3C4 + 3<<20,
		LagBytes: 3 << 20, LagSeconds: 2.5, LagSince: now.Add(-2500 * time.Millisecond), RetainedWALBytes: 0x3C4 + 3<<20,
		LastPublishedLSN: 0x1A2B300, LastPublishedAt: now.Add(-3 * time.Second),
		LastMessageID: "0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a", PublishedTotal: 1200, DeadLetters: 2,
		RepublishedTotal: 3, Republished: map[string]int64{"retry": 2, "replay": 1},
	}
}

func TestWriteText(t *testing.T) {
	var b bytes.Buffer
	if err := WriteText(&b, healthy(), now); err != nil {
		t.Fatal(err)
	}
	want := `slot                 outboxrelay
exists               true
active               true
wal_status           reserved
confirmed_flush_lsn  0/1A2B3C4
restart_lsn          0/1A2B000
current_wal_lsn      0/1D2B3C4
lag_bytes            3145728 (3.0 MiB)
lag_seconds          2.5 (since 2026-11-29T08:00:07.5Z)
retained_wal_bytes   3146692 (3.0 MiB)
last_published_lsn   0/1A2B300
last_published_at    2026-11-29T08:00:07Z (3s ago)
last_message_id      0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a
published_total      1200
republished_total    3 (replay 1, retry 2)
dead_letters         2
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestWriteTextMissingSlot(t *testing.T) {
	var b bytes.Buffer
	s := Status{Slot: "gone", CurrentWALLSN: 0x5000, Warnings: []string{"schema outboxrelay is missing"}}
	if err := WriteText(&b, s, now); err != nil {
		t.Fatal(err)
	}
	want := `slot                 gone
exists               false
active               -
wal_status           -
confirmed_flush_lsn  -
restart_lsn          -
current_wal_lsn      0/5000
lag_bytes            -
lag_seconds          -
retained_wal_bytes   -
last_published_lsn   -
last_published_at    -
last_message_id      -
published_total      0
republished_total    0
dead_letters         0
warning: schema outboxrelay is missing
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestByteSize(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0", 1023: "1023", 1024: "1024 (1.0 KiB)", 1536: "1536 (1.5 KiB)",
		5 << 30: "5368709120 (5.0 GiB)", -2048: "-2048 (-2.0 KiB)",
	} {
		if got := byteSize(n); got != want {
			t.Errorf("byteSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestJSON(t *testing.T) {
	b, err := json.Marshal(healthy())
	if err != nil {
		t.Fatal(err)
	}
	want := `{"slot":"outboxrelay","exists":true,"active":true,"wal_status":"reserved",` +
		`"confirmed_flush_lsn":"0/1A2B3C4","restart_lsn":"0/1A2B000","current_wal_lsn":"0/1D2B3C4",` +
		`"lag_bytes":3145728,"lag_seconds":2.5,"retained_wal_bytes":3146692,"last_published_lsn":"0/1A2B300",` +
		`"last_published_at":"2026-11-29T08:00:07Z","last_message_id":"0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a",` +
		`"published_total":1200,"republished_total":3,"dead_letters":2,"republished":{"replay":1,"retry":2}}`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
	var back Status
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if h := healthy(); back.ConfirmedFlushLSN != h.ConfirmedFlushLSN || !back.LastPublishedAt.Equal(h.LastPublishedAt) || back.LagBytes != h.LagBytes || back.LagSeconds != h.LagSeconds {
		t.Errorf("round trip: %+v", back)
	}

	b, err = json.Marshal(Status{Slot: "gone", CurrentWALLSN: 0x5000})
	if err != nil {
		t.Fatal(err)
	}
	want = `{"slot":"gone","exists":false,"active":null,"wal_status":null,"confirmed_flush_lsn":null,` +
		`"restart_lsn":null,"current_wal_lsn":"0/5000","lag_bytes":null,"lag_seconds":null,"retained_wal_bytes":null,` +
		`"last_published_lsn":null,"last_published_at":null,"last_message_id":null,"published_total":0,"republished_total":0,"dead_letters":0}`
	if string(b) != want {
		t.Errorf("missing slot:\ngot  %s\nwant %s", b, want)
	}
}

func TestProblems(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(*Status)
		maxLag int64
		want   []string
	}{
		{"healthy", func(*Status) {}, 0, nil},
		{"under limit", func(*Status) {}, 4 << 20, nil},
		{"at limit", func(*Status) {}, 3 << 20, nil},
		{"over limit", func(*Status) {}, 1 << 20, []string{"lag of 3145728 bytes is over the limit of 1048576 bytes"}},
		{"inactive is fine", func(s *Status) { s.Active = false }, 0, nil},
		{"extended is fine", func(s *Status) { s.WALStatus = "extended" }, 0, nil},
		{"missing", func(s *Status) { *s = Status{Slot: "outboxrelay"} }, 1, []string{`replication slot "outboxrelay" does not exist`}},
		{"lost", func(s *Status) { s.WALStatus = "lost" }, 0, []string{"wal_status=lost: PostgreSQL removed WAL it still needed (max_slot_wal_keep_size); run `outboxrelay recover --config FILE`"}}, // what run says (cdc.LostSlot)
		{"unreserved and over", func(s *Status) { s.WALStatus = "unreserved" }, 1, []string{"wal_status=unreserved", "over the limit"}},
		{"no confirmed position yet", func(s *Status) { s.ConfirmedFlushLSN = 0 }, 1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := healthy()
			tt.edit(&s)
			got := s.Problems(tt.maxLag)
			if len(got) != len(tt.want) {
				t.Fatalf("Problems(%d) = %q, want %d matching %q", tt.maxLag, got, len(tt.want), tt.want)
			}
			for i := range got {
				if !strings.Contains(got[i], tt.want[i]) {
					t.Errorf("problem %d = %q, want it to contain %q", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// execRecorder records the progress writes; the writer's batching is
// what is tested here, the SQL itself in TestProgressLostReply and end to
// end in integration. It holds no row: published_total reads as absent.
type execRecorder struct {
	mu    sync.Mutex
	fail  error
	calls [][]any
}

func (e *execRecorder) Exec(_ context.Context, _ string, args ...any) (pgconn.CommandTag, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.fail != nil {
		return pgconn.CommandTag{}, e.fail
	}
	e.calls = append(e.calls, args)
	return pgconn.NewCommandTag("INSERT 0 1"), nil
}

func (e *execRecorder) QueryRow(context.Context, string, ...any) pgx.Row { return noRow{} }

func (e *execRecorder) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("execRecorder runs no queries")
}

type noRow struct{}

func (noRow) Scan(...any) error { return pgx.ErrNoRows }

func TestProgressBatches(t *testing.T) {
	db := &execRecorder{}
	w := NewProgress(db, "outboxrelay", nil)
	ctx := context.Background()
	if err := w.Save(ctx); err != nil || len(db.calls) != 0 {
		t.Fatalf("save with nothing published: %v, %d writes", err, len(db.calls))
	}
	at := now
	for i, lsn := range []uint64{0x300, 0x100, 0x200} { // acks out of WAL order
		w.Published(&relay.Message{ID: string(rune('a' + i)), LSN: pglogrepl.LSN(lsn)}, at.Add(time.Duration(i)*time.Second))
	}
	if err := w.Save(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Save(ctx); err != nil {
		t.Fatal(err)
	}
	if len(db.calls) != 1 {
		t.Fatalf("%d writes for one batch, want 1", len(db.calls))
	}
	args := db.calls[0]
	if *args[1].(*string) != "0/300" || args[2] != "a" || !args[3].(time.Time).Equal(at) || args[4] != int64(3) {
		t.Errorf("write args = %v, want the highest LSN (0/300, a) and 3 published", args)
	}

	// A failed write keeps its count for the next one.
	db.fail = errors.New("connection refused")
	w.Published(&relay.Message{ID: "d", LSN: 0x400}, at)
	if err := w.Save(ctx); err == nil {
		t.Fatal("save did not report the failed write")
	}
	w.Published(&relay.Message{ID: "e", LSN: 0x500}, at)
	db.fail = nil
	if err := w.Save(ctx); err != nil {
		t.Fatal(err)
	}
	if args := db.calls[1]; len(db.calls) != 2 || args[2] != "e" || args[4] != int64(5) {
		t.Errorf("write after a failure = %v, want e and 5 published in all", db.calls[1:])
	}
}

func TestProgressRunSavesAtStop(t *testing.T) {
	db := &execRecorder{}
	w := NewProgress(db, "outboxrelay", nil)
	w.interval = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	w.Published(&relay.Message{ID: "a", LSN: 0x100}, now)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(db.calls) != 1 {
		t.Errorf("%d writes at stop, want 1", len(db.calls))
	}
}

// TestProgressRecordsLagSince: lag_since is written when it moves, alone when
// nothing was published (so that an earlier run's figures stay), and not
// again while it stands still, as it does while the relay is stuck.
func TestProgressRecordsLagSince(t *testing.T) {
	db := &execRecorder{}
	w := NewProgress(db, "outboxrelay", nil)
	var since time.Time
	w.LagSince = func() time.Time { return since }
	ctx := context.Background()
	if err := w.Save(ctx); err != nil || len(db.calls) != 0 {
		t.Fatalf("lag since unknown: %v, %d writes", err, len(db.calls))
	}
	since = now.Add(-time.Second)
	if err := w.Save(ctx); err != nil {
		t.Fatal(err)
	}
	if len(db.calls) != 1 || len(db.calls[0]) != 2 || !db.calls[0][1].(*time.Time).Equal(since) {
		t.Fatalf("writes %v, want lag_since alone", db.calls)
	}
	if err := w.Save(ctx); err != nil || len(db.calls) != 1 {
		t.Fatalf("lag since unchanged: %v, %d writes, want no new write", err, len(db.calls))
	}
	since = now
	w.Published(&relay.Message{ID: "a", LSN: 0x100}, now)
	if err := w.Save(ctx); err != nil {
		t.Fatal(err)
	}
	if args := db.calls[1]; len(db.calls) != 2 || args[2] != "a" || !args[5].(*time.Time).Equal(now) {
		t.Errorf("write with a publish = %v, want the checkpoint and lag_since", db.calls[1:])
	}
}
