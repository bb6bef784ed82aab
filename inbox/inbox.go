// Package inbox makes an outboxrelay consumer effectively-once: a message
// whose id a consumer has already processed never runs its handler again.
//
// The relay delivers every committed outbox row at least once. A relay
// restart, a rebalance, a consumer crash between its commit and its ack, a
// dlq replay or a recover delivers a message again. The inbox records each
// message id in the consumer's own database, in the same transaction as
// the handler's work:
//
//	in, err := inbox.New(pool, "billing", inbox.Config{})
//	res, err := in.Receive(ctx, raw, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
//		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + $1 WHERE id = $2", amount, id)
//		return err
//	})
//	// acknowledge the delivery only now, whatever res.Outcome is
//
// The record and the handler's writes commit together or not at all, so a
// crash leaves either nothing (the redelivery runs the handler) or both
// (the redelivery is a Duplicate and the handler does not run). Two
// deliveries of one message processed at the same time serialize on the
// record's primary key: the second waits for the first transaction and
// then sees the conflict.
//
// What the inbox cannot cover: a side effect outside the consumer's
// database (an HTTP call, an email) can still happen twice if the process
// dies after it and before the commit. Give such calls an idempotency key
// derived from Message.ID.
//
// A handler error is retried with exponential backoff and full jitter, up
// to Config.MaxAttempts; then the message becomes a dead letter and its
// aggregate is parked: later messages of the same aggregate are stored,
// in order, behind it, until Replay runs the chain. A message that cannot
// be decoded is a dead letter at once.
//
// Records are kept for Config.Retention (the dedupe window) and removed by
// Prune in bounded batches. A message older than the window can arrive
// only through a replay that reaches back further; Observer.Stale counts
// each.
//
// The core depends on pgx only. The runners (inbox/kafka, ...) are modules
// of their own, so that a Kafka consumer does not build an AMQP client.
package inbox

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is the database the inbox writes to: the consumer's own, where the
// handler's tables live. A *pgxpool.Pool satisfies it and is safe for
// concurrent use; a *pgx.Conn does too but serves one message at a time.
//
// With a pool, the inbox runs at most MaxConns-1 transactions at once, so
// that a handler that also writes through the pool (not through its tx)
// always finds a connection: were every connection held by the inbox's
// transactions, such a handler would wait for one forever. A handler may
// hold one such connection at a time; a pool of one connection is refused.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Handler does a message's work in tx, the transaction that records the
// message as processed. It must not commit or roll back tx. An error rolls
// everything back and counts as a failed attempt; wrap it with Permanent to
// dead-letter the message without retrying.
type Handler func(ctx context.Context, tx pgx.Tx, m Message) error

// Config configures an Inbox. The zero value uses the defaults.
type Config struct {
	// Schema holds the inbox tables; DefaultSchema ("inbox") by default.
	Schema string
	// Format is the relay's envelope format; FormatAuto by default.
	Format Format
	// MaxAttempts is how many times a handler runs for one delivery before
	// the message is dead-lettered; 5 by default.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the wait before a retry: attempt n
	// waits a random time in [0, min(MaxBackoff, MinBackoff·2^(n-1))).
	// 100ms and 30s by default.
	MinBackoff, MaxBackoff time.Duration
	// Retention is the dedupe window: how long Prune keeps a processed
	// record; 7 days by default. It must cover the longest redelivery you
	// run, dlq replay and recover --margin included (see the dedupe window in
	// docs/consumers.md).
	Retention time.Duration
	// ReplayInterval is how often the runners look for replays an
	// operator requested (`outboxrelay inbox dlq replay`, RequestReplay)
	// and run them (ReplayRequested); 5s by default.
	ReplayInterval time.Duration
	// Observer receives one call per event, for metrics.
	Observer Observer
}

