// Package inboxprom exports an inbox's events as Prometheus metrics. It is
// a module of its own, so that the inbox core carries no Prometheus
// dependency for consumers that use another metrics library.
//
//	obs, err := inboxprom.Observer(prometheus.DefaultRegisterer, "billing")
//	in, err := inbox.New(pool, "billing", inbox.Config{Observer: obs})
//
// Metrics, each with the label consumer:
//
//	outboxrelay_inbox_processed_total       handler runs that committed
//	outboxrelay_inbox_duplicates_total      deliveries skipped as already processed
//	outboxrelay_inbox_retries_total         failed attempts that were retried
//	outboxrelay_inbox_dead_letters_total    messages stored as dead letters
//	outboxrelay_inbox_parked_total          messages parked behind a dead letter
//	outboxrelay_inbox_stale_total           messages older than the dedupe window
//	outboxrelay_inbox_handler_seconds       first attempt to commit, per processed message
//	outboxrelay_inbox_lag                   messages the broker holds for the consumer, label source
//	                                        (set by the runners where the broker reports it)
package inboxprom

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outboxrelay/inbox"
)

// Observer registers the inbox metrics for consumer with reg and returns
// the inbox.Observer that updates them. Registering a second Observer for
// the same consumer with the same reg reuses the metrics registered first.
func Observer(reg prometheus.Registerer, consumer string) (inbox.Observer, error) {
	labels := prometheus.Labels{"consumer": consumer}
	counter := func(name, help string) (prometheus.Counter, error) {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxrelay_inbox_" + name, Help: help, ConstLabels: labels})
		return register(reg, c)
	}
	var err error
	var processed, duplicates, retries, dead, parked, stale prometheus.Counter
	for _, m := range []struct {
		c          *prometheus.Counter
		name, help string
	}{
		{&processed, "processed_total", "Messages whose handler ran and committed."},
		{&duplicates, "duplicates_total", "Deliveries skipped because the message was processed or stored before."},
		{&retries, "retries_total", "Failed handler attempts that were retried."},
		{&dead, "dead_letters_total", "Messages stored as dead letters."},
		{&parked, "parked_total", "Messages parked behind a dead letter of their aggregate."},
		{&stale, "stale_total", "Messages older than the dedupe window (Config.Retention): widen the window."},
	} {
		if *m.c, err = counter(m.name, m.help); err != nil {
			return inbox.Observer{}, err
		}
	}
	h := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "outboxrelay_inbox_handler_seconds", Help: "Time from a message's first attempt to its commit.",
		ConstLabels: labels, Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	})
	hist, err := register(reg, h)
	if err != nil {
		return inbox.Observer{}, err
	}
	lag, err := register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "outboxrelay_inbox_lag", Help: "Messages the broker holds for the consumer and it has not finished, per source (topic/partition, queue, stream), as the runner last read them.",
		ConstLabels: labels,
	}, []string{"source"}))
	if err != nil {
		return inbox.Observer{}, err
	}
	return inbox.Observer{
		Lag: func(source string, n int64) { lag.WithLabelValues(source).Set(float64(n)) },
		Processed: func(_ inbox.Message, took time.Duration) {
			processed.Inc()
			hist.Observe(took.Seconds())
		},
		Duplicate:    func(inbox.Message) { duplicates.Inc() },
		Retried:      func(inbox.Message, int, error) { retries.Inc() },
		DeadLettered: func(inbox.Message, error) { dead.Inc() },
		Parked:       func(inbox.Message) { parked.Inc() },
		Stale:        func(inbox.Message) { stale.Inc() },
	}, nil
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		var zero C
		return zero, fmt.Errorf("register inbox metrics: %w", err)
	}
	return c, nil
}
