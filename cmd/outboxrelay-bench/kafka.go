package main

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// topic is where the relay's default template puts every benchmark row
// (outbox.{aggregate_type}, aggregate_type "order").
const (
	topic      = "outbox.order"
	partitions = 4
)

// newKafka starts an in-process broker that the relay reaches over TCP.
func newKafka() (*kfake.Cluster, error) {
	return kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic, bareTopic), kfake.AllowAutoTopicCreation())
}

// benchKafka is a workload run's own broker and a counter of its records.
type benchKafka struct {
	kf   *kfake.Cluster
	addr string
	rc   *recordCounter
}

func newBenchKafka() (*benchKafka, error) {
	kf, err := newKafka()
	if err != nil {
		return nil, err
	}
	addr := kf.ListenAddrs()[0]
	rc, err := newRecordCounter(addr)
	if err != nil {
		kf.Close()
		return nil, err
	}
	return &benchKafka{kf: kf, addr: addr, rc: rc}, nil
}

// close stops the counter and the broker, which frees the records.
func (b *benchKafka) close() {
	b.rc.close()
	b.kf.Close()
}

// recordCounter counts the records in topic: the sum of the partitions'
// end offsets. kfake appends a batch just before it acknowledges it, so the
// count is what the broker has acknowledged.
type recordCounter struct {
	cl  *kgo.Client
	req *kmsg.ListOffsetsRequest
}

func newRecordCounter(addr string) (*recordCounter, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return nil, err
	}
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := range int32(partitions) {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = p
		rp.Timestamp = -1 // latest
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	return &recordCounter{cl: cl, req: req}, nil
}

func (c *recordCounter) close() { c.cl.Close() }

func (c *recordCounter) count(ctx context.Context) (int64, error) {
	resp, err := c.req.RequestWith(ctx, c.cl)
	if err != nil {
		return 0, fmt.Errorf("list offsets: %w", err)
	}
	var n int64
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return 0, fmt.Errorf("list offsets of %s/%d: error code %d", t.Topic, p.Partition, p.ErrorCode)
			}
			n += p.Offset
		}
	}
	return n, nil
}

// kafkaConfig is the relay's configuration for kfake; listen is its HTTP
// endpoint (host:port, port 0 for any).
func kafkaConfig(dbURL, broker, listen string) string {
	return fmt.Sprintf(`postgres:
  url: %s
  status_interval: 100ms
sink:
  type: kafka
  kafka:
    brokers: [%s]
http:
  listen: %s
`, dbURL, broker, listen)
}

func rabbitConfig(dbURL, amqpURL, listen string) string {
	return fmt.Sprintf(`postgres:
  url: %s
  status_interval: 100ms
sink:
  type: rabbitmq
  rabbitmq:
    url: %s
    exchange: %s
    declare: true
http:
  listen: %s
`, dbURL, amqpURL, rabbitExchange, listen)
}
