package app

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/internal/admin"
	"github.com/outboxrelay/outboxrelay/internal/backoff"
	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/console"
	"github.com/outboxrelay/outboxrelay/internal/metrics"
	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/internal/replicas"
	"github.com/outboxrelay/outboxrelay/internal/store"
)

// The states of a pipeline in a Process.
const (
	StateStarting = "starting" // its App connects, checks and opens
	StateRunning  = "running"  // its slot exists and it streams (or waits as a standby)
	StateFailed   = "failed"   // its App stopped with an error; it restarts after a backoff
	StateStopped  = "stopped"  // the process is stopping, or a fatal pipeline failed
	StatePaused   = "paused"   // paused through the management API: drained, position confirmed, slot kept
)

// Restart waits of a failed pipeline: from RestartMin, doubling, up to
// RestartMax; a pipeline that ran for RestartMax starts again at RestartMin.
var (
	RestartMin = time.Second
	RestartMax = time.Minute
)

// Process runs the pipelines of one configuration (config.Config.Units),
// each as an App of its own, with one HTTP endpoint for all of them.
// A pipeline that fails is restarted alone, after a backoff, and the
// others go on; a pipeline marked fatal stops the whole process instead.
type Process struct {
	cfg     config.Config // http and log stay those of the first configuration
	log     *zap.Logger
	opts    Options
	reg     *prometheus.Registry
	srv     *admin.Server
	reloads chan reloadRequest
	ended   chan struct{} // closed when Run returns
	group   *replicas.Group
	// sessions are the console's sign-ins; history the figures its lag
	// chart draws, sampled while the HTTP endpoint serves.
	sessions *console.Sessions
	history  *console.History

	mu     sync.Mutex
	units  []*unit       // in configuration order; Reload replaces it
	reload *ReloadStatus // the last reload, nil before the first
}

// unit is one pipeline of a Process and its current App.
type unit struct {
	config.Unit
	mu       sync.Mutex
	app      *App // nil between attempts
	state    string
	err      error // the last failure, kept until it runs again
	failures int
	since    time.Time          // when state was entered
	paused   bool               // asked to pause, until resumed
	cancel   context.CancelFunc // stops the current attempt
	changed  chan struct{}      // closed and replaced on every change

	// Set by Process.Run when it starts the unit's supervisor: stop ends
	// it (a reload removed or changed the pipeline), done is closed once
	// it has returned, its App drained.
	stop context.CancelFunc
	done chan struct{}
	// shed is set when the process hands this pipeline to another
	// replica: its App drains and starts again, as a standby.
	shed bool
	// offline is the pool the API reads u's database through while no
	// App is wired (offlineDB); offlineClosed once u's supervisor returned.
	offline       *pgxpool.Pool
	offlineClosed bool
}

// NewProcess checks what can be checked without connecting (each
// pipeline's schema folder) and returns the Process.
func NewProcess(cfg config.Config, log *zap.Logger, opts Options) (*Process, error) {
	if log == nil {
		log = zap.NewNop()
	}
	units, err := newUnits(cfg)
	if err != nil {
		return nil, err
	}
	group := replicas.New(shareOf(cfg), SharePoll, log.Named("replicas"))
	return &Process{cfg: cfg, log: log, opts: opts, units: units, group: group,
		sessions: console.NewSessions(), history: console.NewHistory(historyLength()),
		reloads: make(chan reloadRequest), ended: make(chan struct{})}, nil
}

// SharePoll is how often the replicas count each other and a replica
// holding more than its share hands one pipeline back. A takeover waits
// up to one poll for the count to drop: it is kept short (the count is one
// query on pg_locks).
var SharePoll = 250 * time.Millisecond

// JoinWait bounds how long a replica waits for its pipelines to start
// (or fail) before the others count it.
var JoinWait = 30 * time.Second

// waitStarted waits until no pipeline is starting, for at most limit.
func (p *Process) waitStarted(ctx context.Context, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if !slices.ContainsFunc(p.list(), func(u *unit) bool { return u.snapshot().state == StateStarting }) {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// shareOf is where and under which key the replicas of cfg count each
// other: the first pipeline's database, and its pipelines and slots.
func shareOf(cfg config.Config) replicas.Config {
	units := cfg.Units()
	names := make([]string, len(units))
	for i, u := range units {
		names[i] = u.Name + "=" + u.Config.Postgres.Slot
	}
	return replicas.Config{URL: units[0].Config.Postgres.URL, Key: replicas.KeyOf(names), Pipelines: len(units)}
}

// newUnits checks each pipeline of cfg as NewProcess does and returns
// them as units that have not started.
func newUnits(cfg config.Config) ([]*unit, error) {
	var units []*unit
	for _, u := range cfg.Units() {
		if _, err := SchemaValidator(u.Config.Relay.Schemas); err != nil {
			return nil, fmt.Errorf("pipeline %s: %w", u.Name, err)
		}
		u.Config.HTTP.Listen = "" // the Process serves the one endpoint
		units = append(units, &unit{Unit: u, state: StateStarting, since: time.Now()})
	}
	return units, nil
}

// list is a copy of the current units.
func (p *Process) list() []*unit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*unit(nil), p.units...)
}

