package cdc

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrSlotActive is returned (wrapped) by Peek when another process is
// streaming from the slot: PostgreSQL lets only one reader hold a slot.
var ErrSlotActive = errors.New("replication slot is in use by another process")

// Peek decodes what slot will deliver to a relay of publication, without
// consuming it: every transaction from the slot's confirmed position up to
// the first whose WAL reaches upto, as pgoutput sends them to Stream
// (protocol version 1, whole transactions at their commit). It calls fn
// with each insert; the Insert and its values are valid only during the
// call. The rows stream from the server, so memory does not grow with the
// slot's backlog; PostgreSQL decodes the whole backlog from the slot's
// restart position, as a session's start does, and holds its output in a
// tuplestore that spills to disk past work_mem. upto must be at or below
// the server's flushed WAL for the transactions before it to be seen.
// fn's error stops the read. Cancelling ctx cancels the query.
func Peek(ctx context.Context, db Querier, slot, publication string, upto LSN, fn func(*Insert) error) error {
	rows, err := db.Query(ctx, `SELECT data FROM pg_logical_slot_peek_binary_changes($1, $2::pg_lsn, NULL,
		'proto_version', '1', 'publication_names', $3)`, slot, upto.String(), publication)
	if err != nil {
		return peekErr(slot, publication, err)
	}
	defer rows.Close()
	d := NewDecoder()
	var ev Event
	var data []byte
	for rows.Next() {
		// bytea comes in binary: its raw value is the message itself.
		if rows.FieldDescriptions()[0].Format == pgx.BinaryFormatCode {
			data = rows.RawValues()[0]
		} else if err := rows.Scan(&data); err != nil {
			return fmt.Errorf("peek replication slot %s: %w", slot, err)
		}
		if err := d.Decode(data, 0, &ev); err != nil {
			return fmt.Errorf("peek replication slot %s: %w", slot, err)
		}
		if ev.Kind != KindInsert {
			continue
		}
		if err := fn(&ev.Insert); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return peekErr(slot, publication, err)
	}
	return nil
}

func peekErr(slot, publication string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use
		return fmt.Errorf("peek replication slot %s: %w (%s)", slot, ErrSlotActive, pgErr.Message)
	}
	err = fmt.Errorf("peek replication slot %s: %w", slot, err)
	if !missingPublication(err, publication) {
		return err
	}
	// Only a first start peeks: no relay has read the slot, so making it
	// anew loses nothing (the first start then publishes from the tables).
	return fmt.Errorf("%w: PostgreSQL decodes slot %s with the catalog as it was when each change was written, and publication %s was not there yet for a change the slot holds: it was created after the slot; no relay has read the slot yet, so set postgres.publication to the publication %s was made with, or drop the slot (SELECT pg_drop_replication_slot('%s')) and start the relay again, which makes a new slot after %s and publishes the rows committed before it from the outbox tables",
		err, slot, publication, slot, slot, publication)
}
