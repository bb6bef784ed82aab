// Package redis runs an inbox over a Redis Streams consumer group
// (go-redis v9).
//
// The Runner reads a stream as one consumer of a group (XREADGROUP),
// processes each entry through inbox.Inbox.Receive and acknowledges it
// (XACK) only when Receive returned a durable outcome. Entries of one
// aggregate (the aggregate_type and aggregate_id fields the relay writes)
// run one at a time in stream order, different aggregates in parallel, at
// most Config.MaxInFlight read and unfinished. While a handler runs, the
// Runner resets its entries' idle time, so that another consumer's
// XAUTOCLAIM does not take a slow handler's entry meanwhile.
//
// Entries a dead consumer read and never acknowledged stay pending in the
// group. A starting Runner first takes its own pending entries (a restart
// under the same Config.Consumer) and claims every other consumer's once
// it has been idle for Config.MinIdle (XAUTOCLAIM), and reads new entries
// only after that: an aggregate's older entry, pending with a dead
// consumer, runs before its newer ones. While running, it claims entries
// idle for MinIdle every Config.ClaimInterval, for groups that several
// processes read.
//
// Order across processes: Redis spreads a group's entries over every
// consumer that reads; run one process per group (or split aggregates over
// streams and groups) when per-aggregate order matters.
//
// This package is a module of its own so that a Redis consumer's module
// graph holds no Kafka, AMQP or NATS client.
package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/dispatch"
)

// Field names of the relay's stream entries (sinks/redis).
const (
	fieldEnvelope      = "envelope"
	fieldHeaders       = "headers"
	fieldAggregateID   = "aggregate_id"
	fieldAggregateType = "aggregate_type"
)

// Config configures a Runner.
type Config struct {
	// URL names the Redis server: redis://, rediss:// or unix://.
	URL string
	// Stream and Group name the stream and an existing consumer group
	// (XGROUP CREATE stream group 0).
	Stream, Group string
	// Consumer is this process's name in the group; host-pid by default.
	// A restart under the same name takes its pending entries at once;
	// under a new name they come back after MinIdle.
	Consumer string
	// MaxInFlight bounds the entries read and not finished; 64 by default.
	MaxInFlight int
	// MinIdle is how long an entry stays pending with another consumer
	// before this one claims it (XAUTOCLAIM); 30s by default. A running
	// handler's entries are kept fresh every MinIdle/3, so it bounds how
	// long a dead consumer's entries wait, not how long a handler may run.
	MinIdle time.Duration
	// ClaimInterval is how often a running Runner claims entries idle for
	// MinIdle; MinIdle by default.
	ClaimInterval time.Duration
	// Block is how long one XREADGROUP waits for new entries; 1s by
	// default. A stop waits for it at most this long.
	Block time.Duration
	// Batch > 1 turns on batch mode: up to Batch entries, of any
	// aggregates, are processed in one transaction (inbox.ReceiveBatch),
	// each aggregate's in stream order, and acknowledged by one XACK only
	// after the commit. An entry whose handler fails falls back to its own
	// transaction (retries, then a dead letter) without failing the
	// others. Keep it at or below MaxInFlight; 0 or 1: one transaction per
	// entry.
	Batch int
	// LagInterval is how often the group's lag, the entries it has not
	// finished (XINFO GROUPS: lag, not yet read by the group, plus
	// pending, read and not acknowledged), goes to the inbox's
	// Observer.Lag, source stream/group; 10s by default. A reading Redis
	// cannot give (lag unknown after an XDEL or XSETID) is skipped.
	LagInterval time.Duration
	// DrainTimeout is how long a stop waits for running handlers before
	// abandoning them (not acknowledged: they stay pending, and come back
	// to this consumer name at once, to others after MinIdle); 10s by
	// default.
	DrainTimeout time.Duration
	// Logger, nil for none.
	Logger *slog.Logger
}

// Runner consumes one consumer group into one Inbox.
type Runner struct {
	cfg Config
	in  *inbox.Inbox
	h   inbox.Handler
	log *slog.Logger
	opt *goredis.Options
}