// Addr is the HTTP endpoint's bound address, nil before Run binds it or
// when http.listen is empty.
func (p *Process) Addr() string {
	if p.srv == nil || p.srv.Addr() == nil {
		return ""
	}
	return p.srv.Addr().String()
}

// Run runs every pipeline until ctx ends, then drains them all and
// returns nil; or, when a fatal pipeline fails, stops the others and
// returns that pipeline's error. Meanwhile it applies each Reload.
func (p *Process) Run(ctx context.Context) error {
	defer close(p.ended)
	reportCtx, stopReport := context.WithCancel(context.WithoutCancel(ctx))
	defer stopReport()
	var served chan error
	if p.cfg.HTTP.Listen != "" {
		p.reg = metrics.NewProcess(p.opts.Version, p.opts.Revision)
		p.srv = admin.New(admin.Config{
			Listen:     p.cfg.HTTP.Listen,
			ReadyQuery: p.ready,
			Metrics:    metrics.Gatherers(p.gatherers),
			Routes:     p.routes,
			Token:      p.cfg.HTTP.Token,
			Log:        p.log,
		})
		if err := p.srv.Listen(); err != nil {
			return fmt.Errorf("%v; choose a free address for http.listen", err)
		}
		served = make(chan error, 1)
		go func() { served <- p.srv.Run(reportCtx) }()
		sampled := make(chan struct{})
		defer func() {
			stopReport()
			<-sampled
		}()
		go func() {
			defer close(sampled)
			p.sampleHistory(reportCtx)
		}()
	}
	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var wg sync.WaitGroup
	launch := func(u *unit) {
		unitCtx, stopUnit := context.WithCancel(runCtx)
		u.stop, u.done = stopUnit, make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(u.done)
			defer u.closeOffline()
			defer stopUnit()
			if err := p.supervise(unitCtx, u); err != nil {
				stop(err)
			}
		}()
	}
	for _, u := range p.list() {
		launch(u)
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		// Be counted only once the pipelines can stream: the others hand
		// pipelines back as soon as they count this replica, and a pipeline
		// handed to one still starting would wait for its start.
		p.waitStarted(runCtx, JoinWait)
		_ = p.group.Run(runCtx)
	}()
	go func() {
		defer wg.Done()
		p.balance(runCtx)
	}()
	if served != nil {
		go func() {
			select {
			case err := <-served:
				if err != nil {
					p.log.Error("http endpoint failed; stopping", zap.Error(err))
					stop(err)
				}
				served <- err
			case <-runCtx.Done():
			}
		}()
	}
	for runCtx.Err() == nil {
		select {
		case <-runCtx.Done():
		case req := <-p.reloads:
			req.done <- p.apply(runCtx, req.cfg, launch)
		}
	}
	wg.Wait()
	stopReport()
	if served != nil {
		<-served
	}
	if err := context.Cause(runCtx); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// supervise runs u's App until ctx ends, restarting it after each failure
