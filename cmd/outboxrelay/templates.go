package main

import (
	"fmt"

	"github.com/outboxrelay/outboxrelay/config"
	"github.com/outboxrelay/outboxrelay/sinks/kafka"
	natssink "github.com/outboxrelay/outboxrelay/sinks/nats"
	"github.com/outboxrelay/outboxrelay/sinks/rabbitmq"
	redissink "github.com/outboxrelay/outboxrelay/sinks/redis"
)

// checkTemplates parses the configured sink's destination template with the
// sink's own rules, without connecting, so that `run --check-config`
// rejects a typo such as {aggregate_typo} exactly as `run` does.
func checkTemplates(cfg config.Config) error {
	var err error
	switch cfg.Sink.Type {
	case "kafka":
		k := cfg.Sink.Kafka
		err = kafka.Config{Brokers: k.Brokers, Topic: k.Topic}.Validate()
	case "rabbitmq":
		q := cfg.Sink.RabbitMQ
		rc := rabbitmq.Config{URL: q.URL, Exchange: q.Exchange, RoutingKey: q.RoutingKey, ExchangeType: q.ExchangeType}
		if err = rc.Validate(); err != nil {
			err = fmt.Errorf("sink.rabbitmq: %w", err)
		}
	case "nats":
		n := cfg.Sink.NATS
		err = natssink.Config{URL: n.URL, Subject: n.Subject, Stream: n.Stream, DuplicateWindow: n.DuplicateWindow, MaxPending: n.MaxPending, AckTimeout: n.AckTimeout}.Validate()
	case "redis":
		r := cfg.Sink.Redis
		err = redissink.Config{URL: r.URL, Stream: r.Stream, MaxLen: r.MaxLen, BatchSize: r.BatchSize, MaxPending: r.MaxPending}.Validate()
	}
	return err
}