// New returns a Runner; it starts nothing, Run does.
func New(in *inbox.Inbox, h inbox.Handler, cfg Config) (*Runner, error) {
	switch {
	case cfg.URL == "":
		return nil, errors.New("redis inbox: no URL; set Config.URL")
	case cfg.Stream == "" || cfg.Group == "":
		return nil, errors.New("redis inbox: no stream or group; set Config.Stream and Config.Group")
	}
	opt, err := goredis.ParseURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("redis inbox: URL: %w; use redis://host:6379", err)
	}
	if cfg.Consumer == "" {
		host, _ := os.Hostname()
		cfg.Consumer = host + "-" + strconv.Itoa(os.Getpid())
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 64
	}
	if cfg.MinIdle <= 0 {
		cfg.MinIdle = 30 * time.Second
	}
	if cfg.ClaimInterval <= 0 {
		cfg.ClaimInterval = cfg.MinIdle
	}
	if cfg.Block <= 0 {
		cfg.Block = time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.LagInterval <= 0 {
		cfg.LagInterval = 10 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Runner{cfg: cfg, in: in, h: h, log: log, opt: opt}, nil
}

// Run consumes until ctx is cancelled, then stops reading, waits up to
// DrainTimeout for running handlers, acknowledges what finished and
// returns nil. A group that does not exist is an error; a lost connection
// is retried.
//
// Beside the deliveries, every inbox.Config.ReplayInterval, it runs the
// replays an operator requested for the inbox's consumer
// (`outboxrelay inbox dlq replay`; inbox.Inbox.ReplayRequested).
func (r *Runner) Run(ctx context.Context) error {
	// Replays an operator requested (outboxrelay inbox dlq replay) run
	// beside the deliveries, with this runner's handler.
	defer dispatch.StartReplays(ctx, r.in, r.h, r.log, what)()
	rdb := goredis.NewClient(r.opt)
	defer rdb.Close()
	if err := r.checkGroup(ctx, rdb); err != nil {
		return err
	}
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	s := &session{r: r, rdb: rdb, ctx: workCtx, running: map[string]bool{}}
	s.d = r.dispatcher(s)
	touched := make(chan struct{})
	go func() { defer close(touched); s.touch() }()
	lagged := make(chan struct{})
	go func() { defer close(lagged); s.reportLag() }()

	err := s.recover(ctx)
	if err == nil {
		s.read(ctx)
	}
	if !s.d.Drain(r.cfg.DrainTimeout) {
		r.log.Warn("redis inbox: drain timeout; abandoning the handlers still running")
	}
	cancelWork()
	s.d.Close()
	<-touched
	<-lagged
	return err
}

func (r *Runner) checkGroup(ctx context.Context, rdb *goredis.Client) error {
	groups, err := rdb.XInfoGroups(ctx, r.cfg.Stream).Result()
	if err != nil && !strings.Contains(err.Error(), "no such key") {
		return fmt.Errorf("redis inbox: groups of stream %s: %w", r.cfg.Stream, err)
	}
	for _, g := range groups {
		if g.Name == r.cfg.Group {
			return nil
		}
	}
	return fmt.Errorf("redis inbox: stream %s has no consumer group %s; create it with XGROUP CREATE %s %s 0 MKSTREAM",
		r.cfg.Stream, r.cfg.Group, r.cfg.Stream, r.cfg.Group)
}

type session struct {
	r       *Runner
	rdb     *goredis.Client
	ctx     context.Context // the handlers'; outlives Run's ctx by the drain
	d       *dispatch.Dispatcher[goredis.XMessage]
	mu      sync.Mutex
	running map[string]bool // entry ids taken and not finished
}

// recover takes the entries pending in the group before any new one: this
// consumer's own at once, every other consumer's once XAUTOCLAIM can claim
// it. They are dispatched in stream order only when all are held, so that
// an entry claimed late cannot run after a newer entry of its aggregate.
func (s *session) recover(ctx context.Context) error {
	cfg := s.r.cfg
	var held []goredis.XMessage
	ids := map[string]bool{}
	hold := func(ms []goredis.XMessage) {
		for _, m := range ms {
			if !ids[m.ID] {
				ids[m.ID] = true
				held = append(held, m)
			}
		}
	}
	for start := "0"; ; {
		res, err := s.rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{Group: cfg.Group, Consumer: cfg.Consumer,
			Streams: []string{cfg.Stream, start}, Count: 1000}).Result()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("redis inbox: read pending entries of %s: %w", cfg.Consumer, err)
		}
		if len(res) == 0 || len(res[0].Messages) == 0 {
			break
		}
		ms := res[0].Messages
		hold(ms)
		start = ms[len(ms)-1].ID
	}
	// The entries other consumers hold now: each is either acknowledged by
	// its (live) owner or claimed here once idle for MinIdle.
	others, err := s.pending(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	for id := range ids {
		delete(others, id)
	}
	if len(others) > 0 {
		s.r.log.Info("redis inbox: claiming the entries other consumers left pending before reading new ones",
			"pending", len(others), "min_idle", cfg.MinIdle)
	}
	for len(others) > 0 {
		ms, err := s.claim(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		hold(ms)
		now, err := s.pending(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for id := range others {
			if ids[id] || !now[id] {
				delete(others, id)
			}
		}
		if len(others) > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(min(cfg.MinIdle/4, time.Second)):
			}
		}
	}
	slices.SortFunc(held, func(a, b goredis.XMessage) int { return compareIDs(a.ID, b.ID) })
	for _, m := range held {
		if !s.wait(ctx) {
			return nil
		}
		s.take(m)
	}
	return nil
}

