// Package goawstest runs goaws (github.com/Admiral-Piett/goaws, pinned in
// go.mod as a tool), an SNS and SQS emulator of the query protocol, for the
// sns sink's tests: it builds the binary once, starts it on a loopback
// port with a YAML configuration, and reads what reached a queue
// subscribed to a topic, over the query protocol (goaws does not speak the
// JSON protocol of the current SQS client).
//
// goaws stands in for Publish, topics, subscriptions with raw delivery and
// their queues. It does not implement PublishBatch, GetTopicAttributes,
// FIFO topics or deduplication, so the tests that need those do not run
// against it.
package goawstest

import (
	"encoding/xml"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Region and Account are the emulator's.
const (
	Region  = "us-east-1"
	Account = "000000000000"
)

var build struct {
	once sync.Once
	bin  string
	err  error
}

// binary builds goaws once per test process.
func binary() (string, error) {
	build.once.Do(func() {
		dir, err := os.MkdirTemp("", "goaws")
		if err != nil {
			build.err = err
			return
		}
		build.bin = filepath.Join(dir, "goaws")
		out, err := exec.Command("go", "build", "-o", build.bin, "github.com/Admiral-Piett/goaws/app/cmd").CombinedOutput()
		if err != nil {
			build.err = fmt.Errorf("go build goaws: %v\n%s", err, out)
		}
	})
	return build.bin, build.err
}

// Server is a running goaws.
type Server struct {
	URL  string // http://127.0.0.1:<port>
	Port string
	cmd  *exec.Cmd
}

// Start builds and starts goaws on a free loopback port, with no topic or
// queue, and stops it when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	cfg := filepath.Join(t.TempDir(), "goaws.yaml")
	yaml := fmt.Sprintf("Local:\n  Host: 127.0.0.1\n  Port: %s\n  Region: %s\n  AccountId: \"%s\"\n  LogToFile: false\n  QueueAttributeDefaults:\n    VisibilityTimeout: 30\n    ReceiveMessageWaitTimeSeconds: 0\n    MaximumMessageSize: 262144\n", port, Region, Account)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-config", cfg, "Local")
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &Server{URL: "http://127.0.0.1:" + port, Port: port, cmd: cmd}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := http.Get(s.URL + "/health")
		if err == nil {
			resp.Body.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("goaws did not answer on %s: %v", s.URL, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Call makes one query-protocol call and returns the answer's body.
func (s *Server) Call(t testing.TB, form url.Values) []byte {
	t.Helper()
	b, err := s.call(form)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (s *Server) call(form url.Values) ([]byte, error) {
	resp, err := http.PostForm(s.URL+"/", form)
	if err != nil {
		return nil, fmt.Errorf("goaws %s: %w", form.Get("Action"), err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("goaws %s: %s: %s", form.Get("Action"), resp.Status, b)
	}
	return b, nil
}

// TopicARN is the ARN of the topic name.
func TopicARN(name string) string { return "arn:aws:sns:" + Region + ":" + Account + ":" + name }

// Subscribe creates the topic and a queue, subscribes the queue with raw
// delivery and returns the queue's URL.
func (s *Server) Subscribe(t testing.TB, topic string) string {
	t.Helper()
	s.Call(t, url.Values{"Action": {"CreateTopic"}, "Name": {topic}})
	q := topic + "-q"
	s.Call(t, url.Values{"Action": {"CreateQueue"}, "QueueName": {q}})
	s.Call(t, url.Values{"Action": {"Subscribe"}, "TopicArn": {TopicARN(topic)}, "Protocol": {"sqs"},
		"Endpoint":               {"arn:aws:sqs:" + Region + ":" + Account + ":" + q},
		"Attributes.entry.1.key": {"RawMessageDelivery"}, "Attributes.entry.1.value": {"true"}})
	return s.URL + "/" + Account + "/" + q
}

// Message is one message a queue held.
type Message struct {
	Body       string
	Attributes map[string]string
}

// Receive takes up to 10 messages from the queue and deletes them.
func (s *Server) Receive(queueURL string) ([]Message, error) {
	b, err := s.call(url.Values{"Action": {"ReceiveMessage"}, "QueueUrl": {queueURL}, "MaxNumberOfMessages": {"10"}, "MessageAttributeName.1": {"All"}})
	if err != nil {
		return nil, err
	}
	var out struct {
		Messages []struct {
			Body          string `xml:"Body"`
			ReceiptHandle string `xml:"ReceiptHandle"`
			Attrs         []struct {
				Name  string `xml:"Name"`
				Value string `xml:"Value>StringValue"`
			} `xml:"MessageAttribute"`
		} `xml:"ReceiveMessageResult>Message"`
	}
	if err := xml.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("goaws ReceiveMessage: %w: %.300s", err, b)
	}
	var ms []Message
	for _, m := range out.Messages {
		got := Message{Body: m.Body, Attributes: map[string]string{}}
		for _, a := range m.Attrs {
			got.Attributes[a.Name] = a.Value
		}
		ms = append(ms, got)
		if _, err := s.call(url.Values{"Action": {"DeleteMessage"}, "QueueUrl": {queueURL}, "ReceiptHandle": {m.ReceiptHandle}}); err != nil {
			return ms, err
		}
	}
	return ms, nil
}

// Kill stops goaws with SIGKILL; what it held is lost.
func (s *Server) Kill() { _ = s.cmd.Process.Kill() }
