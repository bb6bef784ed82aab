package cdc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/internal/backoff"
	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// Handler receives the committed changes of the replication stream, in WAL
// order, from one goroutine. A Handler may block (backpressure); status
// updates to PostgreSQL continue meanwhile. An error from a Handler method
// stops the stream; a context error is treated as a clean stop.
type Handler interface {
	Begin(ctx context.Context, b Begin) error
	Insert(ctx context.Context, ins *Insert) error
	// Message receives logical decoding messages (pg_logical_emit_message).
	Message(ctx context.Context, msg *LogicalMessage) error
	Commit(ctx context.Context, c Commit) error
	// Start is called when a session has found the slot, with the slot's
	// confirmed_flush_lsn, before streaming begins. An error ends the stream.
	Start(ctx context.Context, slotConfirmed LSN) error
	// Idle reports that every transaction that committed before walEnd has
	// been delivered: the stream calls it for keepalives between transactions.
	// serverTime is when the server sent the keepalive, by its clock: the
	// relay was caught up with the walsender then. waiting says that the
	// walsender asked for a reply: it waits for the relay's position (a
	// shutdown waits until all it sent is confirmed), so Confirmed should
	// reach walEnd as soon as it can.
	Idle(walEnd LSN, serverTime time.Time, waiting bool)
	// Reset is called when a session ends: a transaction that was open is
	// abandoned, and the next session delivers it again. Reset reports
	// whether the Handler keeps the changes of it that it was handed (they
	// are published all the same): the next session then hands over only
	// the transaction's later changes, else all of them from its beginning.
	Reset() (kept bool)
	// Confirmed returns the position to report as flushed: every transaction
	// that ended at or before it has been acknowledged by the broker. It is
	// called from another goroutine.
	Confirmed() LSN
	// Unacknowledged returns the number of messages handed to the broker and
	// not yet acknowledged (or dead-lettered). It is safe for concurrent use.
	Unacknowledged() int
	// Drain waits until every message handed out so far is acknowledged or
	// ctx is done.
	Drain(ctx context.Context) error
	// Room returns nil when the Handler can take another change without
	// waiting for the broker, or else a channel that is closed once it may
	// have room. The stream asks before every change, so that it does not
	// stop reading the replication connection while the Handler is full.
	Room() <-chan struct{}
}

// Stream is the logical replication connection. It reconnects by itself
// after the connection to PostgreSQL is lost and resumes from the slot.
type Stream struct {
	cfg       Config
	log       *zap.Logger
	connCfg   *pgconn.Config
	streaming atomic.Bool
	standby   atomic.Bool
	// rescued is set while the session streams above the Gate's share.
	rescued atomic.Bool
	// rescue asks the next session to take the slot above the share, and
	// freeSince is since when a standby at its share has seen the slot
	// free; both are owned by Run's goroutine.
	rescue    bool
	freeSince time.Time
	// waiting is when the reader began waiting for the walsender (Unix
	// nanoseconds), 0 while it is not waiting: see Silent.
	waiting atomic.Int64
}

// NewStream parses the configuration. It does not connect.
func NewStream(cfg Config, log *zap.Logger) (*Stream, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	connCfg, err := pgconn.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("parse postgres url: %s", redact.Text(err.Error()))
	}
	connCfg.RuntimeParams["replication"] = "database"
	connCfg.RuntimeParams["application_name"] = cfg.ApplicationName
	// Values come as PostgreSQL's text output; fix the formats the relay parses.
	connCfg.RuntimeParams["timezone"] = "UTC"
	connCfg.RuntimeParams["datestyle"] = "ISO"
	// Interrupt a blocked read with a deadline instead of a cancel request: a
	// cancel ends the walsender's COPY, and the relay still needs the
	// connection to send its final flushed position during shutdown.
	connCfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	return &Stream{cfg: cfg, log: log.Named("cdc"), connCfg: connCfg}, nil
}