// pending returns the ids of the entries pending in the group.
func (s *session) pending(ctx context.Context) (map[string]bool, error) {
	cfg := s.r.cfg
	ids := map[string]bool{}
	for start := "-"; ; {
		ps, err := s.rdb.XPendingExt(ctx, &goredis.XPendingExtArgs{Stream: cfg.Stream, Group: cfg.Group,
			Start: start, End: "+", Count: 1000}).Result()
		if err != nil {
			return nil, fmt.Errorf("redis inbox: pending entries of group %s: %w", cfg.Group, err)
		}
		for _, p := range ps {
			ids[p.ID] = true
		}
		if len(ps) < 1000 {
			return ids, nil
		}
		start = "(" + ps[len(ps)-1].ID
	}
}

// claim takes, for this consumer, every entry pending for MinIdle or more,
// in stream order.
func (s *session) claim(ctx context.Context) ([]goredis.XMessage, error) {
	cfg := s.r.cfg
	var all []goredis.XMessage
	for start := "0-0"; ; {
		ms, next, err := s.rdb.XAutoClaim(ctx, &goredis.XAutoClaimArgs{Stream: cfg.Stream, Group: cfg.Group,
			Consumer: cfg.Consumer, MinIdle: cfg.MinIdle, Start: start, Count: 100}).Result()
		if err != nil {
			return nil, fmt.Errorf("redis inbox: claim idle entries of group %s: %w", cfg.Group, err)
		}
		all = append(all, ms...)
		if next == "0-0" || next == "" {
			return all, nil
		}
		start = next
	}
}

// wait blocks while MaxInFlight entries are unfinished; false when ctx
// ended.
func (s *session) wait(ctx context.Context) bool { return s.d.Wait(ctx) > 0 }

// read reads new entries, and claims idle ones every ClaimInterval, until
// ctx ends.
func (s *session) read(ctx context.Context) {
	cfg := s.r.cfg
	lastClaim := time.Now()
	wait := 100 * time.Millisecond
	for s.wait(ctx) {
		if time.Since(lastClaim) >= cfg.ClaimInterval {
			lastClaim = time.Now()
			ms, err := s.claim(ctx)
			if err != nil && ctx.Err() == nil {
				s.r.log.Warn("redis inbox: claim failed", "error", err)
			}
			for _, m := range ms {
				s.take(m) // one of its own running entries is skipped
			}
		}
		room := s.d.Wait(ctx)
		res, err := s.rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{Group: cfg.Group, Consumer: cfg.Consumer,
			Streams: []string{cfg.Stream, ">"}, Count: int64(max(room, 1)), Block: cfg.Block}).Result()
		if errors.Is(err, goredis.Nil) {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.r.log.Warn("redis inbox: read failed, retrying", "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, 10*time.Second)
			continue
		}
		wait = 100 * time.Millisecond
		for _, st := range res {
			for _, m := range st.Messages {
				s.take(m)
			}
		}
	}
}

// take queues m behind the unfinished entries of its aggregate, unless it
// is one of them already (claimed back from this very consumer).
func (s *session) take(m goredis.XMessage) {
	s.mu.Lock()
	if s.running[m.ID] {
		s.mu.Unlock()
		return
	}
	s.running[m.ID] = true
	s.mu.Unlock()
	s.d.Take(aggregateKey(m), m)
}

func aggregateKey(m goredis.XMessage) string {
	t, _ := m.Values[fieldAggregateType].(string)
	id, _ := m.Values[fieldAggregateID].(string)
	return t + "\x00" + id
}

const what = "redis inbox"

