package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/cdc"
)

// checkpointer decides the position confirmed to PostgreSQL: the tracker's
// watermark (every message before it acknowledged), once Options.Checkpoint
// has recorded it. The checkpoint ticker (run, started by Relay.Run) owns
// the recording; the stream goroutine also records, in Start and Drain,
// serialised with the ticker by mu. The stream reads confirmed from its
// status goroutine. Safe for concurrent use.
//
// Only a recorded position may be confirmed (CheckSlot refuses a slot ahead
// of the record), and a position must be confirmed for the slot to free the
// WAL before it. Not every position is worth a write at once, though: each
// record writes WAL, which the walsender's next keepalive reports, which
// moves the watermark again. A position that passed a transaction with
// changes for the relay (tracker.Carried) is recorded at the next tick
// (CheckpointInterval); one moved only by keepalives and by transactions
// that brought nothing (the relay's own records and heartbeats among them)
// waits for IdleCheckpointInterval after the last record, so that an idle
// relay writes at the pace of its heartbeats (due). A walsender waiting for
// a reply (a shutdown waits for everything it sent to be confirmed) has the
// position recorded at once (waiting).
type checkpointer struct {
	cfg     *settings
	log     *zap.Logger
	tracker *tracker
	mu      sync.Mutex // held while recording
	// recorded is the newest position saved by Options.Checkpoint: the one
	// reported to PostgreSQL.
	recorded   atomic.Uint64
	unrecorded atomic.Bool
	// recordedAt is when recorded last moved or a session started (Unix
	// nanoseconds): the idle pace counts from it.
	recordedAt atomic.Int64
	// hurry asks run to record now, whatever the pace.
	hurry chan struct{}
}

func newCheckpointer(cfg *settings, log *zap.Logger, t *tracker) *checkpointer {
	return &checkpointer{cfg: cfg, log: log, tracker: t, hurry: make(chan struct{}, 1)}
}

// confirmed is the newest position that every message before it was
// acknowledged and that has been recorded by Options.Checkpoint.
//
// When recording fails because PostgreSQL is shutting down (serverStopping),
// the relay confirms the acknowledged position unrecorded: a shutting-down
// walsender waits for its client to confirm everything it sent, and a relay
// that withheld confirmation would hold the server's shutdown hostage. The
// position is recorded at the start of the next session, before the slot is
// verified. A lost connection alone (pg_terminate_backend, a pooler, an
// idle_session_timeout: SQLSTATE 57P01 and its kin) says nothing about the
// server, so record retries on a new connection first; only a server that
// then refuses the new connection as shutting down, or is no longer
// listening, counts as stopping.
func (c *checkpointer) confirmed() cdc.LSN {
	if c.cfg.Checkpoint == nil || c.unrecorded.Load() {
		return c.tracker.Confirmed()
	}
	return cdc.LSN(c.recorded.Load())
}

// run records the watermark when due, looking every
// Config.CheckpointInterval, and at once when hurried, until ctx ends.
func (c *checkpointer) run(ctx context.Context) {
	t := time.NewTicker(c.cfg.CheckpointInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.hurry:
			_ = c.record(ctx)
		case <-t.C:
			if c.due(time.Now()) {
				_ = c.record(ctx) // logged; retried at the next tick
			}
		}
	}
}

// due reports whether the watermark is worth recording at now: it passed a
// transaction with changes for the relay since the last record, or it
// moved and IdleCheckpointInterval has passed since the last record, or the
// relay confirms unrecorded (the record must catch up).
func (c *checkpointer) due(now time.Time) bool {
	recorded := c.recorded.Load()
	switch {
	case uint64(c.tracker.Confirmed()) <= recorded:
		return false
	case uint64(c.tracker.Carried()) > recorded, c.unrecorded.Load():
		return true
	}
	return now.Sub(time.Unix(0, c.recordedAt.Load())) >= c.cfg.IdleCheckpointInterval
}

// waiting is called when the walsender asks for a reply: it waits for the
// relay's position (a shutdown waits until everything it sent is
// confirmed), so the watermark is recorded without waiting for its pace.
// It never blocks.
func (c *checkpointer) waiting() {
	select {
	case c.hurry <- struct{}{}:
	default:
	}
}

