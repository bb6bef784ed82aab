package config

// The sinks the configuration offers. Each registers itself (see package
// sinks); adding a sink is writing its package and importing it here.
import (
	_ "github.com/outboxrelay/outboxrelay/sinks/kafka"
	_ "github.com/outboxrelay/outboxrelay/sinks/kinesis"
	_ "github.com/outboxrelay/outboxrelay/sinks/nats"
	_ "github.com/outboxrelay/outboxrelay/sinks/pubsub"
	_ "github.com/outboxrelay/outboxrelay/sinks/rabbitmq"
	_ "github.com/outboxrelay/outboxrelay/sinks/redis"
	_ "github.com/outboxrelay/outboxrelay/sinks/sns"
	_ "github.com/outboxrelay/outboxrelay/sinks/sqs"
	_ "github.com/outboxrelay/outboxrelay/sinks/webhook"
)
