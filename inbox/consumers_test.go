package inbox

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestOneIDTwoConsumersAndTwoRunners: the same message id under two
// consumer names runs both handlers; two runners of one consumer name on
// their own pools (two machines) receiving it at the same moment, the
// handler slow, run it once: the second claim waits for the first
// transaction, then is a duplicate.
func TestOneIDTwoConsumersAndTwoRunners(t *testing.T) {
	f := newFixture(t, nil, Config{})
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, "CREATE TABLE runs (consumer text, message_id text)"); err != nil {
		t.Fatal(err)
	}
	raw := Raw{Value: []byte(`{"specversion":"1.0","id":"same-id","type":"t","source":"s","subject":"a","data":{}}`)}
	h := func(ctx context.Context, tx pgx.Tx, m Message) error {
		time.Sleep(200 * time.Millisecond)
		_, err := tx.Exec(ctx, "INSERT INTO runs VALUES (current_setting('application_name'), $1)", m.ID)
		return err
	}
	var wg sync.WaitGroup
	outs := make([]Outcome, 4)
	errs := make([]error, 4)
	for i, consumer := range []string{"billing", "billing", "shipping", "shipping"} {
		cfg, err := pgxpool.ParseConfig(f.pool.Config().ConnString())
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["application_name"] = consumer
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		in, err := New(pool, consumer, Config{})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := in.Receive(ctx, raw, h)
			outs[i], errs[i] = res.Outcome, err
		}()
	}
	wg.Wait()
	for i := 0; i < 4; i += 2 {
		if errs[i] != nil || errs[i+1] != nil {
			t.Fatalf("errors %v, %v", errs[i], errs[i+1])
		}
		if got := []Outcome{outs[i], outs[i+1]}; !(got[0] == Processed && got[1] == Duplicate || got[0] == Duplicate && got[1] == Processed) {
			t.Fatalf("runners %d and %d: %v; want one processed, one duplicate", i, i+1, got)
		}
	}
	var billing, shipping int
	if err := f.pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE consumer = 'billing'), count(*) FILTER (WHERE consumer = 'shipping') FROM runs").Scan(&billing, &shipping); err != nil {
		t.Fatal(err)
	}
	if billing != 1 || shipping != 1 {
		t.Fatalf("committed runs: billing %d, shipping %d; want 1 each", billing, shipping)
	}
}
