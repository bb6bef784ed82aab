// Package outboxpgx lets package outbox write through pgx:
//
//	id, err := outbox.Write(ctx, outboxpgx.Tx(tx), ev) // tx is a pgx.Tx
//
// It imports only pgx's pgconn, which any pgx user already has.
package outboxpgx

import (
	"context"
	"database/sql"
	"database/sql/driver"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outboxrelay/outbox"
)

// Execer is what pgx.Tx, *pgx.Conn and *pgxpool.Pool (and *pgxpool.Conn)
// have in common.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Tx adapts a pgx transaction for package outbox. Pass a pgx.Tx so that the
// event commits with the business change; a *pgx.Conn or *pgxpool.Pool
// outside a transaction commits each event on its own. The adapter holds
// nothing but db and is as safe for concurrent use as db is.
func Tx(db Execer) outbox.Execer { return execer{db} }

type execer struct{ db Execer }

func (e execer) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	tag, err := e.db.Exec(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return driver.RowsAffected(tag.RowsAffected()), nil
}
