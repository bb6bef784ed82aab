package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/outboxrelay/outboxrelay/internal/app"
	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/sinks/kafka"
)

const slot = "outboxrelay"

// relayConfig is the configuration a user would write in a file, with a
// short status interval so that the checkpoint moves quickly, and no HTTP
// endpoint, so that the demo takes no fixed port.
func relayConfig(url string, brokers []string) config.Config {
	cfg := config.Default()
	cfg.Postgres.URL = url
	cfg.Postgres.Slot = slot
	cfg.Postgres.StatusInterval = 200 * time.Millisecond
	cfg.HTTP.Listen = ""
	cfg.Sink.Type = "kafka"
	config.SinkAs[*kafka.Config](cfg.Sink).Brokers = brokers
	return cfg
}

// newLogger writes the relay's warnings and errors as JSON lines; progress
// is the demo's own output.
func newLogger(w io.Writer) *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "ts"
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(zapcore.AddSync(w)), zap.WarnLevel))
}

// runningRelay is the relay running in its own goroutine.
type runningRelay struct {
	cancel   context.CancelFunc
	done     chan struct{}
	err      error       // set before done is closed
	reported atomic.Bool // exitErr has returned err to a step
}

// startRelay runs the relay wired as `outboxrelay run` wires it (package
// app) in its own goroutine. The slot exists when startRelay returns, so
// every row committed afterwards is relayed.
func startRelay(ctx context.Context, cfg config.Config, log *zap.Logger) (*runningRelay, error) {
	// `run` loads and validates a file; the demo builds its configuration.
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("relay configuration: %w", err)
	}
	a, err := app.New(cfg, log, app.Options{Version: "demo"})
	if err != nil {
		return nil, err
	}
	// The relay outlives ctx only through its own cancel: stop ends it,
	// as SIGTERM ends `outboxrelay run`.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	rr := &runningRelay{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(rr.done)
		err := a.Run(runCtx)
		if err != nil {
			rr.err = fmt.Errorf("relay: %w", err)
		} else if runCtx.Err() == nil {
			rr.err = errors.New("relay stopped by itself")
		}
	}()
	select {
	case <-a.Started():
		return rr, nil
	case <-rr.done:
		return nil, rr.exitErr()
	case <-ctx.Done():
		return nil, errors.Join(fmt.Errorf("start the relay: %w", ctx.Err()), rr.stop())
	}
}

// failed is closed when the relay has stopped; before stop is called that
// means it failed, with the error stop returns.
func (r *runningRelay) failed() <-chan struct{} { return r.done }

// stop cancels the relay and waits until it has drained and stopped. It
// returns the relay's error unless a step has reported it already.
func (r *runningRelay) stop() error {
	r.cancel()
	<-r.done
	if r.reported.Load() {
		return nil
	}
	return r.err
}

// exitErr is the reason the relay stopped early; call it after failed is closed.
func (r *runningRelay) exitErr() error {
	r.reported.Store(true)
	if r.err != nil {
		return r.err
	}
	return errors.New("relay stopped")
}