// dispatcher runs entries through the inbox, one at a time per aggregate
// or in batches, and acknowledges them (XACK) once their outcome is
// durable. An entry dropped or abandoned stays pending: read again by this
// consumer name, or claimed by another after MinIdle.
func (r *Runner) dispatcher(s *session) *dispatch.Dispatcher[goredis.XMessage] {
	ack := func(ms []goredis.XMessage) {
		if len(ms) == 0 {
			return
		}
		ids := make([]string, len(ms))
		for i, m := range ms {
			ids[i] = m.ID
		}
		actx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
		defer cancel()
		if err := s.rdb.XAck(actx, r.cfg.Stream, r.cfg.Group, ids...).Err(); err != nil {
			// Still pending: claimed again after MinIdle, and the inbox
			// reports that delivery as a duplicate.
			r.log.Warn("redis inbox: ack failed", "entries", len(ids), "error", err)
		}
	}
	forget := func(ms ...goredis.XMessage) {
		s.mu.Lock()
		for _, m := range ms {
			delete(s.running, m.ID)
		}
		s.mu.Unlock()
	}
	return dispatch.New(dispatch.Config[goredis.XMessage]{
		MaxInFlight: r.cfg.MaxInFlight,
		Batch:       r.cfg.Batch,
		Process: func(m goredis.XMessage) bool {
			_, ok := dispatch.Receive(s.ctx, r.in, r.h, r.log, what, Raw(m))
			if ok {
				ack([]goredis.XMessage{m})
			}
			return ok
		},
		ProcessBatch: func(ms []goredis.XMessage) []bool {
			rs := dispatch.ReceiveBatch(s.ctx, r.in, r.h, r.log, what, ms, Raw)
			oks := make([]bool, len(ms))
			var done []goredis.XMessage
			for i, m := range ms {
				if oks[i] = rs[i].Outcome != 0; oks[i] {
					done = append(done, m)
				}
			}
			ack(done)
			return oks
		},
		Done:    func(m goredis.XMessage, _ bool) { forget(m) },
		Dropped: func(ms []goredis.XMessage) { forget(ms...) },
	})
}

// touch resets the idle time of the entries being processed every third of
// MinIdle (XCLAIM to this consumer, JUSTID), so that a slow handler's
// entry is not claimed by another consumer meanwhile.
func (s *session) touch() {
	t := time.NewTicker(s.r.cfg.MinIdle / 3)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		ids := make([]string, 0, len(s.running))
		for id := range s.running {
			ids = append(ids, id)
		}
		s.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		err := s.rdb.XClaimJustID(s.ctx, &goredis.XClaimArgs{Stream: s.r.cfg.Stream, Group: s.r.cfg.Group,
			Consumer: s.r.cfg.Consumer, Messages: ids}).Err()
		if err != nil && s.ctx.Err() == nil {
			s.r.log.Warn("redis inbox: resetting the idle time of running entries failed", "error", err)
		}
	}
}

// reportLag reports the group's lag every LagInterval until the session's
// work ends.
func (s *session) reportLag() {
	cfg := s.r.cfg
	t := time.NewTicker(cfg.LagInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		groups, err := s.rdb.XInfoGroups(s.ctx, cfg.Stream).Result()
		if err != nil {
			if s.ctx.Err() == nil {
				s.r.log.Warn("redis inbox: groups of the stream, for the lag", "error", err)
			}
			continue
		}
		for _, g := range groups {
			if g.Name == cfg.Group && g.Lag >= 0 {
				s.r.in.ReportLag(cfg.Stream+"/"+cfg.Group, g.Lag+g.Pending)
			}
		}
	}
}

// compareIDs orders stream entry ids ("ms-seq").
func compareIDs(a, b string) int {
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	an, _ := strconv.ParseUint(am, 10, 64)
	bn, _ := strconv.ParseUint(bm, 10, 64)
	if c := cmpUint(an, bn); c != 0 {
		return c
	}
	an, _ = strconv.ParseUint(as, 10, 64)
	bn, _ = strconv.ParseUint(bs, 10, 64)
	return cmpUint(an, bn)
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Raw maps a stream entry the relay wrote onto the inbox's
// broker-independent input: the envelope field as the body, every other
// field as a header, and the row's headers (the headers field, a JSON
// object) as headers of their own, where they do not collide with a
// field. The aggregate_id field is the record key, as the debezium and
// CloudEvents binary formats expect it.
func Raw(m goredis.XMessage) inbox.Raw {
	h := make(map[string]string, len(m.Values))
	var value []byte
	for k, v := range m.Values {
		s, _ := v.(string)
		switch k {
		case fieldEnvelope:
			value = []byte(s)
		case fieldHeaders:
		default:
			h[k] = s
		}
	}
	if s, _ := m.Values[fieldHeaders].(string); s != "" {
		var row map[string]json.RawMessage
		if err := json.Unmarshal([]byte(s), &row); err == nil {
			for k, v := range row {
				if _, taken := h[k]; taken {
					continue
				}
				var str string
				if json.Unmarshal(v, &str) == nil {
					h[k] = str
				} else {
					h[k] = string(v)
				}
			}
		} else {
			// Not the relay's: kept as it came, so the message stays
			// whole in a dead letter.
			h[fieldHeaders] = s
		}
	}
	var key []byte
	if id, ok := h[fieldAggregateID]; ok {
		key = []byte(id)
	}
	return inbox.Raw{Key: key, Value: value, Headers: h}
}
