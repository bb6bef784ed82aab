package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxrelay/outboxrelay/sinks/sqs/sqstest"
)

// The sqs sink end to end through the relay binary, against the in-test
// SQS server: about 30% of the batch entries and 5% of the requests fail,
// the relay is killed with SIGKILL mid-way, and SQS refuses every entry of
// one aggregate as the sender's fault.

// queueReader is the ledger's receiving side: a consumer of the queue
// that records every message in arrival order, repeats kept.
type queueReader struct {
	mu   sync.Mutex
	got  []delivered
	seen map[string]bool
	dups int
}

func readQueue(t *testing.T, srv *sqstest.Server, url string) *queueReader {
	r := &queueReader{seen: map[string]bool{}}
	c := sqs.New(sqs.Options{Region: sqstest.Region, BaseEndpoint: aws.String(srv.URL), Credentials: aws.AnonymousCredentials{}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
			if err != nil {
				continue
			}
			for _, m := range out.Messages {
				var env map[string]any
				_ = json.Unmarshal([]byte(aws.ToString(m.Body)), &env)
				id := aws.ToString(m.MessageAttributes["message_id"].StringValue)
				r.mu.Lock()
				if r.seen[id] {
					r.dups++
				}
				r.seen[id] = true
				r.got = append(r.got, delivered{id: id, key: aws.ToString(m.MessageAttributes["aggregate_id"].StringValue), env: env})
				r.mu.Unlock()
				if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil {
					t.Errorf("delete: %v", err)
				}
			}
		}
	}()
	return r
}

func (r *queueReader) delivered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