// Ping opens a replication connection and closes it again, so that a role
// or pg_hba.conf that admits regular connections but not replication ones
// is found before the relay creates its slot. It does not touch the slot.
func (s *Stream) Ping(ctx context.Context) error {
	conn, err := pgconn.ConnectConfig(ctx, s.connCfg)
	if err != nil {
		return &SetupError{Msg: fmt.Sprintf("cannot open a replication connection: %v; pg_hba.conf must admit the relay's role to the outbox database (a logical replication connection matches the database's name)", err)}
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // nothing was sent
	if _, err := pglogrepl.IdentifySystem(ctx, conn); err != nil {
		return fmt.Errorf("identify system over the replication connection: %w", err)
	}
	return nil
}

// Streaming reports whether the stream is currently receiving from the slot.
// Safe for concurrent use.
func (s *Stream) Streaming() bool { return s.streaming.Load() }

// Silent returns how long the stream has been waiting for the walsender
// without receiving anything: 0 while it is not streaming, or is busy with
// what it received (a Handler that blocks is backpressure, not silence). A
// live walsender answers within about 2 × Config.StatusInterval, because
// the stream asks it for a reply at every status update once it has been
// silent for one interval; Silent beyond StallAfter therefore means that
// the connection is lost or the server stalled, long before ReceiveTimeout
// ends the session. Safe for concurrent use.
func (s *Stream) Silent() time.Duration {
	since := s.waiting.Load()
	if since == 0 || !s.streaming.Load() {
		return 0
	}
	return time.Since(time.Unix(0, since))
}

// StallAfter is the silence (Silent) past which the stream counts as
// stalled: 3 × Config.StatusInterval, and at least 3s.
func (s *Stream) StallAfter() time.Duration { return max(3*s.cfg.StatusInterval, 3*time.Second) }

// Standby reports whether the stream is waiting because another process
// holds the slot. Safe for concurrent use.
func (s *Stream) Standby() bool { return s.standby.Load() }

// Rescued reports whether the stream holds the slot above the Gate's
// share, because no process with room served it. Safe for concurrent use.
func (s *Stream) Rescued() bool { return s.rescued.Load() }

// Run streams until ctx is cancelled or a non-retryable error occurs. On
// cancellation it stops reading, waits (up to Config.DrainTimeout) for the
// Handler to drain, reports the final confirmed position and returns nil.
func (s *Stream) Run(ctx context.Context, h Handler) error {
	// A session that delivers a transaction again hands over only what an
	// earlier one did not.
	h = &handover{Handler: h}
	retry := backoff.Backoff{Min: s.cfg.ReconnectMin, Max: s.cfg.ReconnectMax}
	var standby standbyLog
	for {
		started := time.Now()
		err := s.session(ctx, h)
		if s.streaming.Swap(false) {
			standby = standbyLog{} // it held the slot: a new wait is news again
		}
		h.Reset()
		if ctx.Err() != nil {
			return nil
		}
		if !Retryable(err) {
			return err
		}
		if time.Since(started) > time.Minute {
			retry.Reset()
		}
		var wait time.Duration
		gated := errors.Is(err, ErrGated)
		s.standby.Store(IsSlotInUse(err) || gated)
		if errors.Is(err, errResume) {
			// Everything handed out is confirmed: resume at once.
			retry.Reset()
			continue
		}
		if IsSlotInUse(err) || gated {
			standby.polled(s.log, s.cfg.Slot, s.cfg.StandbyPoll, time.Now(), gated)
			if !s.waitStandby(ctx, gated) {
				return nil
			}
			continue
		} else {
			wait = retry.Next()
			standby = standbyLog{}
			s.log.Warn("replication connection lost; reconnecting", zap.Error(err), zap.Duration("retry_in", wait))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// waitStandby waits until a session is worth trying: without
// Config.SlotActive, one StandbyPoll. With it, until the slot is free,
// checked every StandbyProbe, or, while the Gate refuses (gated), every
// StandbyPoll and whenever the Gate may have room. A slot that stays free
// for UnservedAfter while the Gate refuses is served by no process with
// room: the next session takes it above the share. False when ctx ends.
func (s *Stream) waitStandby(ctx context.Context, gated bool) bool {
	if s.cfg.SlotActive == nil {
		return sleep(ctx, backoff.Jitter(s.cfg.StandbyPoll))
	}
	for {
		var room <-chan struct{}
		every := s.cfg.StandbyProbe
		if gated && s.cfg.Gate != nil {
			room, every = s.cfg.Gate.Room(), s.cfg.StandbyPoll
			select {
			case <-room: // room came since the refusal: wait as one with room
				gated, room, every = false, nil, s.cfg.StandbyProbe
			default:
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-room:
		case <-time.After(backoff.Jitter(every)):
		}
		active, err := s.cfg.SlotActive(ctx)
		switch {
		case ctx.Err() != nil:
			return false
		case err != nil:
			return true // a session says what is wrong
		case active:
			s.freeSince = time.Time{}
			continue
		case !gated:
			return true
		case s.freeSince.IsZero():
			s.freeSince = time.Now()
		case time.Since(s.freeSince) >= s.cfg.UnservedAfter:
			s.rescue = true
			s.log.Warn("no replica with room streams this slot; taking it above this replica's share (is one unable to reach its database?)",
				zap.String("slot", s.cfg.Slot), zap.Duration("free_for", time.Since(s.freeSince).Round(100*time.Millisecond)))
		}
		return true // the Gate decides: it may have room now
	}
}

// sleep waits d; false when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// standbyRemind is how often a standby says it is still waiting.
const standbyRemind = 5 * time.Minute

// standbyLog keeps a standby's log short: one line when it starts waiting,
// then one every standbyRemind, however often it polls.
type standbyLog struct {
	since, logged time.Time
	polls         int
}

func (l *standbyLog) polled(log *zap.Logger, slot string, poll time.Duration, now time.Time, gated bool) {
	l.polls++
	switch {
	case l.since.IsZero() && gated:
		l.since, l.logged = now, now
		log.Info("this process streams its share of the pipelines; waiting as standby for this one", zap.String("slot", slot), zap.Duration("poll", poll))
	case l.since.IsZero():
		l.since, l.logged = now, now
		log.Info("slot is in use by another process; waiting as standby", zap.String("slot", slot), zap.Duration("poll", poll))
	case now.Sub(l.logged) >= standbyRemind:
		l.logged = now
		log.Info("still waiting as standby", zap.String("slot", slot), zap.Duration("for", now.Sub(l.since).Round(time.Second)), zap.Int("polls", l.polls))
	}
}

// ErrGated ends a session that Config.Gate did not let start: the process
// streams its share of the pipelines. It is retryable, as a slot in use.
var ErrGated = errors.New("this process streams its share of the pipelines")

func (s *Stream) session(ctx context.Context, h Handler) (err error) {
	if s.cfg.Gate != nil {
		release, ok := s.cfg.Gate.Take()
		if !ok && s.rescue {
			release, ok = s.cfg.Gate.TakeAbove(), true
			s.rescued.Store(true)
			defer s.rescued.Store(false)
		}
		s.rescue = false
		if !ok {
			return retryableErr{ErrGated}
		}
		defer release()
	}
	conn, err := pgconn.ConnectConfig(ctx, s.connCfg)
	if err != nil {
		return fmt.Errorf("connect for replication: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()

	start, err := slotStart(ctx, conn, s.cfg.Slot)
	if err != nil {
		return err
	}
	if err := h.Start(ctx, start); err != nil {
		var se *SetupError
		if errors.As(err, &se) {
			return handlerErr{err}
		}
		// A database hiccup while checking the slot: try the session again.
		return retryableErr{fmt.Errorf("start session: %w", err)}
	}

	args := []string{
		"proto_version '1'",
		"publication_names " + quoteLiteral(s.cfg.Publication),
		"messages 'true'",
	}
	// Start at 0/0: the server resumes from the slot's confirmed_flush_lsn.
	if err := pglogrepl.StartReplication(ctx, conn, quoteIdent(s.cfg.Slot), 0, pglogrepl.StartReplicationOptions{PluginArgs: args}); err != nil {
		return fmt.Errorf("start replication on slot %q: %w", s.cfg.Slot, err)
	}
	s.streaming.Store(true)
	s.standby.Store(false)
	s.freeSince = time.Time{}
	// backend_pid is the slot's active_pid in pg_replication_slots.
	s.log.Info("streaming", zap.String("slot", s.cfg.Slot), zap.String("from", start.String()), zap.Uint32("backend_pid", conn.PID()))

	st := &statusWriter{conn: conn, h: h, reply: make(chan struct{}, 1),
		replyEvery: max(1, int(s.cfg.ReceiveTimeout/(3*s.cfg.StatusInterval))), silent: s.Silent}
	statusCtx, stopStatus := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		st.run(statusCtx, s.cfg.StatusInterval, s.log)
	}()

	readErr := s.read(ctx, conn, h, st)
	s.streaming.Store(false)
	if errors.Is(readErr, errCannotConfirm) {
		// Give the walsender nothing more, not even a final status: the
		// deferred Close ends the connection, and with it the walsender.
		st.close()
		stopStatus()
		wg.Wait()
		return readErr
	}

	// Drain even after a handler error: whatever the broker acknowledged is
	// confirmed, so a restart repeats as little as possible.
	drainCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.DrainTimeout)
	defer cancel()
	if readErr == nil || ctx.Err() != nil || isHandlerErr(readErr) || errors.Is(readErr, errResume) {
		if err := h.Drain(drainCtx); err != nil {
			s.log.Warn("drain incomplete; unacknowledged messages will be delivered again after restart", zap.Error(err))
		}
	}
	stopStatus()
	wg.Wait()
	if !conn.IsClosed() {
		if err := st.send(drainCtx); err == nil {
			s.log.Info("confirmed final position", zap.String("lsn", h.Confirmed().String()))
		}
		// End the COPY properly and read what the walsender still sends
		// until it is done. Closing a socket with unread data resets it, and
		// a walsender that sees the reset may exit before it has read the
		// final status update: the slot would not move.
		_ = conn.Conn().SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := pglogrepl.SendStandbyCopyDone(ctx, conn); err != nil {
			s.log.Debug("end replication", zap.Error(err))
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return readErr
}

// retryableErr marks a session failure worth another session.
type retryableErr struct{ err error }

func (e retryableErr) Error() string { return e.err.Error() }
func (e retryableErr) Unwrap() error { return e.err }

type handlerErr struct{ err error }

func (e handlerErr) Error() string { return e.err.Error() }
func (e handlerErr) Unwrap() error { return e.err }

func isHandlerErr(err error) bool {
	var he handlerErr
	return errors.As(err, &he)
}

// errCannotConfirm ends a session whose walsender waits for a flush
// position the relay cannot report yet.
var errCannotConfirm = errors.New("PostgreSQL waits for the relay to confirm everything it sent (it is shutting down or switching over), but the broker has not acknowledged every message; closing the replication connection without confirming them, so that PostgreSQL can stop, and resuming from the slot afterwards")

func (s *Stream) read(ctx context.Context, conn *pgconn.PgConn, h Handler, st *statusWriter) error {
	dec := NewDecoder()
	var ev Event
	var order walOrder // a session's held insert dies with it, as its transaction does
	inTx := false
	waits := waitWatch{gap: waitGap, after: waitAfter}
	// A silent peer (a cut without a reset) must not hold the session
	// forever: the status writer asks the server for a reply regularly, so a
	// live walsender always sends something within the timeout.
	dl := &readDeadline{conn: conn.Conn(), timeout: s.cfg.ReceiveTimeout, slack: s.cfg.ReceiveTimeout / 8}
	// ctx interrupts a blocked receive through the read deadline, watched
	// once for the session. Handing ctx to every ReceiveMessage made pgconn
	// register and remove a context.AfterFunc per message (two allocations,
	// four mutexes; a quarter of the loop's CPU in BenchmarkReadLoop).
	stop := context.AfterFunc(ctx, dl.interrupt)
	defer stop()
	recvCtx := context.WithoutCancel(ctx)
	defer s.waiting.Store(0)
	for {
		now := time.Now()
		dl.extend(now)
		s.waiting.Store(now.UnixNano())
		msg, err := conn.ReceiveMessage(recvCtx)
		s.waiting.Store(0)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				if dl.nudged() {
					continue
				}
				return retryableErr{fmt.Errorf("nothing from the walsender for %s; reconnecting", s.cfg.ReceiveTimeout)}
			}
			return fmt.Errorf("receive from walsender: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("parse keepalive: %w", err)
				}
				if !inTx {
					h.Idle(ka.ServerWALEnd, ka.ServerTime, ka.ReplyRequested)
				}
				if ka.ReplyRequested {
					n := h.Unacknowledged()
					if waits.observe(time.Now(), n > 0 && h.Confirmed() < ka.ServerWALEnd) {
						return retryableErr{fmt.Errorf("%w (%d unacknowledged, confirmed %s, server at %s)", errCannotConfirm, n, h.Confirmed(), ka.ServerWALEnd)}
					}
					st.requestReply()
				}
			case pglogrepl.XLogDataByteID:
				if room := h.Room(); room != nil {
					data, err := s.waitRoom(ctx, conn, h, st, dl, &waits, room, msg.Data)
					if err != nil || ctx.Err() != nil {
						return err
					}
					msg.Data = data
				}
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("parse xlogdata: %w", err)
				}
				if err := dec.Decode(xld.WALData, xld.WALStart, &ev); err != nil {
					return err
				}
				switch ev.Kind {
				case KindBegin:
					inTx = true
					err = h.Begin(ctx, ev.Begin)
				case KindInsert:
					err = order.insert(ctx, h, &ev.Insert)
				case KindMessage:
					err = order.message(ctx, h, &ev.Message)
				case KindCommit:
					inTx = false
					if err = order.flush(ctx, h); err == nil {
						err = h.Commit(ctx, ev.Commit)
					}
				}
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return handlerErr{err}
				}
			}
		case *pgproto3.ErrorResponse:
			return s.walsenderErr(pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return fmt.Errorf("walsender ended the stream: %w", io.ErrUnexpectedEOF)
		}
	}
}

// walsenderErr is the error the walsender ended the session with
// (see publicationErr).
func (s *Stream) walsenderErr(pgErr *pgconn.PgError) error {
	return publicationErr(fmt.Errorf("walsender: %w", pgErr), s.cfg.Slot, s.cfg.Publication)
}

// publicationErr explains err, the walsender's error for slot, when it is
// that publication pub does not exist (missingPublication).
// The relay checked at start that pub exists, so decoding that cannot find
// it looked in the catalog as it was when a change the slot holds was
// written: the publication was created after the slot (by hand, or by a
// migrate before that check), or dropped since. Setup cannot see the first
// (see LatePublication), so the error says it here.
func publicationErr(err error, slot, pub string) error {
	if !missingPublication(err, pub) {
		return err
	}
	return fmt.Errorf("%w: PostgreSQL decodes slot %s with the catalog as it was when each change was written, and publication %s was not there yet for a change the slot holds: it was created after the slot, or dropped since; set postgres.publication to the publication %s was made with, or make the slot anew after %s: stop every relay on %s and run `outboxrelay recover --config FILE --force`, which republishes the outbox rows since the relay's last recorded position",
		err, slot, pub, slot, pub, slot)
}

// missingPublication reports whether err is PostgreSQL's error that
// publication pub does not exist (42704), as decoding a slot gives it.
func missingPublication(err error, pub string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42704" && pgErr.Message == `publication "`+pub+`" does not exist`
}

// How the stream goes on reading while the Handler is full.
//
// A stopping walsender first sends everything it has decoded, then waits
// for its client to confirm it (see waitWatch). A reader that stops while
// the Handler's in-flight window is full reads none of it: the walsender
// blocks writing to the full socket, never reaches WalSndDone, and
// PostgreSQL waits for the relay, which waits for the broker. So when the
// Handler has had no room for fullHold, the reader holds the message it
// has (one, copied) and reads on: keepalives are handled as usual, except
// that they no longer tell the Handler that everything before them was
// delivered. A second change while the Handler is still full cannot be
// kept without buffering more than the window allows, so from then on the
// session drops every change it receives (discarding): it goes on reading
// only to see the walsender's keepalives, reply requests and end. A
// stopping walsender is then recognised as when the window is not full and
// the session ends without confirming. Otherwise the session ends once the
// Handler has nothing unacknowledged, after confirming what it was handed;
// the next session resumes from the slot there: the dropped changes come
// again, and so does the transaction that was being received when the
// window filled, from its beginning, of which the Handler is handed only
// the changes it was not handed yet when it keeps them (handover).
const (
	// fullHold is how long a full Handler is plain backpressure: a broker
	// that acknowledges anything within it keeps the reader waiting.
	fullHold = time.Second
	// fullPoll is how often a reader that reads on while the Handler is
	// full looks at the Handler again.
	fullPoll = 200 * time.Millisecond
)

// errResume ends a session that dropped changes while the Handler was full,
// once the Handler has nothing unacknowledged.
var errResume = errors.New("the broker acknowledged every message in flight; resuming from the slot with the changes received while the in-flight window was full")

// waitRoom waits until the Handler has room for the XLogData message data,
// and returns data, or the copy of it held meanwhile, to be handled next. It
// returns an error when the session must end, and nil with ctx done on a
// stop.
func (s *Stream) waitRoom(ctx context.Context, conn *pgconn.PgConn, h Handler, st *statusWriter, dl *readDeadline, waits *waitWatch,
	room <-chan struct{}, data []byte) ([]byte, error) {
	hold := time.NewTimer(fullHold)
	defer hold.Stop()
	select {
	case <-room:
		return data, nil
	case <-ctx.Done():
		return nil, nil
	case <-hold.C:
	}
	held := append([]byte(nil), data...)
	// Look at the Handler again every fullPoll, and at once when room is freed.
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(fullPoll)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-room:
				room = nil
				dl.nudge()
			case <-t.C:
				dl.nudge()
			}
		}
	}()
	defer func() {
		close(done)
		wg.Wait()
		dl.nudged() // a nudge not yet seen must not end the next receive
	}()
	s.log.Warn("the in-flight window is full and has had no room for a while; reading on so that PostgreSQL is not kept waiting",
		zap.Int("unacknowledged", h.Unacknowledged()), zap.Duration("for", fullHold))
	recvCtx := context.WithoutCancel(ctx)
	dropped, lastRecv := 0, time.Now()
	for {
		if dropped == 0 && h.Room() == nil {
			s.log.Info("the in-flight window has room again")
			return held, nil
		}
		if dropped > 0 && h.Unacknowledged() == 0 {
			s.log.Info("resuming from the slot", zap.Int("changes_dropped", dropped), zap.String("confirmed", h.Confirmed().String()))
			return nil, retryableErr{errResume}
		}
		dl.extend(time.Now())
		msg, err := conn.ReceiveMessage(recvCtx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil
			}
			if pgconn.Timeout(err) && dl.nudged() && time.Since(lastRecv) <= s.cfg.ReceiveTimeout {
				continue
			}
			if pgconn.Timeout(err) {
				return nil, retryableErr{fmt.Errorf("nothing from the walsender for %s; reconnecting", s.cfg.ReceiveTimeout)}
			}
			return nil, fmt.Errorf("receive from walsender: %w", err)
		}
		lastRecv = time.Now()
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				// Changes before it are held or dropped: it says nothing
				// about what was delivered (no Idle).
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return nil, fmt.Errorf("parse keepalive: %w", err)
				}
				if ka.ReplyRequested {
					n := h.Unacknowledged()
					if waits.observe(time.Now(), n > 0 && h.Confirmed() < ka.ServerWALEnd) {
						return nil, retryableErr{fmt.Errorf("%w (%d unacknowledged, confirmed %s, server at %s)", errCannotConfirm, n, h.Confirmed(), ka.ServerWALEnd)}
					}
					st.requestReply()
				}
			case pglogrepl.XLogDataByteID:
				if dropped == 0 {
					s.log.Warn("the in-flight window is still full: dropping the changes received from now on, to receive them again from the slot once the broker has acknowledged what is in flight")
				}
				dropped++
			}
		case *pgproto3.ErrorResponse:
			return nil, fmt.Errorf("walsender: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return nil, fmt.Errorf("walsender ended the stream: %w", io.ErrUnexpectedEOF)
		}
	}
}

