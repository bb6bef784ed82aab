package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/internal/store"
)

// offlineReadTimeout bounds a read of a pipeline that has no App wired, so
// that a database that does not answer holds up neither the API nor the
// history's sampler for long.
const offlineReadTimeout = 3 * time.Second

// offlineDB is a small pool on u's database for what the management API
// reads while u has no App wired (paused, starting, failed): the slot's
// figures, its progress and its dead letters are kept in PostgreSQL, and
// a paused slot's retained WAL and lag are exactly what the operator needs
// to watch. The pool connects on first use, and its connections close
// once idle, so a pool left from a pause holds none while the App runs.
func (u *unit) offlineDB() (*pgxpool.Pool, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.offline != nil {
		return u.offline, nil
	}
	if u.offlineClosed {
		return nil, errors.New("the pipeline has stopped")
	}
	pcfg, err := poolConfig(u.Config.Postgres.URL)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = 2
	pcfg.MaxConnIdleTime = 30 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg) // connects lazily: no I/O here
	if err != nil {
		return nil, fmt.Errorf("cannot connect to PostgreSQL: %v%s", err, tlsHint(err))
	}
	u.offline = pool
	return pool, nil
}

// closeOffline closes u's offline pool, for good: u's supervisor returned.
func (u *unit) closeOffline() {
	u.mu.Lock()
	pool := u.offline
	u.offline, u.offlineClosed = nil, true
	u.mu.Unlock()
	if pool != nil {
		pool.Close()
	}
}

// slotStatus is u's slot status: from its App while one is wired, else
// read from PostgreSQL directly (the running relay only refines the lag
// it knows more recently than its last record).
func (u *unit) slotStatus(ctx context.Context, a *App) (store.Status, error) {
	if a != nil {
		st, err := a.Status(ctx)
		if !errors.Is(err, errStarting) {
			return st, err
		}
	}
	pool, err := u.offlineDB()
	if err != nil {
		return store.Status{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, offlineReadTimeout)
	defer cancel()
	return store.ReadStatus(ctx, pool, u.Config.Postgres.Slot)
}

// deadLetterStore is u's dead letters: its App's while one is wired, else
// through the offline pool, so that they stay readable (and replayable,
// as with dlq replay) while the pipeline is paused or restarting.
func (u *unit) deadLetterStore(a *App) (*store.DeadLetters, error) {
	if a != nil {
		if dead := a.DeadLetters(); dead != nil {
			return dead, nil
		}
	}
	pool, err := u.offlineDB()
	if err != nil {
		return nil, err
	}
	return &store.DeadLetters{DB: pool, Slot: u.Config.Postgres.Slot}, nil
}
