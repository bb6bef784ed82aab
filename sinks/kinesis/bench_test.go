package kinesis

import (
	"context"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// The sink against the bare Kinesis client putting the same records to
// the same kinesalite, in PutRecords calls of 500 over as many calls at
// once, without regard to order: the ratio of the two is the sink's cost,
// mostly that a call holds at most one record of an aggregate.
//
//	go test -run '^$' -bench . ./sinks/kinesis

func benchStream(b *testing.B) (string, *kinesis.Client) {
	srv := startKinesalite(b)
	c := testClient(b, srv.Addr())
	createStream(b, c, "bench", 4)
	return srv.Addr(), c
}

func BenchmarkSink(b *testing.B) {
	addr, _ := benchStream(b)
	s := startSink(b, testConfig(addr, "bench"))
	sinktest.BenchmarkPublish(b, s, sinktest.Messages("bench", b.N, 1000))
}

func BenchmarkBareClient(b *testing.B) {
	_, c := benchStream(b)
	msgs := sinktest.Messages("bench", b.N, 1000)
	work := make(chan []types.PutRecordsRequestEntry)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	b.ResetTimer()
	for range DefaultMaxRequests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range work {
				for len(batch) > 0 {
					out, err := c.PutRecords(context.Background(), &kinesis.PutRecordsInput{StreamName: aws.String("bench"), Records: batch})
					if err != nil {
						mu.Lock()
						failed = err
						mu.Unlock()
						break
					}
					var again []types.PutRecordsRequestEntry
					for i, r := range out.Records {
						if r.ErrorCode != nil {
							again = append(again, batch[i])
						}
					}
					batch = again
				}
			}
		}()
	}
	for i := 0; i < len(msgs); i += maxBatchRecords {
		batch := make([]types.PutRecordsRequestEntry, 0, maxBatchRecords)
		for _, m := range msgs[i:min(i+maxBatchRecords, len(msgs))] {
			batch = append(batch, types.PutRecordsRequestEntry{Data: m.Envelope, PartitionKey: aws.String(m.AggregateID)})
		}
		work <- batch
	}
	close(work)
	wg.Wait()
	b.StopTimer()
	if failed != nil {
		b.Fatal(failed)
	}
	b.ReportMetric(float64(len(msgs))/b.Elapsed().Seconds(), "msgs/s")
}