// readDeadline keeps a receive deadline at least timeout ahead while moving
// it only once every slack: a SetReadDeadline per message reprogrammed a
// runtime timer per message. A silent connection therefore ends between
// timeout and timeout+slack after its last message. extend is called by the
// reader only; interrupt may be called from any goroutine, once.
type readDeadline struct {
	conn           net.Conn
	timeout, slack time.Duration
	at             atomic.Int64 // the deadline set, Unix nanoseconds; written under mu

	mu          sync.Mutex
	interrupted bool
	nudges      bool // a nudge not yet seen by nudged
}

// extend makes sure the deadline is at least timeout after now.
func (d *readDeadline) extend(now time.Time) {
	if time.Duration(d.at.Load()-now.UnixNano()) >= d.timeout {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.interrupted || d.nudges {
		return // keep the interrupt or the nudge set
	}
	at := now.Add(d.timeout + d.slack)
	d.at.Store(at.UnixNano())
	_ = d.conn.SetReadDeadline(at)
}

// interrupt ends a blocked receive and every later one.
func (d *readDeadline) interrupt() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.interrupted = true
	_ = d.conn.SetReadDeadline(time.Now())
}

// nudge ends a blocked receive, or the next one, once; nudged tells such a
// timeout from a silent connection. Any goroutine.
func (d *readDeadline) nudge() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.interrupted {
		return
	}
	d.nudges = true
	d.at.Store(0) // the next extend sets a full deadline again
	_ = d.conn.SetReadDeadline(time.Now())
}