// Observer is a set of hooks, each optional, called synchronously from the
// goroutine that processes the message; they must be fast and safe for
// concurrent use. The Prometheus wiring lives outside the core.
type Observer struct {
	// Processed: the handler ran and its transaction committed; took is
	// the time from the first attempt's begin to the commit.
	Processed func(m Message, took time.Duration)
	// Duplicate: the message was already processed (or stored), the handler
	// did not run.
	Duplicate func(m Message)
	// Retried: attempt failed with err and will be retried.
	Retried func(m Message, attempt int, err error)
	// DeadLettered: the message was stored as a dead letter. For a message
	// that could not be decoded, m holds only its ID, derived from the body.
	DeadLettered func(m Message, err error)
	// Parked: the message was stored behind a parked dead letter of its
	// aggregate.
	Parked func(m Message)
	// Stale: the message occurred longer ago than Config.Retention, so its
	// dedupe record may already be gone (it is processed all the same).
	Stale func(m Message)
	// Lag: the broker reports lag messages waiting for this consumer in
	// source (a Kafka topic/partition, a RabbitMQ queue, a NATS stream
	// consumer, a Redis stream group). The runners report it every
	// LagInterval of their Config (see each runner for what its broker
	// counts); it is called from the runner's own goroutine.
	Lag func(source string, lag int64)
}

// ReportLag passes a broker's lag for source to Observer.Lag, if set: the
// runners call it.
func (in *Inbox) ReportLag(source string, lag int64) {
	if f := in.cfg.Observer.Lag; f != nil {
		f(source, lag)
	}
}

// Outcome is what became of a message.
type Outcome int

const (
	// Processed: the handler ran and committed.
	Processed Outcome = iota + 1
	// Duplicate: the message was processed or stored before; nothing ran.
	Duplicate
	// Parked: stored behind its aggregate's dead letter, for Replay.
	Parked
	// DeadLettered: stored as a dead letter after the last attempt, or at
	// once when it could not be decoded.
	DeadLettered
)

