package inbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
	"github.com/outboxrelay/outboxrelay/inbox/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// counts is an Observer that counts.
type counts struct {
	processed, duplicates, retried, deadLettered, parked, stale atomic.Int64
}

func (c *counts) observer() Observer {
	return Observer{
		Processed:    func(Message, time.Duration) { c.processed.Add(1) },
		Duplicate:    func(Message) { c.duplicates.Add(1) },
		Retried:      func(Message, int, error) { c.retried.Add(1) },
		DeadLettered: func(Message, error) { c.deadLettered.Add(1) },
		Parked:       func(Message) { c.parked.Add(1) },
		Stale:        func(Message) { c.stale.Add(1) },
	}
}

type fixture struct {
	pool     *pgxpool.Pool
	in       *Inbox
	counts   *counts
	msgs     []ledger.Msg
	poisoned atomic.Bool
}

func newFixture(t *testing.T, msgs []ledger.Msg, cfg Config) *fixture {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := Migrate(ctx, pool, cfg.Schema); err != nil {
		t.Fatal(err)
	}
	if err := ledger.Setup(ctx, pool, msgs); err != nil {
		t.Fatal(err)
	}
	f := &fixture{pool: pool, counts: &counts{}, msgs: msgs}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = time.Millisecond, 5*time.Millisecond
	}
	cfg.Observer = f.counts.observer()
	if f.in, err = New(pool, "billing", cfg); err != nil {
		t.Fatal(err)
	}
	f.poisoned.Store(true)
	return f
}

func (f *fixture) handler(ctx context.Context, tx pgx.Tx, m Message) error {
	return ledger.Apply(ctx, tx, m.ID, m.Payload, f.poisoned.Load())
}

func raw(m ledger.Msg) Raw {
	return Raw{Key: []byte(m.Account), Value: m.Envelope()}
}

func (f *fixture) receive(t *testing.T, m ledger.Msg) Result {
	t.Helper()
	res, err := f.in.Receive(context.Background(), raw(m), f.handler)
	if err != nil {
		t.Fatalf("receive %s: %v", m.ID, err)
	}
	return res
}