// nudged reports whether a nudge came since the last call, and forgets it.
func (d *readDeadline) nudged() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.nudges
	d.nudges = false
	return n
}

// How the relay tells a stopping walsender from a live one.
//
// A walsender asks for a reply on its own only when half of
// wal_sender_timeout has passed without hearing from the client
// (WalSndKeepaliveIfNecessary); the status writer reports every
// StatusInterval, so such requests are rare and never come in a row. A
// walsender that is stopping (fast or smart shutdown, a switchover) has sent
// everything and waits in WalSndDone until the client's flush position
// reaches the last position it sent, asking for a reply again after every
// reply it gets. With messages the broker has not acknowledged, the relay
// cannot report that position without confirming them, and answering would
// keep the walsender, and so the postmaster, waiting for good: the relay's
// replies also keep wal_sender_timeout from ever firing. The wait is not
// cheap either: a logical walsender in WalSndDone does not sleep, and
// burns a core until its client confirms or goes away.
//
// So when reply requests keep coming, none more than waitGap after the
// previous one, for waitAfter, while messages are unacknowledged and the
// confirmed position is short of the server's, the session ends without a
// further status update. The slot stays where it was, the walsender exits,
// PostgreSQL stops, and the next session resumes from the slot: nothing is
// lost, unacknowledged messages are delivered again. Probing whether the
// postmaster refuses new connections (57P03) was the alternative; it needs a
// second connection and tells the state of the postmaster, not what this
// walsender waits for, while the reply requests are exactly that. A false
// alarm (a
// wal_sender_timeout under about two seconds, while the broker is down) costs
// a reconnect, never a message.
//
// A full Handler does not stop the reader from seeing this (waitRoom). Not
// covered: a Handler that blocks in one of its calls with room in its
// window (a sink whose Publish waits for its broker) stops the reader.
const (
	// replyGap is the least time between two replies to reply requests while
	// the confirmed position stands still. A walsender's own request
	// (wal_sender_timeout/2 without a reply) is still answered within it.
	replyGap = 250 * time.Millisecond
	// waitGap and waitAfter define reply requests that "keep coming": a
	// stopping walsender asks again within one replyGap of each reply.
	waitGap   = 4 * replyGap
	waitAfter = 2 * time.Second
)

