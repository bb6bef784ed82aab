package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/config"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/kafka"
	"github.com/outboxrelay/outboxrelay/sinks/rabbitmq"
)

func cmdRun(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("run")
	path := fs.String("config", "", "YAML configuration file")
	check := fs.Bool("check-config", false, "validate the configuration and exit")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := config.Load(*path, os.LookupEnv)
	if err != nil {
		return usageErr("invalid configuration: %v", err)
	}
	if *check {
		fmt.Fprintf(stdout, "configuration ok: %s sink, slot %s, tables %v\n", cfg.Sink.Type, cfg.Postgres.Slot, cfg.Postgres.Tables)
		return nil
	}
	log, err := newLogger(cfg.Log.Level, stderr)
	if err != nil {
		return usageErr("log.level: %v", err)
	}
	defer log.Sync() //nolint:errcheck // best effort at exit

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err = run(ctx, cfg, log)
	if err != nil {
		// main prints the one line; the relay has logged the details.
		return &exitError{code: exitUsage, err: err}
	}
	log.Info("stopped cleanly")
	return nil
}

func newLogger(level string, w io.Writer) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, err
	}
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "ts"
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(zapcore.AddSync(w)), lvl)
	return zap.New(core), nil
}

// run wires the relay from the configuration and runs it until ctx ends.
func run(ctx context.Context, cfg config.Config, log *zap.Logger) error {
	setupCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := connect(setupCtx, cfg.Postgres.URL)
	if err != nil {
		return err
	}
	database := conn.Config().Database
	err = cdc.Setup(setupCtx, conn, cfg.CDC(), cfg.Postgres.Columns.Required())
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("prepare PostgreSQL: %w", err)
	}

	dur, err := openDurability(setupCtx, cfg, log)
	if err != nil {
		return err
	}
	defer dur.close()
	sink, err := openSink(setupCtx, cfg, log)
	if err != nil {
		return err
	}
	stream, err := cdc.NewStream(cfg.CDC(), log)
	if err != nil {
		_ = sink.Close()
		return err
	}
	rc := relay.Config{
		Database:         database,
		Columns:          cfg.Postgres.Columns,
		MessagePrefix:    cfg.Postgres.MessagePrefix,
		MaxInFlight:      cfg.Relay.MaxInFlight,
		MaxInFlightBytes: cfg.Relay.MaxInFlightBytes,
		MaxAttempts:      cfg.Relay.MaxAttempts,
	}
	dur.apply(&rc)
	r := relay.New(rc, sink, log)
	log.Info("starting", zap.String("version", version), zap.String("sink", cfg.Sink.Type),
		zap.String("slot", cfg.Postgres.Slot), zap.Strings("tables", cfg.Postgres.Tables))

	hbCtx, stopHeartbeat := context.WithCancel(ctx)
	hbDone := make(chan error, 1)
	go func() { hbDone <- dur.heartbeat(hbCtx) }()
	err = r.Run(ctx, stream)
	stopHeartbeat()
	<-hbDone
	return err
}

// openSink creates the configured sink and checks that its broker answers,
// so that an unreachable broker at start is one clear error.
func openSink(ctx context.Context, cfg config.Config, log *zap.Logger) (relay.Sink, error) {
	switch cfg.Sink.Type {
	case "kafka":
		k := cfg.Sink.Kafka
		s, err := kafka.New(kafka.Config{Brokers: k.Brokers, Topic: k.Topic, Linger: k.Linger}, log)
		if err != nil {
			return nil, usageErr("sink.kafka: %v", err)
		}
		if err := s.Ping(ctx); err != nil {
			_ = s.Close()
			return nil, usageErr("cannot reach Kafka: %v", err)
		}
		return s, nil
	case "rabbitmq":
		q := cfg.Sink.RabbitMQ
		s, err := rabbitmq.New(rabbitmq.Config{
			URL: q.URL, Exchange: q.Exchange, RoutingKey: q.RoutingKey,
			Declare: q.Declare, ExchangeType: q.ExchangeType, Durable: &q.Durable,
		}, log)
		if err != nil {
			return nil, usageErr("sink.rabbitmq: %v", err)
		}
		if err := s.Connect(ctx); err != nil {
			_ = s.Close()
			return nil, usageErr("cannot reach RabbitMQ: %v", err)
		}
		return s, nil
	}
	return nil, errors.New("unknown sink type " + cfg.Sink.Type)
}