func (f *fixture) check(t *testing.T) ledger.Report {
	t.Helper()
	r, err := ledger.Check(context.Background(), f.pool, f.msgs)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// redeliver runs deliveries the way a broker with redeliveries does: each
// account's messages in order, accounts in parallel, each message delivered
// one to three times, and every message of one account in three of ten
// cases delivered twice at the same moment (two consumers after a
// rebalance). Then the whole stream is delivered again (a consumer that
// resumes from offset 0). It returns the deliveries made.
func redeliver(t *testing.T, f *fixture) int64 {
	t.Helper()
	byAcct := map[string][]ledger.Msg{}
	for _, m := range f.msgs {
		byAcct[m.Account] = append(byAcct[m.Account], m)
	}
	var deliveries atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, len(byAcct))
	for acct, ms := range byAcct {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(len(acct)), uint64(ms[0].Seq)))
			for _, m := range ms {
				n := 1 + r.IntN(3)
				for range n {
					if r.IntN(10) < 3 {
						// Two at once: the second waits on the first's
						// record and then sees the conflict.
						var inner sync.WaitGroup
						for range 2 {
							inner.Go(func() {
								if _, err := f.in.Receive(context.Background(), raw(m), f.handler); err != nil {
									errs <- err
								}
							})
						}
						inner.Wait()
						deliveries.Add(2)
						continue
					}
					if _, err := f.in.Receive(context.Background(), raw(m), f.handler); err != nil {
						errs <- err
						return
					}
					deliveries.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, m := range f.msgs {
		f.receive(t, m)
		deliveries.Add(1)
	}
	return deliveries.Load()
}

func TestRedeliveriesApplyOnce(t *testing.T) {
	f := newFixture(t, ledger.Generate(600, 12), Config{})
	deliveries := redeliver(t, f)
	r := f.check(t)
	t.Logf("deliveries %d, duplicates skipped %d; %v", deliveries, f.counts.duplicates.Load(), r)
	if !r.ExactlyOnce() {
		t.Fatalf("not exactly once: %v", r)
	}
	if got, want := f.counts.processed.Load(), int64(len(f.msgs)); got != want {
		t.Errorf("processed %d, want %d", got, want)
	}
	if got, want := f.counts.duplicates.Load(), deliveries-int64(len(f.msgs)); got != want || got < int64(len(f.msgs)) {
		t.Errorf("duplicates skipped %d, want %d (at least one per message)", got, want)
	}
	st, err := f.in.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.LastMessageID == "" || st.LastProcessedAt.IsZero() || len(st.DeadLetters) != 0 || len(st.Parked) != 0 {
		t.Errorf("status = %+v, want a last message and no dead letters", st)
	}
}

// TestWithoutDedupeDoubleEffectIsSeen runs the same redeliveries with the
// dedupe insert left out: the ledger check must see the double effects, or
// the test above could not fail.
func TestWithoutDedupeDoubleEffectIsSeen(t *testing.T) {
	f := newFixture(t, ledger.Generate(120, 6), Config{})
	f.in.noDedupe = true
	deliveries := redeliver(t, f)
	r := f.check(t)
	t.Logf("without the inbox: deliveries %d; %v", deliveries, r)
	if r.ExactlyOnce() || r.Doubles < len(f.msgs) || r.BadBalances == 0 {
		t.Fatalf("the check did not see the double effects: %v", r)
	}
}

func TestPoisonParksAggregateReplayReleasesInOrder(t *testing.T) {
	msgs := ledger.Generate(40, 2) // acct-000 and acct-001, 20 each
	poison := 2 * 4                // acct-000's 5th message
	msgs[poison].Poison = true
	f := newFixture(t, msgs, Config{MaxAttempts: 3})
	ctx := context.Background()

	var dl Result
	for i, m := range msgs[:30] {
		res := f.receive(t, m)
		switch {
		case i == poison:
			dl = res
			if res.Outcome != DeadLettered || res.Attempts != 3 || !errors.Is(res.Err, ledger.ErrPoison) {
				t.Fatalf("poison message: %+v, want dead-lettered after 3 attempts", res)
			}
		case m.Account == "acct-000" && i > poison:
			if res.Outcome != Parked {
				t.Fatalf("message %d behind the poison one: %v, want parked", i, res.Outcome)
			}
		default:
			if res.Outcome != Processed {
				t.Fatalf("message %d: %v, want processed", i, res.Outcome)
			}
		}
	}
	// Redeliveries of the dead letter and of a parked message are duplicates.
	for _, i := range []int{poison, poison + 2} {
		if res := f.receive(t, msgs[i]); res.Outcome != Duplicate {
			t.Errorf("redelivery of message %d: %v, want duplicate", i, res.Outcome)
		}
	}
	st, err := f.in.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.DeadLetters) != 1 || len(st.Parked) != 1 || st.Parked[0].AggregateID != "acct-000" || st.Parked[0].Waiting != 10 ||
		st.DeadLetters[0].Attempts != 3 || !strings.Contains(st.DeadLetters[0].Error, "poison") || st.DeadLetters[0].MessageID != msgs[poison].ID {
		t.Fatalf("status = %+v, want one dead letter with acct-000 parked behind it, 10 waiting", st)
	}
	if got := f.counts.retried.Load(); got != 2 {
		t.Errorf("retried %d, want 2", got)
	}

	// The fix ships; the replay runs while the rest of the stream arrives.
	f.poisoned.Store(false)
	done := make(chan ReplayResult, 1)
	go func() {
		rr, err := f.in.Replay(ctx, st.DeadLetters[0].ID, f.handler)
		if err != nil {
			t.Errorf("replay: %v", err)
		}
		done <- rr
	}()
	for _, m := range msgs[30:] {
		if res := f.receive(t, m); res.Outcome != Processed && res.Outcome != Parked {
			t.Fatalf("message during the replay: %v", res.Outcome)
		}
	}
	rr := <-done
	if rr.Processed < 11 { // the poison message and the 10 parked behind it
		t.Errorf("replay processed %d, want at least 11", rr.Processed)
	}
	r := f.check(t)
	t.Logf("poison: dead letter %d, replay %+v; %v", dl.Attempts, rr, r)
	if !r.ExactlyOnce() {
		t.Fatalf("after the replay: %v", r)
	}
	if st, err = f.in.Status(ctx); err != nil || len(st.DeadLetters) != 0 || len(st.Parked) != 0 {
		t.Fatalf("status after the replay = %+v, %v; want nothing waiting", st, err)
	}
	if _, err := f.in.Replay(ctx, st.LastProcessedAt.Unix(), f.handler); !errors.Is(err, ErrNotParked) {
		t.Errorf("replay of an unknown dead letter: %v, want ErrNotParked", err)
	}
	// A new message of the aggregate goes straight through.
	extra := ledger.Msg{ID: "00000000-0000-4000-8000-000000000001", Account: "acct-000", Seq: 21, Amount: 5}
	if res := f.receive(t, extra); res.Outcome != Processed {
		t.Errorf("after the release: %v, want processed", res.Outcome)
	}
}

func TestPermanentErrorDeadLettersAtOnce(t *testing.T) {
	msgs := ledger.Generate(1, 1)
	f := newFixture(t, msgs, Config{})
	res, err := f.in.Receive(context.Background(), raw(msgs[0]), func(context.Context, pgx.Tx, Message) error {
		return Permanent(errors.New("unknown account"))
	})
	if err != nil || res.Outcome != DeadLettered || res.Attempts != 1 {
		t.Fatalf("= %+v, %v; want dead-lettered after 1 attempt", res, err)
	}
}