// unless u is fatal: then it returns the failure. A paused pipeline's App
// is stopped, as at shutdown (drained, its position confirmed, the slot
// kept), and starts again when resumed.
func (p *Process) supervise(ctx context.Context, u *unit) error {
	b := backoff.Backoff{Min: RestartMin, Max: RestartMax}
	opts := p.opts
	opts.Pipeline, opts.PerPipeline, opts.Gate = u.Name, true, p.group
	for {
		if !u.waitResumed(ctx) {
			u.set(nil, StateStopped, nil)
			return nil
		}
		attemptCtx, cancel := context.WithCancel(ctx)
		u.setCancel(cancel)
		u.set(nil, StateStarting, nil)
		a, err := New(u.Config, p.log, opts)
		started := time.Now()
		if err == nil {
			u.set(a, StateStarting, nil)
			ran := make(chan struct{})
			go func() {
				select {
				case <-a.Started():
					u.running(a)
				case <-ran:
				}
			}()
			err = a.Run(attemptCtx)
			close(ran)
		}
		cancel()
		if ctx.Err() != nil {
			u.set(nil, StateStopped, nil)
			return nil
		}
		if u.takeShed() && attemptCtx.Err() != nil {
			// Run drained and confirmed; the next App waits as a standby
			// until this process has room again.
			b.Reset()
			p.log.Info("pipeline handed to another replica: drained, its position confirmed", zap.String("pipeline", u.Name))
			continue
		}
		if u.isPaused() && attemptCtx.Err() != nil {
			// Run drained and confirmed before it returned.
			u.set(nil, StatePaused, nil)
			p.log.Info("pipeline paused: drained, its position confirmed, the slot kept", zap.String("pipeline", u.Name))
			continue
		}
		if err == nil {
			err = errors.New("the relay stopped without an error")
		}
		if time.Since(started) >= RestartMax {
			b.Reset()
		}
		if u.Fatal {
			u.set(nil, StateStopped, err)
			p.log.Error("fatal pipeline failed; stopping every pipeline", zap.String("pipeline", u.Name), zap.Error(err))
			return fmt.Errorf("pipeline %s: %w", u.Name, err)
		}
		wait := b.Next()
		u.set(nil, StateFailed, err)
		p.log.Error("pipeline failed; the others go on, and it restarts", zap.String("pipeline", u.Name),
			zap.String("error", redact.Text(err.Error())), zap.Duration("restart_in", wait))
		select {
		case <-ctx.Done():
			u.set(nil, StateStopped, err)
			return nil
		case <-time.After(wait):
		case <-u.pauseRequested():
		}
	}
}

// set records u's App and state; err is kept as the last failure until
// the pipeline runs again. Every change wakes the waiters of changed.
func (u *unit) set(a *App, state string, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if state != u.state {
		u.since = time.Now()
	}
	u.app, u.state = a, state
	switch {
	case err != nil:
		u.err = err
		u.failures++
	case state == StateRunning:
		u.err = nil
	}
	u.notify()
}

// notify wakes whoever waits for a change of u; u.mu is held.
func (u *unit) notify() {
	if u.changed != nil {
		close(u.changed)
	}
	u.changed = make(chan struct{})
}

func (u *unit) setCancel(cancel context.CancelFunc) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.cancel = cancel
}

func (u *unit) isPaused() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.paused
}

// pauseRequested is closed by the next change of u (a pause among them).
func (u *unit) pauseRequested() <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.changed == nil {
		u.changed = make(chan struct{})
	}
	return u.changed
}

// waitResumed waits while u is paused; false when ctx ended.
func (u *unit) waitResumed(ctx context.Context) bool {
	for {
		u.mu.Lock()
		paused := u.paused
		if paused && u.state != StatePaused {
			u.app, u.state, u.since = nil, StatePaused, time.Now()
			u.notify()
		}
		if u.changed == nil {
			u.changed = make(chan struct{})
		}
		changed := u.changed
		u.mu.Unlock()
		if !paused {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		}
	}
}

// shedNow asks u's current App to drain and stop, so that another
// replica takes the slot; supervise starts a new one at once.
func (u *unit) shedNow() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.shed = true
	if u.cancel != nil {
		u.cancel()
	}
}

// takeShed reports and clears a shedNow.
func (u *unit) takeShed() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	shed := u.shed
	u.shed = false
	return shed
}

func (u *unit) shedding() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.shed
}

// balance hands pipelines back while this replica streams more than its
// share (a replica joined): one per SharePoll, the last streaming one in
// configuration order, waiting until the previous has drained.
func (p *Process) balance(ctx context.Context) {
	t := time.NewTicker(SharePoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if p.group.Excess() <= 0 {
			continue
		}
		units := p.list()
		if slices.ContainsFunc(units, (*unit).shedding) {
			continue
		}
		for i := len(units) - 1; i >= 0; i-- {
			if a := units[i].snapshot().app; a != nil && a.Streaming() {
				p.log.Info("more pipelines than this replica's share: handing one to another replica",
					zap.String("pipeline", units[i].Name), zap.Any("share", p.group.Share()))
				units[i].shedNow()
				break
			}
		}
	}
}

// pause asks u to stop reading and drain; resume to start again.
func (u *unit) pause(on bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.paused = on
	if on && u.cancel != nil {
		u.cancel()
	}
	u.notify()
}

// waitState waits until u's state satisfies ok, or ctx ends; it returns
// the last state seen.
func (u *unit) waitState(ctx context.Context, ok func(string) bool) (string, error) {
	for {
		u.mu.Lock()
		state := u.state
		if u.changed == nil {
			u.changed = make(chan struct{})
		}
		changed := u.changed
		u.mu.Unlock()
		if ok(state) {
			return state, nil
		}
		select {
		case <-ctx.Done():
			return state, ctx.Err()
		case <-changed:
		}
	}
}

