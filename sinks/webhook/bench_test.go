package webhook

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// The sink against the bare net/http client posting the same messages
// over as many connections to the same loopback receiver, so that the
// ratio of the two is the sink's cost: signing, headers, per-aggregate
// order.
//
//	go test -run '^$' -bench . ./sinks/webhook

const benchConns = 16

func benchReceiver(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(srv.Close)
	return srv
}

func BenchmarkSink(b *testing.B) {
	srv := benchReceiver(b)
	s := newSink(b, Config{URL: srv.URL + "/hooks/{aggregate_type}", MaxConnsPerHost: benchConns})
	sinktest.RunSink(b, s)
	sinktest.BenchmarkPublish(b, s, sinktest.Messages("bench", b.N, 1000))
}

// BenchmarkSinkBatch is the batch mode, 20 messages per POST, against the
// same reference: what batching buys over one request per message.
func BenchmarkSinkBatch(b *testing.B) {
	srv := benchReceiver(b)
	s := newSink(b, Config{URL: srv.URL + "/hooks/{aggregate_type}", MaxConnsPerHost: benchConns, Batch: Batch{MaxMessages: 20, Linger: time.Millisecond}})
	sinktest.RunSink(b, s)
	sinktest.BenchmarkPublish(b, s, sinktest.Messages("bench", b.N, 1000))
}

func BenchmarkBareClient(b *testing.B) {
	srv := benchReceiver(b)
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: benchConns, MaxIdleConnsPerHost: benchConns}}
	defer client.CloseIdleConnections()
	msgs := sinktest.Messages("bench", b.N, 1000)
	work := make(chan *relay.Message)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	b.ResetTimer()
	for range benchConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range work {
				resp, err := client.Post(srv.URL+"/hooks/"+m.AggregateType, "application/json", bytes.NewReader(m.Envelope))
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusNoContent {
						err = fmt.Errorf("status %s", resp.Status)
					}
				}
				if err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
				}
			}
		}()
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
