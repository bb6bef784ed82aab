package sns

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/internal/awssink"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// publishBatchServer answers PublishBatch as SNS's query protocol does,
// which goaws does not implement: entries of group "bad" fail as the
// sender's fault, entries of group "flaky" fail as SNS's own, the rest
// succeed. It records each entry's FIFO ids.
type publishBatchServer struct {
	mu       sync.Mutex
	requests int
	ids      map[string][2]string // message_id attribute: group, dedup id
}

func (p *publishBatchServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/xml")
	if r.Form.Get("Action") != "PublishBatch" {
		fmt.Fprint(w, `<GetTopicAttributesResponse><GetTopicAttributesResult><Attributes></Attributes></GetTopicAttributesResult></GetTopicAttributesResponse>`)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests++
	var ok, failed strings.Builder
	for i := 1; ; i++ {
		pre := fmt.Sprintf("PublishBatchRequestEntries.member.%d.", i)
		id := r.Form.Get(pre + "Id")
		if id == "" {
			break
		}
		group := r.Form.Get(pre + "MessageGroupId")
		for k := 1; r.Form.Get(fmt.Sprintf("%sMessageAttributes.entry.%d.Name", pre, k)) != ""; k++ {
			if r.Form.Get(fmt.Sprintf("%sMessageAttributes.entry.%d.Name", pre, k)) == "message_id" {
				p.ids[r.Form.Get(fmt.Sprintf("%sMessageAttributes.entry.%d.Value.StringValue", pre, k))] = [2]string{group, r.Form.Get(pre + "MessageDeduplicationId")}
			}
		}
		switch group {
		case "bad":
			fmt.Fprintf(&failed, `<member><Id>%s</Id><Code>InvalidParameter</Code><Message>aggregate bad is closed</Message><SenderFault>true</SenderFault></member>`, id)
		case "flaky":
			fmt.Fprintf(&failed, `<member><Id>%s</Id><Code>InternalError</Code><Message>try again</Message><SenderFault>false</SenderFault></member>`, id)
		default:
			fmt.Fprintf(&ok, `<member><Id>%s</Id><MessageId>m-%s</MessageId></member>`, id, id)
		}
	}
	fmt.Fprintf(w, `<PublishBatchResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><PublishBatchResult><Successful>%s</Successful><Failed>%s</Failed></PublishBatchResult><ResponseMetadata><RequestId>r</RequestId></ResponseMetadata></PublishBatchResponse>`, ok.String(), failed.String())
}

// TestPublishBatchOutcomes: one PublishBatch carries the messages of four
// aggregates with their FIFO ids; each entry gets its own outcome.
func TestPublishBatchOutcomes(t *testing.T) {
	p := &publishBatchServer{ids: map[string][2]string{}}
	srv := httptest.NewServer(p)
	defer srv.Close()
	s := newSink(t, Config{TopicARN: "arn:aws:sns:us-east-1:000000000000:orders.fifo", Common: awssink.Common{Connection: awssink.Connection{Region: "us-east-1", Endpoint: srv.URL,
		// One worker that fills a batch of four: the four messages go in one
		// request however slowly the machine hands them over.
		AccessKeyID: "k", SecretAccessKey: "s"}, BatchSize: 4, MaxConcurrentBatches: 1, Linger: time.Minute}})
	msgs := sinktest.Messages("batch", 4, 4)
	msgs[1].AggregateID, msgs[2].AggregateID = "bad", "flaky"
	rec := sinktest.NewRecorder()
	for _, m := range msgs {
		s.Publish(t.Context(), m, rec.Done)
	}
	out := rec.Wait(t, 4, time.Minute)
	if err := out[msgs[1]]; err == nil || relay.Retryable(err) || !strings.Contains(err.Error(), "InvalidParameter: aggregate bad is closed") {
		t.Errorf("sender's fault: %v, want permanent with the reason", err)
	}
	if err := out[msgs[2]]; err == nil || !relay.Retryable(err) || !strings.Contains(err.Error(), "InternalError") {
		t.Errorf("SNS's fault: %v, want retryable", err)
	}
	for _, m := range []*relay.Message{msgs[0], msgs[3]} {
		if out[m] != nil {
			t.Errorf("message %s: %v", m.ID, out[m])
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.requests != 1 {
		t.Errorf("%d PublishBatch requests, want 1", p.requests)
	}
	for _, m := range msgs {
		if got := p.ids[m.ID]; got != [2]string{m.AggregateID, m.ID} {
			t.Errorf("message %s: group and dedup ids %v, want %s and the message id", m.ID, got, m.AggregateID)
		}
	}
}
