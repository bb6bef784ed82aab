package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
	"github.com/outboxrelay/outboxrelay/migrations"
)

// database is the demo's database; it appears as source.database in every envelope.
const database = "shop"

// startPostgres starts the throwaway cluster and creates the demo database.
// The cluster lives in a temporary directory that Stop removes.
func startPostgres(ctx context.Context, p printer) (*pgserver.Server, error) {
	pg, err := pgserver.Start(ctx, pgserver.Options{Logf: p.line})
	if errors.Is(err, pgserver.ErrNoBinaries) {
		// The error names the package to install.
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("start PostgreSQL: %w", err)
	}
	if _, err := pg.CreateDatabase(ctx, database); err != nil {
		return nil, errors.Join(err, pg.Stop())
	}
	return pg, nil
}

// startKafka starts a one-broker kfake cluster on a free loopback port. It
// creates topics on first use, as a broker with auto.create.topics.enable does.
func startKafka() (*kfake.Cluster, error) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3))
	if err != nil {
		return nil, fmt.Errorf("start kfake: %w", err)
	}
	return c, nil
}

// ordersDDL is the demo service's own table.
const ordersDDL = `CREATE TABLE IF NOT EXISTS orders (
    id         bigint        PRIMARY KEY,
    customer   text          NOT NULL,
    total      numeric(10,2) NOT NULL,
    status     text          NOT NULL,
    created_at timestamptz   NOT NULL DEFAULT now()
)`

// migrate applies what `outboxrelay migrate` applies, creates the orders
// table and returns a connection for the demo service.
func migrate(ctx context.Context, url string) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	if err := migrations.Apply(ctx, conn, migrations.Options{}); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if _, err := conn.Exec(ctx, ordersDDL); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("create orders table: %w", err)
	}
	return conn, nil
}