// record records the tracker's position now if it moved.
func (c *checkpointer) record(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	lsn := c.tracker.Confirmed()
	if uint64(lsn) <= c.recorded.Load() {
		return nil
	}
	saveCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.save(saveCtx, lsn); err != nil {
		if ctx.Err() != nil {
			return err // our own cancellation says nothing about PostgreSQL
		}
		if !serverStopping(err) {
			// A lock, a timeout, a full disk, connections that keep being
			// killed: hold the confirmation. An unrecorded confirmation would
			// make the next start see the slot ahead of the record and
			// refuse, with nothing lost.
			c.log.Warn("record checkpoint failed; holding the confirmed position until it succeeds", zap.Error(err))
			return err
		}
		if !c.unrecorded.Swap(true) {
			c.log.Warn("record checkpoint failed: PostgreSQL is shutting down; confirming progress unrecorded until it succeeds", zap.Error(err))
		}
		return err
	}
	c.recorded.Store(uint64(lsn))
	c.recordedAt.Store(time.Now().UnixNano())
	c.unrecorded.Store(false)
	return nil
}

// save records lsn with Options.Checkpoint, again at once while the
// connection it was given turns out to be gone: the next attempt gets
// another one (a pool drops a connection that failed so), and its answer
// tells whether PostgreSQL itself is going away. It stops when ctx ends.
func (c *checkpointer) save(ctx context.Context, lsn cdc.LSN) error {
	for logged := false; ; {
		err := c.cfg.Checkpoint.Confirm(ctx, lsn)
		if err == nil || !connectionLost(err) {
			return err
		}
		if !logged {
			logged = true
			c.log.Warn("checkpoint connection lost; recording on a new connection", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// resume prepares a session's start: what this process confirmed
// unrecorded is recorded, then the slot's position is checked against the
// record (Options.Checkpoint.CheckSlot).
func (c *checkpointer) resume(ctx context.Context, slotConfirmed cdc.LSN) error {
	if c.unrecorded.Load() {
		// What this process confirmed unrecorded must be on record before the
		// slot is compared with the record.
		var err error
		for attempt := 0; attempt < 20; attempt++ {
			if err = c.record(ctx); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
		}
		if err != nil {
			return fmt.Errorf("record checkpoint before resuming: %w", err)
		}
	}
	if c.cfg.Checkpoint != nil {
		if err := c.cfg.Checkpoint.CheckSlot(ctx, slotConfirmed); err != nil {
			return err
		}
	}
	return nil
}

// started records that the session streams from the slot's position.
func (c *checkpointer) started(slotConfirmed cdc.LSN) {
	c.tracker.idle(slotConfirmed, time.Time{}) // a position, not a time the relay was caught up
	// The slot's own position needs no recording: it is already confirmed.
	c.mu.Lock()
	if uint64(slotConfirmed) > c.recorded.Load() {
		c.recorded.Store(uint64(slotConfirmed))
	}
	c.recordedAt.Store(time.Now().UnixNano())
	c.mu.Unlock()
}

// connectionLost reports whether err says that the connection a statement
// used is gone, whatever the state of the server: the backend was
// terminated (SQLSTATE class 57P other than 57P03: pg_terminate_backend,
// idle_session_timeout, the crash of another backend, a shutdown too), a
// connection exception (class 08), or a network failure other than a
// timeout. A new connection may well work.
func connectionLost(err error) bool {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		code := coded.SQLState()
		return (strings.HasPrefix(code, "57P") && code != "57P03") || strings.HasPrefix(code, "08")
	}
	if serverStopping(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return false
	}
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		strings.Contains(err.Error(), "conn closed")
}

// serverStopping reports whether err says that PostgreSQL itself refuses
// new sessions or is gone: SQLSTATE 57P03 cannot_connect_now (shutting
// down, starting up, in recovery), or nothing listens at its address any
// more (connection refused, a socket file removed). A terminated
// connection is not enough (connectionLost).
func serverStopping(err error) bool {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return coded.SQLState() == "57P03"
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}
