// Command outboxrelay-demo shows outboxrelay end to end on one machine with
// nothing but this repository and the PostgreSQL server binaries: it starts
// a throwaway PostgreSQL (wal_level=logical) and an embedded Kafka-protocol
// broker (kfake), migrates the database, runs the relay in-process, writes
// sample orders the way a service would, consumes them back, prints the
// checkpoint status and removes everything it created.
//
// Run it with `make demo`. It exits 1 with one line naming the fix when
// something is missing, for example the PostgreSQL server package.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := demo(ctx, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "outboxrelay-demo:", err)
		os.Exit(1)
	}
}

// timeout bounds the whole demo, so that a broken environment fails with a
// message instead of hanging.
const timeout = 2 * time.Minute

// demo runs every step, printing progress to out and the relay's warnings
// and errors to logOut. It stops and removes what it started, also when a
// step fails or ctx is cancelled.
func demo(ctx context.Context, out, logOut io.Writer) (err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	began := time.Now()
	p := printer{w: out}
	// Registered first so that it runs after everything has stopped.
	defer func() {
		if err == nil {
			p.step("done in %.1fs", time.Since(began).Seconds())
		}
	}()

	p.step("starting PostgreSQL (throwaway cluster, wal_level=logical)")
	pg, err := startPostgres(ctx, p)
	if err != nil {
		return err
	}
	defer func() {
		p.step("stopping PostgreSQL and removing its temporary data")
		err = errors.Join(err, pg.Stop())
	}()

	p.step("starting Kafka (embedded kfake broker)")
	kafka, err := startKafka()
	if err != nil {
		return err
	}
	defer func() {
		p.step("stopping Kafka")
		kafka.Close()
	}()
	brokers := kafka.ListenAddrs()
	p.line("listening on %s", brokers[0])

	p.step("migrating: outbox table, outboxrelay schema, publication; and the demo's orders table")
	db, err := migrate(ctx, pg.URL(database))
	if err != nil {
		return err
	}
	defer db.Close(context.WithoutCancel(ctx))

	p.step("starting outboxrelay (in-process, Kafka sink, slot %s)", slot)
	rel, err := startRelay(ctx, relayConfig(pg.URL(database), brokers), newLogger(logOut))
	if err != nil {
		return err
	}
	defer func() {
		p.step("stopping outboxrelay (drains in-flight messages, confirms the final position)")
		err = errors.Join(err, rel.stop())
	}()

	p.step("writing sample orders, each in one transaction with its outbox rows")
	want, err := writeOrders(ctx, db, p)
	if err != nil {
		return err
	}

	p.step("consuming %s and %s with franz-go", topicOrder, topicCustomer)
	got, err := consume(ctx, brokers, want, rel)
	if err != nil {
		return err
	}
	printRecords(p, got)
	if err := checkRecords(got, want); err != nil {
		return err
	}
	p.line("received all %d committed messages; rolled-back order %s never arrived", len(want), rolledBackOrder)

	p.step("checkpoint status (SELECT * FROM outboxrelay.status)")
	if err := waitConfirmed(ctx, db, lastCommit(got), rel); err != nil {
		return err
	}
	st, err := readStatus(ctx, db)
	if err != nil {
		return err
	}
	printStatus(p, st)
	return nil
}

// printer writes the progress lines.
type printer struct{ w io.Writer }

func (p printer) step(format string, args ...any) {
	fmt.Fprintf(p.w, "==> "+format+"\n", args...)
}

func (p printer) line(format string, args ...any) {
	fmt.Fprintf(p.w, "    "+format+"\n", args...)
}