func (o Outcome) String() string {
	switch o {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	case Parked:
		return "parked"
	case DeadLettered:
		return "dead-lettered"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Result reports one Process or Receive call. Every outcome is durable when
// it is returned, so the caller acknowledges the delivery for all of them.
type Result struct {
	Outcome  Outcome
	Message  Message
	Attempts int   // handler runs in this call
	Err      error // the last handler error, when DeadLettered
}

// Inbox processes messages for one consumer (a name that scopes the dedupe
// records: two services consuming the same topic use two names). It is
// safe for concurrent use; messages of one aggregate must be processed one
// at a time, in order, which the runners ensure.
type Inbox struct {
	db       DB
	consumer string
	cfg      Config
	q        queries
	// txs, with a pool, holds a token per transaction the inbox runs:
	// MaxConns-1 (DB). nil: no bound.
	txs chan struct{}
	// noDedupe leaves out the dedupe insert, for the test that shows the
	// tests see a double effect. Never set outside this package's tests.
	noDedupe bool
}

// New returns an Inbox for consumer on db. The tables must exist (Migrate).
func New(db DB, consumer string, cfg Config) (*Inbox, error) {
	if consumer == "" {
		return nil, errors.New("inbox: the consumer name is empty; name the consuming service")
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 5
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		return nil, fmt.Errorf("inbox: MaxBackoff %v is below MinBackoff %v; raise MaxBackoff", cfg.MaxBackoff, cfg.MinBackoff)
	}
	if cfg.Retention <= 0 {
		cfg.Retention = 7 * 24 * time.Hour
	}
	if cfg.ReplayInterval <= 0 {
		cfg.ReplayInterval = 5 * time.Second
	}
	in := &Inbox{db: db, consumer: consumer, cfg: cfg, q: newQueries(quoteSchema(cfg.Schema))}
	if p, ok := db.(interface{ Stat() *pgxpool.Stat }); ok {
		n := p.Stat().MaxConns()
		if n < 2 {
			return nil, fmt.Errorf("inbox: the pool has max_conns=%d, which the inbox's transaction holds whole, so a handler that writes through the pool would wait forever; raise pool_max_conns to 2 or more", n)
		}
		in.txs = make(chan struct{}, n-1)
	}
	return in, nil
}

// begin starts a transaction of the inbox once one of its MaxConns-1
// tokens is free (DB); end returns the token and must be called after the
// transaction ended, whatever happened.
func (in *Inbox) begin(ctx context.Context) (tx pgx.Tx, end func(), err error) {
	end = func() {}
	if in.txs != nil {
		select {
		case in.txs <- struct{}{}:
			end = func() { <-in.txs }
		case <-ctx.Done():
			return nil, nil, context.Cause(ctx)
		}
	}
	if tx, err = in.db.Begin(ctx); err != nil {
		end()
		return nil, nil, err
	}
	return tx, end, nil
}

// ReplayInterval returns Config.ReplayInterval, for the runners.
func (in *Inbox) ReplayInterval() time.Duration { return in.cfg.ReplayInterval }

// Consumer returns the consumer name.
func (in *Inbox) Consumer() string { return in.consumer }

// permanent marks a handler error that retrying cannot fix.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent wraps err so that the message is dead-lettered at once.
func Permanent(err error) error { return permanent{err} }

// Receive decodes raw and processes it as Process does. A message that
// cannot be decoded is stored as a dead letter at once, with the reason,
// and reported as DeadLettered. An error means nothing was decided (the
// database failed, or ctx ended): do not acknowledge the delivery.
func (in *Inbox) Receive(ctx context.Context, raw Raw, h Handler) (Result, error) {
	m, err := Decode(in.cfg.Format, raw)
	if err != nil {
		m = Message{ID: undecodableID(raw), Raw: raw}
		if _, err := in.insertDeadLetter(ctx, m, err, 0, "dead"); err != nil {
			return Result{}, err
		}
		if f := in.cfg.Observer.DeadLettered; f != nil {
			f(m, err)
		}
		return Result{Outcome: DeadLettered, Message: m, Err: err}, nil
	}
	return in.Process(ctx, m, h)
}

// undecodableID names an undecodable message by its content, so that its
// redelivery finds the same dead letter instead of adding another.
func undecodableID(raw Raw) string {
	h := sha256.New()
	h.Write(raw.Key)
	h.Write([]byte{0})
	h.Write(raw.Value)
	b, _ := json.Marshal(raw.Headers) // map keys are sorted: a stable hash
	h.Write(b)
	return "undecodable:" + hex.EncodeToString(h.Sum(nil)[:16])
}

// Process runs h for m in a transaction that records m as processed, unless
// it was processed before (Duplicate) or its aggregate is parked (Parked).
// A handler error rolls back and is retried; after the last attempt m
// becomes a dead letter and its aggregate is parked (DeadLettered).
//
// Every Result is durable when Process returns it. An error means nothing
// was decided for m: the inbox's own statements failed, a commit failed
// (it may have happened; the redelivery finds out), or ctx ended. Do not
// acknowledge the delivery then. Cancelling ctx rolls back the attempt in
// progress.
func (in *Inbox) Process(ctx context.Context, m Message, h Handler) (Result, error) {
	if m.ID == "" {
		return Result{}, errors.New("inbox: message has no id; decode it with Decode")
	}
	if f := in.cfg.Observer.Stale; f != nil && !m.OccurredAt.IsZero() && time.Since(m.OccurredAt) > in.cfg.Retention {
		f(m)
	}
	start := time.Now()
	for attempt := 1; ; attempt++ {
		out, herr, err := in.try(ctx, m, h, false, nil)
		if err != nil {
			return Result{}, err
		}
		if herr == nil {
			in.observe(out, m, start)
			return Result{Outcome: out, Message: m, Attempts: attempt}, nil
		}
		if ctx.Err() != nil {
			return Result{}, fmt.Errorf("process message %s: %w", m.ID, context.Cause(ctx))
		}
		var p permanent
		if attempt >= in.cfg.MaxAttempts || errors.As(herr, &p) {
			out, err := in.deadLetter(ctx, m, herr, attempt)
			if err != nil {
				return Result{}, err
			}
			if out == DeadLettered {
				if f := in.cfg.Observer.DeadLettered; f != nil {
					f(m, herr)
				}
			} else if f := in.cfg.Observer.Duplicate; f != nil {
				f(m)
			}
			return Result{Outcome: out, Message: m, Attempts: attempt, Err: herr}, nil
		}
		if f := in.cfg.Observer.Retried; f != nil {
			f(m, attempt, herr)
		}
		if err := sleep(ctx, in.backoff(attempt)); err != nil {
			return Result{}, fmt.Errorf("process message %s: %w", m.ID, err)
		}
	}
}

func (in *Inbox) observe(out Outcome, m Message, start time.Time) {
	o := in.cfg.Observer
	switch {
	case out == Processed && o.Processed != nil:
		o.Processed(m, time.Since(start))
	case out == Duplicate && o.Duplicate != nil:
		o.Duplicate(m)
	case out == Parked && o.Parked != nil:
		o.Parked(m)
	}
}

// backoff is full jitter: a uniform wait in [0, min(max, min·2^(n-1))).
func (in *Inbox) backoff(attempt int) time.Duration {
	ceil := in.cfg.MaxBackoff
	if attempt-1 < 32 {
		if d := in.cfg.MinBackoff << (attempt - 1); d > 0 && d < ceil {
			ceil = d
		}
	}
	return rand.N(ceil)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// try runs one attempt: claim m's id, run h, run then, commit. replay skips
// the parking check (the replay is what releases the aggregate). then, if
// set, runs in the same transaction after h, and also when m is a
// duplicate. herr is the handler's error (the attempt rolled back); err is
// the inbox's own failure.
func (in *Inbox) try(ctx context.Context, m Message, h Handler, replay bool, then func(pgx.Tx) error) (out Outcome, herr, err error) {
	tx, end, err := in.begin(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("process message %s: begin: %w", m.ID, err)
	}
	defer end()
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after Commit: a no-op

	out = Processed
	if !in.noDedupe {
		q := in.q.claim
		if replay {
			q = in.q.claimReplay
		}
		tag, err := tx.Exec(ctx, q, in.consumer, m.ID, m.AggregateType, m.AggregateID, m.EventType, nullTime(m.OccurredAt))
		if err != nil {
			return 0, nil, fmt.Errorf("process message %s: record it: %w", m.ID, err)
		}
		if tag.RowsAffected() == 0 {
			if out, err = in.notClaimed(ctx, tx, m, replay); err != nil {
				return 0, nil, err
			}
		}
	}
	if out == Processed {
		if err := call(ctx, tx, m, h); err != nil {
			return 0, fmt.Errorf("handler: %w", err), nil
		}
	}
	if then != nil && out != Parked {
		if err := then(tx); err != nil {
			return 0, nil, fmt.Errorf("process message %s: %w", m.ID, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		if out == Processed && errors.Is(err, pgx.ErrTxClosed) {
			// The handler committed or rolled back the transaction itself:
			// a failed attempt, whose retry finds the record or not.
			return 0, errors.New("the handler ended the inbox's transaction itself"), nil
		}
		// A constraint checked at commit (deferred) or a serialization
		// failure is the handler's: retry it. Anything else may or may not
		// have committed; the redelivery finds out.
		var pe *pgconn.PgError
		if out == Processed && errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "23") || strings.HasPrefix(pe.Code, "40")) {
			return 0, fmt.Errorf("commit: %w", err), nil
		}
		return 0, nil, fmt.Errorf("process message %s: commit: %w", m.ID, err)
	}
	return out, nil, nil
}

// call runs h, a panic in it being its error: a failed attempt, rolled
// back, retried and dead-lettered like any other, where an escaped panic
// would crash the runner on the same message after every restart.
func call(ctx context.Context, tx pgx.Tx, m Message, h Handler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	return h(ctx, tx, m)
}

// notClaimed decides why the claim inserted nothing: m was processed or
// dead-lettered before (Duplicate), or its aggregate is parked, and m is
// stored behind it in tx (Parked, or Duplicate if it was stored before).
func (in *Inbox) notClaimed(ctx context.Context, tx pgx.Tx, m Message, replay bool) (Outcome, error) {
	if replay {
		return Duplicate, nil
	}
	var known bool
	if err := tx.QueryRow(ctx, in.q.known, in.consumer, m.ID).Scan(&known); err != nil {
		return 0, fmt.Errorf("process message %s: look it up: %w", m.ID, err)
	}
	if known {
		return Duplicate, nil
	}
	key, body, headers := stored(m)
	tag, err := tx.Exec(ctx, in.q.park, in.consumer, m.AggregateType, m.AggregateID, m.ID, key, body, headers)
	if err != nil {
		return 0, fmt.Errorf("process message %s: park it: %w", m.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return Duplicate, nil
	}
	return Parked, nil
}

// deadLetter stores m after its last failed attempt, parking its aggregate
// when it has one. It reports Duplicate when m was processed meanwhile (by
// another consumer of the group, after a rebalance) or dead-lettered
// before.
func (in *Inbox) deadLetter(ctx context.Context, m Message, herr error, attempts int) (Outcome, error) {
	state := "parked"
	if m.AggregateType == "" && m.AggregateID == "" {
		state = "dead"
	}
	ok, err := in.insertDeadLetter(ctx, m, herr, attempts, state)
	if err != nil {
		return 0, err
	}
	if !ok {
		return Duplicate, nil
	}
	return DeadLettered, nil
}

func (in *Inbox) insertDeadLetter(ctx context.Context, m Message, reason error, attempts int, state string) (bool, error) {
	key, body, headers := stored(m)
	tag, err := in.db.Exec(ctx, in.q.deadLetter, in.consumer, m.ID, m.AggregateType, m.AggregateID,
		key, body, headers, storableReason(reason), attempts, state)
	if err != nil {
		return false, fmt.Errorf("store message %s as a dead letter: %w", m.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// stored is what the dead-letter and parked tables keep of m: the delivery
// as it arrived, or, for a Message built by hand, its envelope.
func stored(m Message) (key, body []byte, headers map[string]string) {
	if m.Raw.Value != nil || m.Raw.Headers != nil || m.Raw.Key != nil {
		h := m.Raw.Headers
		if h == nil {
			h = map[string]string{}
		}
		v := m.Raw.Value
		if v == nil {
			v = []byte{}
		}
		return m.Raw.Key, v, storableHeaders(h)
	}
	return []byte(m.AggregateID), envelopeOf(m), map[string]string{storedEnvelopeHeader: "1"}
}

// storedHeadersHeader holds, in place of the headers, headers that jsonb
// cannot hold (not UTF-8, or with a NUL byte): each name and value in
// base64, "name:value" pairs joined by commas.
const storedHeadersHeader = "x-outboxrelay-inbox-headers-base64"

// storableHeaders returns h as the jsonb column can hold it, losslessly:
// as it is, or, if any name or value is not UTF-8 text without NUL bytes,
// encoded under storedHeadersHeader. restoreHeaders reverses it.
func storableHeaders(h map[string]string) map[string]string {
	ok := func(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }
	clean := true
	for k, v := range h {
		clean = clean && ok(k) && ok(v)
	}
	if clean {
		return h
	}
	pairs := make([]string, 0, len(h))
	for k, v := range h {
		pairs = append(pairs, base64.StdEncoding.EncodeToString([]byte(k))+":"+base64.StdEncoding.EncodeToString([]byte(v)))
	}
	slices.Sort(pairs)
	return map[string]string{storedHeadersHeader: strings.Join(pairs, ",")}
}

// restoreHeaders reverses storableHeaders.
func restoreHeaders(h map[string]string) (map[string]string, error) {
	enc, ok := h[storedHeadersHeader]
	if !ok {
		return h, nil
	}
	out := map[string]string{}
	for _, pair := range strings.Split(enc, ",") {
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, ":")
		kb, err := base64.StdEncoding.DecodeString(k)
		if err != nil {
			return nil, fmt.Errorf("stored headers: %w", err)
		}
		vb, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return nil, fmt.Errorf("stored headers: %w", err)
		}
		out[string(kb)] = string(vb)
	}
	return out, nil
}

// storableReason is err's text as a text column holds it.
func storableReason(err error) string {
	return strings.ReplaceAll(strings.ToValidUTF8(err.Error(), "\uFFFD"), "\x00", `\x00`)
}

// storedEnvelopeHeader marks a stored body that the inbox encoded itself,
// as an envelope, whatever Config.Format says.
const storedEnvelopeHeader = "x-outboxrelay-inbox-envelope"

// decodeStored decodes a dead letter's or a parked message's body.
func (in *Inbox) decodeStored(raw Raw) (Message, error) {
	h, err := restoreHeaders(raw.Headers)
	if err != nil {
		return Message{}, err
	}
	raw.Headers = h
	if raw.Headers[storedEnvelopeHeader] != "" {
		return Decode(FormatEnvelope, raw)
	}
	return Decode(in.cfg.Format, raw)
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

type queries struct {
	claim, claimAll, claimReplay, known, park, deadLetter string
	schema                                                string
}

func newQueries(s string) queries {
	q := queries{schema: s}
	r := strings.NewReplacer("{s}", s)
	// The claim inserts the dedupe record unless the aggregate is parked.
	// FOR SHARE makes it wait for a replay that is releasing the aggregate
	// (Replay updates the dead letter's state), and then re-read the state:
	// a message is either parked before the release looks at the parked
	// table, or processed after the release.
	q.claim = r.Replace(`WITH held AS (
	SELECT 1 FROM {s}.dead_letters
	WHERE consumer = $1 AND aggregate_type = $3 AND aggregate_id = $4 AND state = 'parked'
	FOR SHARE
)
INSERT INTO {s}.processed (consumer, message_id, aggregate_type, aggregate_id, event_type, occurred_at)
SELECT $1, $2, $3, $4, $5, $6 WHERE NOT EXISTS (SELECT 1 FROM held)
ON CONFLICT (consumer, message_id) DO NOTHING`)
	// claimAll is claim for a batch: the arrays are the messages' ids,
	// aggregate types and ids, event types and times. A message listed
	// twice is inserted once.
	q.claimAll = r.Replace(`WITH batch AS (
	SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[])
		AS b (message_id, aggregate_type, aggregate_id, event_type, occurred_at)
), held AS (
	SELECT aggregate_type, aggregate_id FROM {s}.dead_letters
	WHERE consumer = $1 AND state = 'parked'
	AND (aggregate_type, aggregate_id) IN (SELECT aggregate_type, aggregate_id FROM batch)
	FOR SHARE
)
INSERT INTO {s}.processed (consumer, message_id, aggregate_type, aggregate_id, event_type, occurred_at)
SELECT $1, b.message_id, b.aggregate_type, b.aggregate_id, b.event_type, b.occurred_at FROM batch b
WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.aggregate_type = b.aggregate_type AND h.aggregate_id = b.aggregate_id)
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING message_id`)
	q.claimReplay = r.Replace(`INSERT INTO {s}.processed (consumer, message_id, aggregate_type, aggregate_id, event_type, occurred_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (consumer, message_id) DO NOTHING`)
	q.known = r.Replace(`SELECT EXISTS (SELECT 1 FROM {s}.processed WHERE consumer = $1 AND message_id = $2)
	OR EXISTS (SELECT 1 FROM {s}.dead_letters WHERE consumer = $1 AND message_id = $2)`)
	q.park = r.Replace(`INSERT INTO {s}.parked (consumer, aggregate_type, aggregate_id, message_id, record_key, body, headers)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (consumer, message_id) DO NOTHING`)
	q.deadLetter = r.Replace(`INSERT INTO {s}.dead_letters (consumer, message_id, aggregate_type, aggregate_id, record_key, body, headers, error, attempts, state)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10
WHERE NOT EXISTS (SELECT 1 FROM {s}.processed WHERE consumer = $1 AND message_id = $2)
ON CONFLICT (consumer, message_id) WHERE message_id <> '' DO NOTHING`)
	return q
}