func TestUndecodableDeadLetteredAtOnce(t *testing.T) {
	f := newFixture(t, nil, Config{})
	bad := Raw{Key: []byte("k"), Value: []byte("not an envelope"), Headers: map[string]string{"tenant": "x"}}
	for range 2 { // the redelivery finds the same dead letter
		res, err := f.in.Receive(context.Background(), bad, func(context.Context, pgx.Tx, Message) error {
			t.Fatal("the handler ran for an undecodable message")
			return nil
		})
		if err != nil || res.Outcome != DeadLettered || !errors.Is(res.Err, ErrUndecodable) {
			t.Fatalf("= %+v, %v; want dead-lettered as undecodable", res, err)
		}
	}
	st, err := f.in.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.DeadLetters) != 1 || st.DeadLetters[0].State != "dead" || !strings.Contains(st.DeadLetters[0].Error, "body is not JSON") || len(st.Parked) != 0 {
		t.Fatalf("status = %+v, want one dead letter saying why", st)
	}
	var body []byte
	if err := f.pool.QueryRow(context.Background(), "SELECT body FROM inbox.dead_letters").Scan(&body); err != nil || string(body) != "not an envelope" {
		t.Fatalf("stored body %q, %v; want the message as received", body, err)
	}
}

func TestPruneInBatchesAndStaleCount(t *testing.T) {
	msgs := ledger.Generate(50, 5)
	f := newFixture(t, msgs, Config{Retention: time.Hour})
	ctx := context.Background()
	for _, m := range msgs {
		f.receive(t, m)
	}
	if _, err := f.pool.Exec(ctx, `UPDATE inbox.processed SET processed_at = now() - interval '2 hours'
WHERE message_id IN (SELECT message_id FROM inbox.processed ORDER BY message_id LIMIT 23)`); err != nil {
		t.Fatal(err)
	}
	n, err := f.in.Prune(ctx, 5)
	if err != nil || n != 23 {
		t.Fatalf("pruned %d, %v; want 23", n, err)
	}
	var left int
	if err := f.pool.QueryRow(ctx, "SELECT count(*) FROM inbox.processed").Scan(&left); err != nil || left != 27 {
		t.Fatalf("%d records left, %v; want 27", left, err)
	}
	old := Message{ID: "00000000-0000-4000-8000-00000000000a", AggregateType: "account", AggregateID: "acct-000",
		OccurredAt: time.Now().Add(-3 * time.Hour), Payload: []byte(`{"account":"acct-000","seq":11,"amount":1}`)}
	if _, err := f.in.Process(ctx, old, f.handler); err != nil {
		t.Fatal(err)
	}
	if got := f.counts.stale.Load(); got != 1 {
		t.Errorf("stale %d, want 1 (a message older than the window)", got)
	}
}

func TestMigrateTwiceOwnSchema(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for range 2 {
		if err := Migrate(ctx, conn, "Billing Inbox"); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'Billing Inbox'`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d tables, %v; want 3", n, err)
	}
	if sql := SQL(""); !strings.Contains(sql, `CREATE TABLE IF NOT EXISTS "inbox".processed`) {
		t.Errorf("SQL(\"\") does not create inbox.processed:\n%s", sql)
	}
}

func TestCancelledProcessLeavesNothing(t *testing.T) {
	msgs := ledger.Generate(1, 1)
	f := newFixture(t, msgs, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	_, err := f.in.Receive(ctx, raw(msgs[0]), func(ctx context.Context, tx pgx.Tx, m Message) error {
		if err := f.handler(ctx, tx, m); err != nil {
			return err
		}
		cancel() // the process stops before the commit
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if r := f.check(t); r.Runs != 0 {
		t.Fatalf("a cancelled attempt left %d runs", r.Runs)
	}
	if res := f.receive(t, msgs[0]); res.Outcome != Processed {
		t.Fatalf("redelivery after the cancel: %v, want processed", res.Outcome)
	}
	if r := f.check(t); !r.ExactlyOnce() {
		t.Fatal(r)
	}
}

func ExampleSQL() {
	fmt.Println(strings.SplitN(SQL("billing_inbox"), "\n", 2)[0])
	// Output: CREATE SCHEMA IF NOT EXISTS "billing_inbox";
}

// TestReplayOfAHandBuiltMessage: a Message built without Decode is stored
// as an envelope and replayed as one, whatever Config.Format says.
func TestReplayOfAHandBuiltMessage(t *testing.T) {
	msgs := ledger.Generate(1, 1)
	f := newFixture(t, msgs, Config{Format: FormatDebezium, MaxAttempts: 1})
	ctx := context.Background()
	m := Message{ID: msgs[0].ID, AggregateType: "account", AggregateID: msgs[0].Account,
		Payload: []byte(`{"account":"acct-000","seq":1,"amount":1,"poison":true}`)}
	res, err := f.in.Process(ctx, m, f.handler)
	if err != nil || res.Outcome != DeadLettered {
		t.Fatalf("= %+v, %v; want dead-lettered", res, err)
	}
	st, err := f.in.Status(ctx)
	if err != nil || len(st.DeadLetters) != 1 {
		t.Fatalf("status = %+v, %v", st, err)
	}
	f.poisoned.Store(false)
	if rr, err := f.in.Replay(ctx, st.DeadLetters[0].ID, f.handler); err != nil || rr.Processed != 1 {
		t.Fatalf("replay = %+v, %v; want 1 processed", rr, err)
	}
	if r := f.check(t); !r.ExactlyOnce() {
		t.Fatal(r)
	}
}