func (r *queueReader) waitDelivered(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for r.delivered() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages delivered within %s", r.delivered(), n, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestSQSEndToEnd(t *testing.T) {
	e := newEnv(t)
	srv := sqstest.Start(t)
	url := srv.CreateQueue("orders.fifo")
	srv.SetFaults(sqstest.Faults{Entries: 0.3, Requests: 0.05, Refuse: func(group string, _ map[string]string) string {
		if group == "refused" {
			return "aggregate refused is closed"
		}
		return ""
	}})
	r := readQueue(t, srv, url)
	sinkYAML := fmt.Sprintf(`  sqs:
    queue_url: %s
    endpoint: %s
    region: %s
    access_key_id: test
    secret_access_key: test
    timeout: 2s
relay:
  max_attempts: 2`, url, srv.URL, sqstest.Region)

	p, ids, refused, want := e.crashMidway(t, r, "sqs", sinkYAML, []string{"1", "2", "3", "4", "5", "6", "7", "8"}, 25, 3, 200)

	_, body := get(t, "http://"+p.httpAddr()+"/metrics")
	series := fmt.Sprintf(`{destination="%s",sink="sqs",slot="outboxrelay"}`, url)
	if n := metricValues(body, "outboxrelay_messages_published_total")[series]; n < 1 {
		t.Errorf("outboxrelay_messages_published_total%s = %v, want some: %v", series, n, metricValues(body, "outboxrelay_messages_published_total"))
	}

	var letters, parked, withReason int
	deadline := time.Now().Add(30 * time.Second)
	for {
		e.db.QueryRow(t.Context(), `SELECT count(*), count(*) FILTER (WHERE error LIKE '%InvalidParameterValue: aggregate refused is closed%')
			FROM outboxrelay.dead_letters WHERE aggregate_id = 'refused'`).Scan(&letters, &withReason)
		e.db.QueryRow(t.Context(), `SELECT count(DISTINCT message_id) FROM outboxrelay.parked WHERE aggregate_id = 'refused'`).Scan(&parked)
		if letters+parked >= len(refused) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	p.stop()

	verifyCfg := e.writeConfig(fmt.Sprintf("postgres:\n  url: %s\nsink:\n  type: sqs\n%s\n", e.dbURL, sinkYAML))
	if out, code := e.cli("verify", "--config", verifyCfg, "--since", "1h"); code != 2 || !strings.Contains(out, "verify cannot read an SQS queue") {
		t.Errorf("verify with the sqs sink: exit %d, %s; want exit 2 and the refusal", code, out)
	}

	st := srv.Stats()
	r.mu.Lock()
	defer r.mu.Unlock()
	checkCommitOrder(t, ids, r.got)
	lost := 0
	for _, list := range ids {
		for _, id := range list {
			if !r.seen[id] {
				lost++
			}
		}
	}
	for _, id := range refused {
		if r.seen[id] {
			t.Errorf("refused message %s was delivered", id)
		}
	}
	t.Logf("ledger: %d rows committed (%d to deliver, %d refused), 1 kill -9, %d requests (%d failed), %d entries (%d failed, %d refused), %d enqueued, %d deduplicated by SQS; %d lost, %d duplicates at the consumer; %d dead letters (%d with the reason), %d parked",
		want+len(refused), want, len(refused), st.Requests, st.FailedRequests, st.Entries, st.FailedEntries, st.Refused, st.Enqueued, st.Dedups, lost, r.dups, letters, withReason, parked)
	if lost != 0 {
		t.Errorf("%d messages lost", lost)
	}
	if letters < 1 || withReason != letters || letters+parked != len(refused) {
		t.Errorf("refused aggregate: %d dead letters (%d with the reason) and %d parked, want %d in all", letters, withReason, parked, len(refused))
	}
	if st.FailedEntries < 100 || st.FailedRequests < 5 {
		t.Errorf("faults injected: %d entries, %d requests; want at least 100 and 5", st.FailedEntries, st.FailedRequests)
	}
}

// TestAWSBadInput: an unreachable endpoint, a missing queue, a template
// outside the name and a missing secret (or its unreadable file) are
// each one clear error at start, exit 2, and no slot is created.
func TestAWSBadInput(t *testing.T) {
	e := newEnv(t)
	srv := sqstest.Start(t)
	creds := "    region: us-east-1\n    access_key_id: test\n    secret_access_key: test"
	for _, c := range []struct {
		name, typ, sink, want string
	}{
		{"sqs unreachable", "sqs", "  sqs:\n    queue_url: http://127.0.0.1:1/000000000000/q.fifo\n    endpoint: http://127.0.0.1:1\n" + creds,
			"cannot reach the SQS queue http://127.0.0.1:1/000000000000/q.fifo"},
		{"sqs missing queue", "sqs", fmt.Sprintf("  sqs:\n    queue_url: %s/000000000000/missing.fifo\n    endpoint: %s\n%s", srv.URL, srv.URL, creds),
			"The specified queue does not exist"},
		{"sqs template", "sqs", "  sqs:\n    queue_url: \"https://sqs.us-east-1.amazonaws.com/{aggregate_type}/q\"\n" + creds,
			"sink.sqs.queue_url: \"https://sqs.us-east-1.amazonaws.com/{aggregate_type}/q\" has a placeholder outside the queue name"},
		{"sqs missing secret", "sqs", "  sqs:\n    queue_url: https://sqs.us-east-1.amazonaws.com/1/q\n    access_key_id: test",
			"sink.sqs.access_key_id is set without sink.sqs.secret_access_key"},
		{"sns unreachable", "sns", "  sns:\n    topic_arn: arn:aws:sns:us-east-1:000000000000:t\n    endpoint: http://127.0.0.1:1\n" + creds,
			"cannot reach the SNS topic arn:aws:sns:us-east-1:000000000000:t"},
		{"sns not an arn", "sns", "  sns:\n    topic_arn: orders\n" + creds,
			"sink.sns.topic_arn: \"orders\" is not an SNS topic ARN"},
		{"sns template", "sns", "  sns:\n    topic_arn: \"arn:aws:sns:{aggregate_type}:1:t\"\n" + creds,
			"sink.sns.topic_arn: \"arn:aws:sns:{aggregate_type}:1:t\" has a placeholder outside the topic name"},
		{"sns missing secret", "sns", "  sns:\n    topic_arn: arn:aws:sns:us-east-1:1:t\n    access_key_id: test",
			"sink.sns.access_key_id is set without sink.sns.secret_access_key"},
		{"sns missing secret file", "sns", "  sns:\n    topic_arn: arn:aws:sns:us-east-1:1:t\n    access_key_id: test\n    secret_access_key_file: /nonexistent/aws-secret",
			"sink.sns.secret_access_key_file: stat /nonexistent/aws-secret"},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkBadStart(t, e, "aws_bad_"+strings.ReplaceAll(c.name, " ", "_"), c.typ, c.sink, c.want)
		})
	}
}

// crashMidway runs the relay of sinkType with sinkYAML while rounds of
// rows go in (per rows of each of aggs and 2 of the aggregate "refused" a
// round), kills it once atKill rows are delivered (failing t when the
// kill came after the whole first run), inserts as many rows again and
// restarts it until every row of aggs is delivered. It returns the
// relay, the ids of each aggregate's rows, those of "refused" and how
// many rows of aggs there are.
func (e *env) crashMidway(t *testing.T, r *queueReader, sinkType, sinkYAML string, aggs []string, per, rounds, atKill int) (*proc, map[string][]string, []string, int) {
	t.Helper()
	ids := map[string][]string{}
	var refused []string
	insert := func() {
		for range rounds {
			for _, agg := range aggs {
				ids[agg] = append(ids[agg], e.insert("public.outbox", "order", agg, per)...)
			}
			refused = append(refused, e.insert("public.outbox", "order", "refused", 2)...)
		}
	}
	p := e.startSinkRelay(sinkType, sinkYAML)
	insert()
	r.waitDelivered(t, atKill, 2*time.Minute)
	p.kill()
	if delivered, first := r.delivered(), rounds*per*len(aggs); delivered >= first {
		t.Errorf("the kill came after all %d rows of the first run were delivered (%d): it tested no crash mid-way", first, delivered)
	}
	insert()
	want := 0
	for _, list := range ids {
		want += len(list)
	}
	p = e.startSinkRelay(sinkType, sinkYAML)
	r.waitDelivered(t, want, 2*time.Minute)
	return p, ids, refused, want
}
