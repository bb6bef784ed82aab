// Package replicas shares the pipelines of one configuration among the
// relay processes (replicas) that run it, so that the load spreads.
//
// Which replica streams a pipeline is still decided by PostgreSQL: a slot
// streams to one connection at a time, and the others wait as standbys.
// A Group only keeps this replica from taking more than its share,
// ceil(pipelines / live replicas), and says when it holds more than that
// (a replica joined), so that it hands the excess back.
//
// The replicas count each other in one database (the first pipeline's):
// each holds a session-level shared advisory lock on a key named after the
// configuration's pipelines and slots, and counts the holders in pg_locks.
// A replica that dies loses its session, and so its lock, at once, even by
// kill -9. Replicas of another configuration hold another key and are not
// counted. Counting too few is safe (each takes more); counting too many
// could leave a pipeline to nobody, and cannot happen: a lock is counted
// only while its holder's session lives. When the database does not
// answer, a Group counts itself alone and takes what it can.
//
// A pipeline that no replica with room serves (the one with room cannot
// reach its database, say) is taken above its share by one that can
// (TakeAbove): such a rescue is not handed back by the balance, so that
// the replicas do not pass pipelines round in turn.
package replicas

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// Config is where and under which key the replicas count each other.
type Config struct {
	// URL is the database where the replicas count each other.
	URL string
	// Key names the configuration: its pipelines and slots (Key).
	Key string
	// Pipelines is how many pipelines the configuration has.
	Pipelines int
}

// KeyOf is the Config.Key of a configuration with these pipelines, each
// "name=slot".
func KeyOf(pipelines []string) string {
	s := append([]string(nil), pipelines...)
	sort.Strings(s)
	return strings.Join(s, ",")
}

// Group is this replica's membership. Safe for concurrent use.
type Group struct {
	poll time.Duration
	log  *zap.Logger

	mu      sync.Mutex
	cfg     Config
	live    int // the replicas counted, this one among them; 1 until counted
	held    int // sessions this replica streams or is starting, rescues among them
	rescued int // sessions taken above the share (TakeAbove)
	room    chan struct{}
}

// New returns the Group of cfg, counting every poll; it starts nothing.
func New(cfg Config, poll time.Duration, log *zap.Logger) *Group {
	if log == nil {
		log = zap.NewNop()
	}
	return &Group{cfg: cfg, poll: poll, log: log, live: 1}
}

// Set replaces the configuration (a reload); Run moves to the new key.
func (g *Group) Set(cfg Config) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cfg = cfg
}

// Share is what a replica knows of the others, in GET /status.
type Share struct {
	// Live is how many replicas of this configuration run, this one among them.
	Live int `json:"live"`
	// Quota is ceil(pipelines / live): the most this replica streams.
	Quota int `json:"quota"`
	// Held is how many this replica streams (or is starting) now.
	Held int `json:"held"`
	// Rescued is how many of those it took above its share, because no
	// replica with room served them.
	Rescued int `json:"rescued"`
}

// Share reads the counts.
func (g *Group) Share() Share {
	g.mu.Lock()
	defer g.mu.Unlock()
	return Share{Live: g.live, Quota: g.quota(), Held: g.held, Rescued: g.rescued}
}

// quota is ceil(pipelines / live), at least 1; g.mu is held.
func (g *Group) quota() int {
	return max(1, (g.cfg.Pipelines+g.live-1)/g.live)
}

// Room is closed when this replica may have room again (a release, or
// fewer replicas counted), and already closed while it has room: a
// waiting stream tries at once rather than at its next poll (cdc.Gate).
func (g *Group) Room() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held-g.rescued < g.quota() {
		return closed
	}
	if g.room == nil {
		g.room = make(chan struct{})
	}
	return g.room
}

// closed is Room's answer while there is room.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// wake closes Room's channel; g.mu is held.
func (g *Group) wake() {
	if g.room != nil {
		close(g.room)
		g.room = nil
	}
}

// Take reserves room for one slot's session (cdc.Gate); false when this
// replica holds its share.
func (g *Group) Take() (release func(), ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held-g.rescued >= g.quota() {
		return nil, false
	}
	g.held++
	return g.releaser(false), true
}

// TakeAbove reserves room for one slot's session above the share: no
// replica with room serves that slot (cdc.Gate).
func (g *Group) TakeAbove() (release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held++
	g.rescued++
	return g.releaser(true)
}

// releaser gives back, once, what Take or TakeAbove reserved; g.mu is held.
func (g *Group) releaser(rescued bool) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.held--
			if rescued {
				g.rescued--
			}
			g.wake()
		})
	}
}

// Excess is how many more slots this replica streams than its share:
// more than 0 after another replica joined. Rescues do not count: no other
// replica served them.
func (g *Group) Excess() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held - g.rescued - g.quota()
}

// Run holds this replica's lock and counts the replicas every poll until
// ctx ends; a lost connection is retried after a poll, and counts this
// replica alone meanwhile. It returns nil when ctx ends.
func (g *Group) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		err := g.member(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			continue // Set changed the configuration
		}
		g.setLive(1)
		g.log.Warn("replicas: cannot count the other replicas; this one takes what it can meanwhile", zap.Error(err))
		select {
		case <-ctx.Done():
		case <-time.After(g.poll):
		}
	}
	return nil
}

// lockKey is the pair of int4 keys of the shared advisory lock.
const lockKey = "hashtext('outboxrelay.replicas'), hashtext($1)"

// member holds the lock of one configuration and counts, until ctx ends,
// the connection fails or Set changes the configuration (nil).
func (g *Group) member(ctx context.Context) error {
	g.mu.Lock()
	cfg := g.cfg
	g.mu.Unlock()
	pcfg, err := pgx.ParseConfig(cfg.URL)
	if err != nil {
		return fmt.Errorf("the first pipeline's postgres.url: %v", err)
	}
	pcfg.RuntimeParams["application_name"] = "outboxrelay replicas"
	pcfg.ConnectTimeout = 10 * time.Second
	conn, err := pgx.ConnectConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect to the first pipeline's database: %v", err)
	}
	// Closing the session releases the lock.
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock_shared("+lockKey+")", cfg.Key); err != nil {
		return fmt.Errorf("take the replicas' shared advisory lock: %v", err)
	}
	for {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND objsubid = 2
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND classid = hashtext('outboxrelay.replicas')::oid AND objid = hashtext($1)::oid`, cfg.Key).Scan(&n)
		if err != nil {
			return fmt.Errorf("count the replicas: %v", err)
		}
		g.setLive(max(n, 1))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(g.poll):
		}
		g.mu.Lock()
		same := g.cfg.URL == cfg.URL && g.cfg.Key == cfg.Key
		g.mu.Unlock()
		if !same {
			return nil
		}
	}
}

// setLive records the count and logs a change.
func (g *Group) setLive(n int) {
	g.mu.Lock()
	changed := n != g.live
	if n < g.live {
		g.wake() // a larger share
	}
	g.live = n
	quota, pipelines := g.quota(), g.cfg.Pipelines
	g.mu.Unlock()
	if changed {
		g.log.Info("replicas: the live replicas changed", zap.Int("live", n), zap.Int("pipelines", pipelines), zap.Int("quota", quota))
	}
}