// waitWatch recognises a run of reply requests that the relay cannot answer
// with the position the walsender waits for.
type waitWatch struct {
	gap, after  time.Duration
	first, last time.Time
}

// observe records a reply request received at now; stuck says whether the
// relay could not report the server's position then. It reports whether
// such requests have kept coming for at least w.after.
func (w *waitWatch) observe(now time.Time, stuck bool) bool {
	if !stuck {
		w.first, w.last = time.Time{}, time.Time{}
		return false
	}
	if w.last.IsZero() || now.Sub(w.last) > w.gap {
		w.first = now
	}
	w.last = now
	return now.Sub(w.first) >= w.after
}

// statusWriter sends standby status updates. It is the only writer on the
// replication connection while the stream runs, so the reader never blocks it.
type statusWriter struct {
	conn  *pgconn.PgConn
	h     Handler
	reply chan struct{}
	// replyEvery: every how many ticks a reply is requested.
	replyEvery int
	// silent, when set, is how long the reader has received nothing
	// (Stream.Silent); a tick after a silent interval asks for a reply.
	silent func() time.Duration

	mu       sync.Mutex
	lastSent time.Time // of the last status update
	lastPos  LSN       // reported by it
	closed   bool      // no status update may be sent any more
}

func (w *statusWriter) requestReply() {
	select {
	case w.reply <- struct{}{}:
	default:
	}
}

