package app

import (
	"context"
	"math"
	"time"

	"go.uber.org/zap"
)

// progressLog logs what the relay gets done: a line every interval while
// there is work (messages acknowledged or in flight), and one when a
// backlog drains, so that an operator reading the log sees a catch-up move
// and end without a dashboard.
type progressLog struct {
	log      *zap.Logger
	interval time.Duration
	// Read on every step; each must be safe for concurrent use.
	acknowledged func() uint64
	inFlight     func() int
	lagBytes     func() (int64, bool)
	lagSeconds   func() float64

	lastAt   time.Time // of the last progress line (or of the start)
	lastAcks uint64    // acknowledged then
	prevAcks uint64    // acknowledged at the previous step
	// busySince is when messages were last seen in flight after none were
	// (zero: none are), busyAcks the count then; backlog is set when a
	// progress line fell within that stretch.
	busySince time.Time
	busyAcks  uint64
	backlog   bool
}

// run steps every second until ctx is done.
func (p *progressLog) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	p.lastAt = time.Now()
	p.lastAcks = p.acknowledged()
	p.prevAcks = p.lastAcks
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			p.step(now)
		}
	}
}

// step looks at the figures at now (called every second): a progress
// line is due every interval in which something was acknowledged or is in
// flight; a stretch of work that lasted past a progress line ends with a
// "backlog drained" line once nothing is in flight and nothing moved for a
// step.
func (p *progressLog) step(now time.Time) {
	acks, inflight := p.acknowledged(), p.inFlight()
	moved := acks != p.prevAcks
	if inflight > 0 && p.busySince.IsZero() {
		p.busySince, p.busyAcks = now, p.prevAcks
	}
	p.prevAcks = acks
	if !p.busySince.IsZero() && inflight == 0 && !moved {
		if p.backlog {
			took := now.Sub(p.busySince)
			p.line("backlog drained", acks-p.busyAcks, took, inflight, zap.Duration("took", took.Round(time.Second)))
			p.lastAt, p.lastAcks = now, acks // the drained line says it all
		}
		p.busySince, p.backlog = time.Time{}, false
	}
	if now.Sub(p.lastAt) < p.interval {
		return
	}
	if acks != p.lastAcks || inflight > 0 {
		p.line("progress", acks-p.lastAcks, now.Sub(p.lastAt), inflight)
		p.backlog = p.backlog || !p.busySince.IsZero()
	}
	p.lastAt, p.lastAcks = now, acks
}

func (p *progressLog) line(msg string, published uint64, over time.Duration, inflight int, extra ...zap.Field) {
	lagSeconds := p.lagSeconds()
	rate := 0.0
	if over > 0 {
		rate = math.Round(float64(published)/over.Seconds()*10) / 10
	}
	fields := []zap.Field{zap.Uint64("published", published), zap.Float64("rate_per_second", rate)}
	if b, ok := p.lagBytes(); ok {
		fields = append(fields, zap.Int64("lag_bytes", b))
	}
	fields = append(fields, zap.Float64("lag_seconds", math.Round(lagSeconds*10)/10), zap.Int("inflight", inflight))
	p.log.Info(msg, append(fields, extra...)...)
}

// brokerSilence is how long a broker may hold messages without answering
// any before /readyz, the log and outboxrelay_sink_unanswered_seconds say
// so. A healthy broker acknowledges within milliseconds; a publish timeout
// (tens of seconds) would report it far too late.
const brokerSilence = 5 * time.Second

// brokerWait is how long one sink's broker has held messages without an
// answer (relay.SinkState.Unanswered), and how many.
type brokerWait struct {
	sink    string
	silent  time.Duration
	waiting int
}

// watchBroker logs once, naming the sink, when a sink's broker has answered
// nothing for brokerSilence while messages wait on it, and once when it
// answers again. It checks every second until ctx is done.
func watchBroker(ctx context.Context, log *zap.Logger, waits func() []brokerWait) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	silentSince := map[string]time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, w := range waits() {
				since, silent := silentSince[w.sink]
				switch {
				case w.silent >= brokerSilence && !silent:
					silentSince[w.sink] = now.Add(-w.silent)
					log.Warn("the broker accepts messages but answers none; publishing waits for it",
						zap.String("sink", w.sink), zap.Int("unanswered", w.waiting), zap.Duration("for", w.silent.Round(time.Second)))
				case w.silent < brokerSilence && silent:
					log.Info("the broker answers again", zap.String("sink", w.sink), zap.Duration("silent_for", now.Sub(since).Round(time.Second)))
					delete(silentSince, w.sink)
				}
			}
		}
	}
}
