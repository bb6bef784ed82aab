package sns

import (
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/internal/awssink"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
	"github.com/outboxrelay/outboxrelay/sinks/sns/goawstest"
)

// The sink against the bare SDK client publishing the same messages to
// the same goaws topic, one Publish each (goaws has no PublishBatch), over
// as many goroutines, so that the ratio of the two is the sink's cost.
//
//	go test -run '^$' -bench . ./sinks/sns

const benchWorkers = 16

func BenchmarkSink(b *testing.B) {
	srv := goawstest.Start(b)
	srv.Call(b, map[string][]string{"Action": {"CreateTopic"}, "Name": {"bench"}})
	cfg := testConfig(srv, goawstest.TopicARN("bench"))
	cfg.MaxConcurrentBatches = benchWorkers
	s := newSink(b, cfg)
	sinktest.BenchmarkPublish(b, s, sinktest.Messages("bench", b.N, 1000))
}

func BenchmarkBareClient(b *testing.B) {
	srv := goawstest.Start(b)
	srv.Call(b, map[string][]string{"Action": {"CreateTopic"}, "Name": {"bench"}})
	c := sns.New(sns.Options{Region: goawstest.Region, BaseEndpoint: aws.String(srv.URL), Credentials: aws.AnonymousCredentials{}})
	arn := aws.String(goawstest.TopicARN("bench"))
	msgs := sinktest.Messages("bench", b.N, 1000)
	work := make(chan *relay.Message)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	b.ResetTimer()
	for range benchWorkers {
		wg.Go(func() {
			for m := range work {
				_, err := c.Publish(b.Context(), &sns.PublishInput{TopicArn: arn, Message: aws.String(string(m.Envelope)),
					MessageAttributes: attributes(b, m)})
				if err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
				}
			}
		})
	}
	for _, m := range msgs {
		work <- m
	}
	close(work)
	wg.Wait()
	b.StopTimer()
	if failed != nil {
		b.Fatal(failed)
	}
	b.ReportMetric(float64(len(msgs))/b.Elapsed().Seconds(), "msgs/s")
}

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