func (w *statusWriter) run(ctx context.Context, every time.Duration, log *zap.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	var held <-chan time.Time // a reply held back by replyGap
	for tick := 0; ; {
		ask := false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			tick++
			// Ask for a reply well within the reader's receive timeout, so
			// that the timeout only fires on a dead connection, and after
			// every silent interval, so that silence means a lost
			// connection within seconds (Stream.StallAfter).
			ask = tick%w.replyEvery == 0 || (w.silent != nil && w.silent() >= every)
		case <-w.reply:
			if wait := w.holdReply(time.Now()); wait > 0 {
				if held == nil {
					held = time.After(wait)
				}
				continue
			}
		case <-held:
		}
		held = nil
		if err := w.sendRequest(ctx, ask); err != nil {
			log.Warn("send standby status", zap.Error(err))
		}
	}
}

// holdReply returns how long a reply to a reply request waits: not at all
// when it reports a new position, else until replyGap has passed since the
// last status update.
func (w *statusWriter) holdReply(now time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lastSent.IsZero() || w.h.Confirmed() != w.lastPos {
		return 0
	}
	return max(0, w.lastSent.Add(replyGap).Sub(now))
}

// close stops every later status update.
func (w *statusWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

func (w *statusWriter) send(ctx context.Context) error { return w.sendRequest(ctx, false) }

func (w *statusWriter) sendRequest(ctx context.Context, replyRequested bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	pos := w.h.Confirmed()
	// All three positions are set: pglogrepl fills a zero flush or apply
	// position from the write position, which would confirm too much.
	err := pglogrepl.SendStandbyStatusUpdate(ctx, w.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pos,
		WALFlushPosition: pos,
		WALApplyPosition: pos,
		ClientTime:       time.Now(),
		ReplyRequested:   replyRequested,
	})
	if err == nil {
		w.lastSent, w.lastPos = time.Now(), pos
	}
	return err
}