// running records that a, if it is still u's App, streams.
func (u *unit) running(a *App) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.app == a && u.state == StateStarting {
		u.state, u.since, u.err = StateRunning, time.Now(), nil
		u.notify()
	}
}

// unitState is a copy of a unit's changing fields.
type unitState struct {
	app      *App
	state    string
	err      error
	failures int
	since    time.Time
}

func (u *unit) snapshot() unitState {
	u.mu.Lock()
	defer u.mu.Unlock()
	return unitState{u.app, u.state, u.err, u.failures, u.since}
}

// readiness is nil when u does its work: running and ready, or, with
// standbyOK, waiting as a healthy standby.
func (u *unit) readiness(standbyOK bool) error {
	s := u.snapshot()
	a, state, err, failures := s.app, s.state, s.err, s.failures
	switch {
	case state == StateFailed || state == StateStopped && err != nil:
		return fmt.Errorf("%s (failed %d times): %s", state, failures, redact.Text(err.Error()))
	case state == StatePaused:
		return errPaused
	case a == nil:
		return errors.New(state)
	}
	if err := a.Ready(); err != nil {
		if standbyOK && a.Standby() {
			return nil
		}
		return err
	}
	return nil
}

// errPaused is the readiness of a paused pipeline.
var errPaused = errors.New("paused")

// ready is /readyz: with pipeline=NAME that pipeline's readiness, else
// nil only when every pipeline is ready, and otherwise each one that is
// not, with its reason; a paused pipeline is left out. standby=ok counts
// a healthy standby as ready.
func (p *Process) ready(q url.Values) error {
	standbyOK := q.Get("standby") == "ok"
	if name := q.Get("pipeline"); name != "" {
		u := p.unit(name)
		if u == nil {
			return fmt.Errorf("no pipeline is named %q", name)
		}
		if err := u.readiness(standbyOK); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	var bad []string
	units := p.list()
	for _, u := range units {
		// A pause is the operator's decision, not a fault of the process.
		if err := u.readiness(standbyOK); err != nil && !errors.Is(err, errPaused) {
			bad = append(bad, u.Name+": "+err.Error())
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d of %d pipelines: %s", len(bad), len(units), strings.Join(bad, "; "))
	}
	return nil
}

func (p *Process) unit(name string) *unit {
	for _, u := range p.list() {
		if u.Name == name {
			return u
		}
	}
	return nil
}

// gatherers are the registries /metrics serves at this moment: the
// process's and each running pipeline's.
func (p *Process) gatherers() []prometheus.Gatherer {
	out := []prometheus.Gatherer{p.reg}
	for _, u := range p.list() {
		if a := u.snapshot().app; a != nil {
			if g := a.Gatherer(); g != nil {
				out = append(out, g)
			}
		}
	}
	return out
}

// PipelineStatus is one pipeline in GET /status and GET /api/v1/pipelines.
type PipelineStatus struct {
	Name  string `json:"name"`
	Fatal bool   `json:"fatal"`
	// State is starting, running, failed or stopped.
	State string    `json:"state"`
	Since time.Time `json:"since"`
	// Ready is true when /readyz?pipeline=NAME answers 200; NotReady is
	// its reason otherwise.
	Ready    bool   `json:"ready"`
	NotReady string `json:"not_ready,omitempty"`
	// Error is the last failure, until the pipeline runs again; Failures
	// counts them since the process started.
	Error    string `json:"error,omitempty"`
	Failures int    `json:"failures"`
	// Slot is the slot's status (as GET /status of a single relay), when
	// the pipeline's database answered; StatusError says why not.
	Slot        *store.Status `json:"slot,omitempty"`
	StatusError string        `json:"status_error,omitempty"`
}

// Statuses reads every pipeline's status, in configuration order.
func (p *Process) Statuses(ctx context.Context) []PipelineStatus {
	units := p.list()
	out := make([]PipelineStatus, len(units))
	var wg sync.WaitGroup
	for i, u := range units {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := u.snapshot()
			a := s.app
			st := PipelineStatus{Name: u.Name, Fatal: u.Fatal, State: s.state, Since: s.since, Failures: s.failures}
			if s.err != nil {
				st.Error = redact.Text(s.err.Error())
			}
			if r := u.readiness(false); r != nil {
				st.NotReady = redact.Text(r.Error())
			} else {
				st.Ready = true
			}
			if s, err := u.slotStatus(ctx, a); err != nil {
				st.StatusError = redact.Text(err.Error())
			} else {
				st.Slot = &s
			}
			out[i] = st
		}()
	}
	wg.Wait()
	return out
}
