package inbox

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/inbox/internal/pgtest"
)

// TestHandlerWritesThroughThePool: handlers that write through the pool
// the inbox uses, as many at once as the pool has connections, all finish.
// Without a bound the inbox's transactions held every connection and each
// handler waited for one forever.
func TestHandlerWritesThroughThePool(t *testing.T) {
	const conns, messages = 4, 8
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE audit (message_id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	in, err := New(pool, "billing", Config{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}

	// Each handler waits, up to a second, until as many handlers as the
	// pool has connections are inside, then writes through the pool.
	var mu sync.Mutex
	inside, all := 0, make(chan struct{})
	h := func(ctx context.Context, tx pgx.Tx, m Message) error {
		mu.Lock()
		if inside++; inside == conns {
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
		case <-time.After(time.Second):
		}
		_, err := pool.Exec(ctx, "INSERT INTO audit VALUES ($1)", m.ID)
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, messages)
	for i := range messages {
		wg.Go(func() {
			m := Message{ID: fmt.Sprintf("0193a5b0-7d4e-7c1a-9f3e-%012d", i), AggregateType: "order", AggregateID: fmt.Sprint(i), EventType: "created"}
			if res, err := in.Process(ctx, m, h); err != nil || res.Outcome != Processed {
				errs <- fmt.Errorf("message %d: %v, %v", i, res.Outcome, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var n int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM audit").Scan(&n); err != nil || n != messages {
		t.Errorf("%d handler writes through the pool (%v), want %d", n, err, messages)
	}
}

// TestPoolOfOneConnection: a pool the inbox's transaction would hold whole
// is refused with the fix.
func TestPoolOfOneConnection(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := New(pool, "billing", Config{}); err == nil || !strings.Contains(err.Error(), "raise pool_max_conns to 2") {
		t.Fatalf("New with a pool of one connection = %v, want the error naming pool_max_conns", err)
	}
}