// slotStart returns the slot's confirmed_flush_lsn, failing clearly when the
// slot is missing or has lost WAL.
func slotStart(ctx context.Context, conn *pgconn.PgConn, slot string) (LSN, error) {
	q := "SELECT confirmed_flush_lsn, coalesce(wal_status, ''), plugin FROM pg_replication_slots WHERE slot_name = " + quoteLiteral(slot)
	res, err := conn.Exec(ctx, q).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("read slot %q: %w", slot, err)
	}
	if len(res) == 0 || len(res[0].Rows) == 0 {
		return 0, &SetupError{Msg: fmt.Sprintf("replication slot %q does not exist; it was dropped while the relay ran, or the server is a new primary the slot did not follow: run `outboxrelay recover --config FILE` to re-create it and republish what was missed", slot)}
	}
	row := res[0].Rows[0]
	if ws := string(row[1]); ws == "lost" {
		return 0, LostSlot(slot)
	}
	if row[0] == nil {
		return 0, nil
	}
	lsn, err := pglogrepl.ParseLSN(string(row[0]))
	if err != nil {
		return 0, fmt.Errorf("parse confirmed_flush_lsn: %w", err)
	}
	return lsn, nil
}

// Retryable reports whether a replication session that failed with err is
// worth starting again: connection failures, server restarts and a slot held
// by another relay are; configuration and protocol errors are not.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	var re retryableErr
	if errors.As(err, &re) {
		return true
	}
	var se *SetupError
	if errors.As(err, &se) || errors.Is(err, ErrMalformed) || isHandlerErr(err) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			strings.HasPrefix(pgErr.Code, "57"), // operator intervention: shutdown, terminated backend
			strings.HasPrefix(pgErr.Code, "53"), // insufficient resources: too many connections
			pgErr.Code == "55006",               // object in use: the slot is active elsewhere
			pgErr.Code == "40001", pgErr.Code == "40P01":
			return true
		}
		return false
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	if pgconn.Timeout(err) || pgconn.SafeToRetry(err) {
		return true
	}
	// pgconn wraps dial failures ("failed to connect to ...") in its own types.
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr) || strings.Contains(err.Error(), "conn closed")
}

// IsSlotInUse reports whether err says the slot is active in another process.
func IsSlotInUse(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55006"
}
