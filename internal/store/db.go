package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Execer runs a statement: *pgx.Conn, *pgxpool.Pool and pgx.Tx satisfy it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Querier runs queries: *pgx.Conn, *pgxpool.Pool and pgx.Tx satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// DB runs statements and queries: *pgx.Conn, *pgxpool.Pool and pgx.Tx
// satisfy it.
type DB interface {
	Execer
	Querier
}

// TxDB is DB that also begins transactions, as dead letters and parking
// need. It must be safe for concurrent use when DeadLetters.Add is used as
// relay.Options.DeadLetters (*pgxpool.Pool is).
type TxDB interface {
	DB
	Begin(ctx context.Context) (pgx.Tx, error)
}
