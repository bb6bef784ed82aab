package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/metrics"
	"github.com/outboxrelay/outboxrelay/internal/store"
	"github.com/outboxrelay/outboxrelay/relay"
)

// openSinks opens every sink of the configuration (config.SinkList), in
// its order, each as openSink does. On a failure it closes the ones it
// opened, and the error names the sink.
func openSinks(ctx context.Context, cfg config.Config, forRelay bool, log *zap.Logger) ([]relay.NamedSink, error) {
	list := cfg.SinkList()
	var out []relay.NamedSink
	for _, ns := range list {
		one := cfg
		one.Sink = ns.Sink
		l := log
		if ns.Name != "" {
			l = log.With(zap.String("sink", ns.Name))
		}
		s, err := openSink(ctx, one, forRelay, l)
		if err != nil {
			for _, o := range out {
				_ = o.Sink.Close()
			}
			if ns.Name != "" {
				return nil, fmt.Errorf("sinks.%s: %w", ns.Name, err)
			}
			return nil, err
		}
		out = append(out, relay.NamedSink{Name: ns.Name, Sink: s})
	}
	return out, nil
}

// fanout is the sink of the commands that publish outside the relay
// (dlq replay, replay, recover, a first start's backfill) when the
// configuration has several sinks: each message goes to the sink it names
// (relay.Message.Sink, as the relay and the dead letters record it), or
// to the first. Safe for concurrent use as its sinks are.
type fanout struct {
	sinks  []relay.NamedSink
	byName map[string]relay.Sink
}

var (
	_ relay.Sink   = (*fanout)(nil)
	_ relay.Runner = (*fanout)(nil)
)

func newFanout(sinks []relay.NamedSink) *fanout {
	f := &fanout{sinks: sinks, byName: map[string]relay.Sink{}}
	for _, ns := range sinks {
		f.byName[ns.Name] = ns.Sink
	}
	return f
}

// Publish implements relay.Sink.
func (f *fanout) Publish(ctx context.Context, m *relay.Message, done func(*relay.Message, error)) {
	s := f.sinks[0].Sink
	if m.Sink != "" {
		var ok bool
		if s, ok = f.byName[m.Sink]; !ok {
			done(m, relay.Permanent(fmt.Errorf("message %s names sink %q, which the configuration's sinks do not have", m.ID, m.Sink)))
			return
		}
	}
	s.Publish(ctx, m, done)
}

// Ready implements relay.Sink: every sink is ready.
func (f *fanout) Ready() bool {
	for _, ns := range f.sinks {
		if !ns.Sink.Ready() {
			return false
		}
	}
	return true
}

// Close implements relay.Sink.
func (f *fanout) Close() error {
	var errs []error
	for _, ns := range f.sinks {
		errs = append(errs, ns.Sink.Close())
	}
	return errors.Join(errs...)
}

// Run implements relay.Runner: it runs the sinks that are Runners until
// ctx ends or one fails.
func (f *fanout) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, ns := range f.sinks {
		if r, ok := ns.Sink.(relay.Runner); ok {
			g.Go(func() error {
				if err := r.Run(gctx); err != nil {
					return fmt.Errorf("sink %s: %w", ns.Name, err)
				}
				return nil
			})
		}
	}
	if err := g.Wait(); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// sinksReady returns the name (its type for the one sink of a sink
// section) of the first sink that is not connected, or "".
func (r *run) sinksReady() string {
	for i, ns := range r.sinks {
		if !ns.Sink.Ready() {
			return r.sinkLabel(i)
		}
	}
	return ""
}

// sinkLabel names the i-th sink in messages and metrics: its name under
// the sinks section, its type with the sink section.
func (r *run) sinkLabel(i int) string {
	if n := r.sinks[i].Name; n != "" {
		return n
	}
	return r.cfg.Sink.Type
}

// sinkStatus is each sink's own progress for the status, its lag in bytes
// counted from current (the server's position; 0: unknown).
func sinkStatus(states []relay.SinkState, current store.LSN) []store.SinkStatus {
	out := make([]store.SinkStatus, 0, len(states))
	for _, s := range states {
		st := store.SinkStatus{Name: s.Name, ConfirmedLSN: store.LSN(s.Confirmed), Ready: s.Ready, Retrying: s.Retrying,
			Behind: s.Behind, Spilled: s.Spilled}
		if s.Behind {
			since := s.BehindSince.UTC()
			st.BehindSince = &since
		}
		if current != 0 && s.Confirmed != 0 {
			b := max(0, int64(current)-int64(s.Confirmed))
			st.LagBytes = &b
		}
		if !s.LagSince.IsZero() {
			sec := max(0, time.Since(s.LagSince).Seconds())
			st.LagSeconds = &sec
		}
		out = append(out, st)
	}
	return out
}

// sinkLag reads each sink's own watermark and lag for the metrics, nil
// with the one sink of a sink section (the slot's series say it all).
func (r *run) sinkLag() func() []metrics.SinkLag {
	if len(r.cfg.Sinks) == 0 {
		return nil
	}
	return func() []metrics.SinkLag {
		states := r.relay.Sinks()
		out := make([]metrics.SinkLag, len(states))
		for i, s := range states {
			out[i] = metrics.SinkLag{Sink: s.Name, Confirmed: uint64(s.Confirmed), Since: s.LagSince, Behind: s.Behind, Spilled: s.Spilled}
		}
		return out
	}
}
