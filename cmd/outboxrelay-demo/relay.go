package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/store"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/kafka"
)

const slot = "outboxrelay"

// relayConfig is the configuration a user would write in a file, with a
// short status interval so that the checkpoint moves quickly.
func relayConfig(url string, brokers []string) config.Config {
	cfg := config.Default()
	cfg.Postgres.URL = url
	cfg.Postgres.Slot = slot
	cfg.Postgres.StatusInterval = 200 * time.Millisecond
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

// startRelay wires the relay as cmd/outboxrelay's run does (a copy of its
// few lines: package main cannot be imported) and starts it. The slot
// exists when startRelay returns, so every row committed afterwards is
// relayed.
func startRelay(ctx context.Context, cfg config.Config, log *zap.Logger) (*runningRelay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("relay configuration: %w", err)
	}
	conn, err := pgx.Connect(ctx, cfg.Postgres.URL)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	database := conn.Config().Database
	err = cdc.Setup(ctx, conn, store.Checkpoint{DB: conn, Slot: cfg.Postgres.Slot}, cfg.CDC(), cfg.Postgres.Columns.Required())
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return nil, fmt.Errorf("prepare PostgreSQL: %w", err)
	}
	// Checkpoint records, dead letters and the heartbeat share a small pool.
	pcfg, err := pgxpool.ParseConfig(cfg.Postgres.URL)
	if err != nil {
		return nil, fmt.Errorf("postgres.url: %w", err)
	}
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	sink, err := kafka.New(*config.SinkAs[*kafka.Config](cfg.Sink), log)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("sink.kafka: %w", err)
	}
	if err := sink.Ping(ctx); err != nil {
		pool.Close()
		return nil, errors.Join(err, sink.Close())
	}
	stream, err := cdc.NewStream(cfg.CDC(), log)
	if err != nil {
		pool.Close()
		return nil, errors.Join(err, sink.Close())
	}
	cp := store.Checkpoint{DB: pool, Slot: cfg.Postgres.Slot}
	rc := relay.Config{
		Database:         database,
		Columns:          cfg.Postgres.Columns,
		MessagePrefix:    cfg.Postgres.MessagePrefix,
		MaxInFlight:      cfg.Relay.MaxInFlight,
		MaxInFlightBytes: cfg.Relay.MaxInFlightBytes,
		MaxAttempts:      cfg.Relay.MaxAttempts,
		Checkpoint:       cp.Confirm,
		Verify:           cp.Verify,
		// Record and confirm positions quickly, so that the status shown
		// at the end is current.
		CheckpointInterval: 200 * time.Millisecond,
	}
	if cfg.Relay.DeadLetters {
		dead := &store.DeadLetters{DB: pool, Slot: cfg.Postgres.Slot}
		rc.DeadLetter = dead.Add
	}
	r := relay.New(rc, sink, log)

	// The relay outlives the setup context only through its own cancel:
	// stop ends it, as SIGTERM ends `outboxrelay run`.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	rr := &runningRelay{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(rr.done)
		defer pool.Close()
		hbCtx, stopHeartbeat := context.WithCancel(runCtx)
		hbDone := make(chan struct{})
		go func() {
			defer close(hbDone)
			_ = cdc.Heartbeat(hbCtx, pool, cfg.Postgres.HeartbeatInterval, log.Named("heartbeat"))
		}()
		// Run closes the sink.
		err := r.Run(runCtx, stream)
		stopHeartbeat()
		<-hbDone
		if err != nil {
			rr.err = fmt.Errorf("relay: %w", err)
		} else if runCtx.Err() == nil {
			rr.err = errors.New("relay stopped by itself")
		}
	}()
	return rr, nil
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
