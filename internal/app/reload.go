package app

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// ReloadStatus is the outcome of the last reload, in GET /status.
type ReloadStatus struct {
	At time.Time `json:"at"`
	// Error is why the new configuration was refused, whole; the running
	// pipelines went on with the one before. Empty when it was applied.
	Error   string   `json:"error,omitempty"`
	Added   []string `json:"added,omitempty"`
	Removed []string `json:"removed,omitempty"`
	Changed []string `json:"changed,omitempty"`
}

// reloadRequest is a Reload waiting for Run to apply it.
type reloadRequest struct {
	cfg  config.Config
	done chan ReloadStatus
}

// errNotRunning is the reload of a Process whose Run has not started or
// has returned.
var errNotRunning = errors.New("the pipelines are not running")

// Reload replaces the pipelines with those of cfg, by name: a pipeline
// that cfg adds starts, one that it removes drains (stops reading, waits
// for what is in flight, confirms its position) and stops, keeping its
// slot, and one whose settings changed drains and starts again with the
// new ones. The others are not touched. A configuration whose pipelines
// do not all pass NewProcess's checks is refused whole and nothing
// changes. http and log are not reloaded: a change to them is logged and
// waits for a restart. Reload returns when the change is applied, or
// when ctx ends (the change then goes on). Safe for concurrent use;
// reloads apply one at a time.
func (p *Process) Reload(ctx context.Context, cfg config.Config) (ReloadStatus, error) {
	req := reloadRequest{cfg: cfg, done: make(chan ReloadStatus, 1)}
	select {
	case p.reloads <- req:
	case <-p.ended:
		return ReloadStatus{}, errNotRunning
	case <-ctx.Done():
		return ReloadStatus{}, ctx.Err()
	}
	select {
	case st := <-req.done:
		if st.Error != "" {
			return st, errors.New(st.Error)
		}
		return st, nil
	case <-ctx.Done():
		return ReloadStatus{}, ctx.Err()
	}
}

// Refuse records a configuration that could not be read or checked
// before it reached Reload (a YAML error, a bad template): it is in
// GET /status as the last reload, and the pipelines go on.
func (p *Process) Refuse(err error) {
	st := ReloadStatus{At: time.Now(), Error: redact.Text(err.Error())}
	p.log.Error("configuration reload refused; the running pipelines go on unchanged", zap.String("error", st.Error))
	p.setReload(st)
}

// LastReload is the outcome of the last reload, nil before the first.
func (p *Process) LastReload() *ReloadStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reload
}

func (p *Process) setReload(st ReloadStatus) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reload = &st
}

// apply is Reload, run by Run: it drains the pipelines that go or change,
// all at once, then starts the ones that come or changed, so that a slot
// moved from one pipeline to another is free when the new one starts.
func (p *Process) apply(ctx context.Context, cfg config.Config, launch func(*unit)) ReloadStatus {
	st := ReloadStatus{At: time.Now()}
	next, err := p.checkReload(cfg)
	if err != nil {
		p.Refuse(err)
		return ReloadStatus{At: st.At, Error: redact.Text(err.Error())}
	}
	old := p.list()
	byName := map[string]*unit{}
	for _, u := range old {
		byName[u.Name] = u
	}
	var units, stopping, starting []*unit
	for _, n := range next {
		o, ok := byName[n.Name]
		delete(byName, n.Name)
		switch {
		case !ok:
			st.Added = append(st.Added, n.Name)
			starting = append(starting, n)
		case sameUnit(o.Unit, n.Unit):
			n = o
		default:
			st.Changed = append(st.Changed, n.Name)
			n.paused = o.isPaused() // a pause outlasts a change of settings
			stopping, starting = append(stopping, o), append(starting, n)
		}
		units = append(units, n)
	}
	for _, u := range old {
		if _, gone := byName[u.Name]; gone {
			st.Removed = append(st.Removed, u.Name)
			stopping = append(stopping, u)
		}
	}
	p.log.Info("configuration reload: draining the pipelines removed or changed",
		zap.Strings("added", st.Added), zap.Strings("removed", st.Removed), zap.Strings("changed", st.Changed))
	drain(stopping)
	p.mu.Lock()
	p.units = units
	p.mu.Unlock()
	p.group.Set(shareOf(cfg))
	if ctx.Err() == nil {
		for _, u := range starting {
			launch(u)
		}
	}
	for _, name := range append(slices.Clone(st.Removed), st.Changed...) {
		p.log.Info("pipeline drained: its position confirmed, the slot kept", zap.String("pipeline", name))
	}
	p.log.Info("configuration reloaded", zap.Strings("added", st.Added), zap.Strings("removed", st.Removed),
		zap.Strings("changed", st.Changed), zap.Int("pipelines", len(units)))
	p.setReload(st)
	return st
}

// checkReload checks cfg as a replacement of the running configuration
// and returns its units.
func (p *Process) checkReload(cfg config.Config) ([]*unit, error) {
	if len(cfg.Pipelines) == 0 {
		return nil, errors.New("the new configuration has no pipelines list; a running process of pipelines reloads only a pipelines list")
	}
	next, err := newUnits(cfg)
	if err != nil {
		return nil, err
	}
	if !reflect.DeepEqual(cfg.HTTP, p.cfg.HTTP) || !reflect.DeepEqual(cfg.Log, p.cfg.Log) {
		p.log.Warn("configuration reload: http and log changed; they take effect at the next restart")
	}
	return next, nil
}

// sameUnit reports whether a pipeline runs as it did: the same settings,
// secrets among them (a password read again from its file may differ).
func sameUnit(a, b config.Unit) bool {
	return a.Name == b.Name && a.Fatal == b.Fatal && reflect.DeepEqual(a.Config, b.Config)
}

// drain stops each unit's supervisor and waits until all have returned,
// each App drained and its position confirmed.
func drain(units []*unit) {
	var wg sync.WaitGroup
	for _, u := range units {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u.stop()
			<-u.done
		}()
	}
	wg.Wait()
}
