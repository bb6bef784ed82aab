package sqs

import (
	"strconv"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/internal/awssink"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
	"github.com/outboxrelay/outboxrelay/sinks/sqs/sqstest"
)

// The sink against the bare SDK client sending the same messages to the
// same in-test server in batches of 10 over as many goroutines, so that
// the ratio of the two is the sink's cost: attributes, checks,
// per-aggregate order.
//
//	go test -run '^$' -bench . ./sinks/sqs

const benchWorkers = 16

func BenchmarkSink(b *testing.B) {
	srv := sqstest.Start(b)
	url := srv.CreateQueue("bench.fifo")
	cfg := testConfig(srv, url)
	cfg.MaxConcurrentBatches = benchWorkers
	s := newSink(b, cfg)
	sinktest.BenchmarkPublish(b, s, sinktest.Messages("bench", b.N, 1000))
}

func BenchmarkBareClient(b *testing.B) {
	srv := sqstest.Start(b)
	url := srv.CreateQueue("bench.fifo")
	c := sqs.New(sqs.Options{Region: sqstest.Region, BaseEndpoint: aws.String(srv.URL), Credentials: aws.AnonymousCredentials{}})
	msgs := sinktest.Messages("bench", b.N, 1000)
	work := make(chan []*relay.Message)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	b.ResetTimer()
	for range benchWorkers {
		wg.Go(func() {
			for batch := range work {
				in := &sqs.SendMessageBatchInput{QueueUrl: aws.String(url)}
				for k, m := range batch {
					in.Entries = append(in.Entries, types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(k)), MessageBody: aws.String(string(m.Envelope)),
						MessageGroupId: aws.String(m.AggregateID), MessageDeduplicationId: aws.String(m.ID),
						MessageAttributes: attributes(b, m)})
				}
				out, err := c.SendMessageBatch(b.Context(), in)
				if err == nil && len(out.Failed) > 0 {
					err = errString(*out.Failed[0].Message)
				}
				if err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
				}
			}
		})
	}
	for i := 0; i < len(msgs); i += 10 {
		work <- msgs[i:min(i+10, len(msgs))]
	}
	close(work)
	wg.Wait()
	b.StopTimer()
	if failed != nil {
		b.Fatal(failed)
	}
	b.ReportMetric(float64(len(msgs))/b.Elapsed().Seconds(), "msgs/s")
}

type errString string

func (e errString) Error() string { return string(e) }

// attributes are the message attributes the sink sends for m, so that
// both publish the same messages.
func attributes(b *testing.B, m *relay.Message) map[string]types.MessageAttributeValue {
	as, err := awssink.Attributes(Binding, m)
	if err != nil {
		b.Fatal(err)
	}
	out := make(map[string]types.MessageAttributeValue, len(as))
	for _, a := range as {
		out[a.Name] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(a.Value)}
	}
	return out
}
