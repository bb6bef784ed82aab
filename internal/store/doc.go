// Package store owns the relay's state in PostgreSQL: the statements that
// read and write the checkpoint, the dead letters and parked messages and
// the coverage registrations, the status reads, and the statements that
// delete or detach outbox rows. cdc streams, decodes and sets up
// replication; it reads the checkpoint only through cdc.Record, which
// Checkpoint implements. (Three reads stay with their features: cdc's
// privilege check asks has_table_privilege about these tables, verify
// counts dead letters inside its reconciliation query, and the demo queries
// the view outboxrelay.status as a user would.)
//
// # Vocabulary
//
// Each word below means one thing in this package, and names, comments and
// messages use it only in that sense.
//
//   - checkpoint: the row of outboxrelay.checkpoint for one slot, the
//     relay's record of that slot (Checkpoint). Its columns fall in three
//     groups, each written by one method or type:
//     the confirmed position (confirmed_lsn, confirmed_at: Checkpoint.Confirm,
//     Checkpoint.Reset); the consumer (publication, tables, relations:
//     Checkpoint.RecordConsumer) with the stop error (error, error_at:
//     Checkpoint.RecordError, cleared by RecordConsumer and Reset); and the
//     progress (last_lsn, last_message_id, last_published_at,
//     published_total, lag_since: Progress).
//   - confirmed: a position the relay has reported, or is about to report,
//     to PostgreSQL as flushed in a standby status update: every message
//     before it was acknowledged by the broker or stored as a dead letter.
//     The relay records it in the checkpoint before it reports it, so the
//     slot's confirmed_flush_lsn (PostgreSQL's copy, Status.ConfirmedFlushLSN)
//     is never ahead of the checkpoint unless the slot was replaced, or
//     PostgreSQL shut down while the relay confirmed unrecorded (CheckSlot
//     tells the two apart).
//   - flushed: PostgreSQL's word for the position of a standby status
//     update, as in confirmed_flush_lsn; this package uses it for nothing
//     else. PostgreSQL's own CHECKPOINT (which removes WAL no slot needs) is
//     not a checkpoint in the sense above.
//   - published: acknowledged by the broker (Kafka acks=all, a publisher
//     confirm, a PubAck, an EXEC reply). The progress columns and
//     Status.LastPublishedLSN describe published messages, which may be
//     ahead of the confirmed position (an earlier transaction may still be
//     in flight).
//   - consumer: how a slot is consumed, cdc.Consumer: the publication, the
//     tables, and each table's identity and publication membership. The
//     coverage registrations (outboxrelay.coverage, RegisterCoverage) tell
//     the coverage event trigger which tables to guard.
//   - status: what ReadStatus reports about one slot, from pg_replication_slots
//     and the checkpoint, with the same names as the view outboxrelay.status;
//     ReadSlots lists every logical slot of the server.
//   - dead letter: a message the broker will never take, in
//     outboxrelay.dead_letters (DeadLetters, DeadLetter). A head is a dead
//     letter that parks its aggregate; the parked messages
//     (outboxrelay.parked, ParkedMessage) are its chain, the aggregate's
//     later messages waiting behind it. Replaying a head publishes it and
//     its chain and then releases the aggregate; purging deletes both.
//   - retention: deleting outbox rows older than postgres.retention
//     (Retention); for partitioned outbox tables, partition maintenance
//     (Maintain, RunMaintenance) creates daily partitions ahead and detaches
//     and drops those past the retention instead.
//
// The migrations in package migrations create the tables; this package
// never changes the schema.
package store
