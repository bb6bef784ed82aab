// Package sqstest is an SQS server for tests: the AWS JSON 1.0 protocol of
// the calls the sqs sink and its tests make (CreateQueue,
// GetQueueAttributes, SendMessage, SendMessageBatch, ReceiveMessage,
// DeleteMessage, DeleteMessageBatch), over loopback TCP, for
// aws-sdk-go-v2's SQS client.
//
// It stands in for these behaviours of SQS, as the SQS Developer Guide
// describes them:
//
//   - FIFO queues (names ending in .fifo): MessageGroupId is required;
//     ReceiveMessage returns a group's messages in the order they were
//     sent, and none of a group while an earlier one of it is received and
//     not deleted (in flight); a MessageDeduplicationId seen in the last
//     five minutes is accepted and not enqueued again;
//   - standard queues: no group and no deduplication (this server
//     delivers them in send order, which real SQS does not promise; a
//     test that needs the order in which the server accepted messages
//     reads it from their MessageId with [Sequence]);
//   - batches: at most 10 entries with distinct ids, 10 message attributes
//     and MaximumMessageSize bytes (256 KiB) per message and in all,
//     entries that succeed and fail independently (Successful, Failed with
//     SenderFault);
//   - the visibility timeout (30 s) after which an undeleted message is
//     received again.
//
// Faults set with [Server.SetFaults] fail a share of requests (HTTP 500)
// or of batch entries (InternalError, not the sender's fault), or refuse
// chosen entries as the sender's fault. Everything else (IAM, long-term
// retention, delays, dead-letter queues, throughput limits) is not
// modelled.
package sqstest

import (
	"crypto/md5"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Region and Account are the server's; queue URLs are URL/Account/name.
const (
	Region  = "us-east-1"
	Account = "000000000000"
)

// DedupInterval is SQS's deduplication interval.
const DedupInterval = 5 * time.Minute

// Faults are the failures the server injects.
type Faults struct {
	// Requests is the share of SendMessage and SendMessageBatch requests
	// answered with HTTP 500 and nothing enqueued.
	Requests float64
	// Entries is the share of the other batch entries failed with
	// InternalError (SenderFault false).
	Entries float64
	// Refuse, when set, returns a reason to refuse an entry as the
	// sender's fault (InvalidParameterValue), given its group id (empty on
	// a standard queue) and its attributes.
	Refuse func(group string, attrs map[string]string) string
}

// Stats count what the server did.
type Stats struct {
	Requests, FailedRequests  int // SendMessage(Batch) requests, and those answered 500
	Entries, FailedEntries    int // entries seen, and those failed with InternalError
	Refused, Enqueued, Dedups int
}

// Server is the server. Create it with Start.
type Server struct {
	URL string

	mu     sync.Mutex
	queues map[string]*queue
	faults Faults
	rnd    *rand.Rand
	stats  Stats
	now    func() time.Time
	seq    int64
	srv    *http.Server
}

type queue struct {
	name  string
	fifo  bool
	msgs  []*message // not deleted, in send order
	dedup map[string]time.Time
}

type message struct {
	id, receipt, group, body, seq string
	attrs                         map[string]attribute
	visibleAt                     time.Time
	received                      int
}

type attribute struct {
	DataType    string `json:"DataType"`
	StringValue string `json:"StringValue,omitempty"`
	BinaryValue []byte `json:"BinaryValue,omitempty"`
}

// Start starts a server on a loopback port, stopped when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{URL: "http://" + l.Addr().String(), queues: map[string]*queue{}, rnd: rand.New(rand.NewPCG(1, 2)), now: time.Now}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(l) }()
	t.Cleanup(func() { _ = s.srv.Close() })
	return s
}

// CreateQueue creates the queue name (FIFO when it ends in .fifo), if it
// does not exist, and returns its URL.
func (s *Server) CreateQueue(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.createQueue(name)
}

func (s *Server) createQueue(name string) string {
	if s.queues[name] == nil {
		s.queues[name] = &queue{name: name, fifo: strings.HasSuffix(name, ".fifo"), dedup: map[string]time.Time{}}
	}
	return s.URL + "/" + Account + "/" + name
}

// SetFaults replaces the faults injected from now on.
func (s *Server) SetFaults(f Faults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = f
}

// SetClock replaces the server's clock (for the deduplication interval).
func (s *Server) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = now
}

// Advance moves the server's clock d ahead, so that messages received
// and not deleted come again after [VisibilityTimeout] without the wait.
func (s *Server) Advance(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now
	s.now = func() time.Time { return now().Add(d) }
}

// Stats returns the counts so far.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// apiError is an error answer of the JSON protocol.
type apiError struct {
	status      int
	code, query string // __type's shape name; x-amzn-query-error's code
	sender      bool
	msg         string
}

func senderError(code, query, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, code: code, query: query, sender: true, msg: fmt.Sprintf(format, args...)}
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	target := r.Header.Get("X-Amz-Target")
	op, ok := strings.CutPrefix(target, "AmazonSQS.")
	if r.Method != http.MethodPost || !ok {
		writeError(w, senderError("InvalidAction", "AWS.SimpleQueueService.InvalidAction", "unsupported request %s %s", r.Method, target))
		return
	}
	var in map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		writeError(w, senderError("InvalidParameterValue", "InvalidParameterValue", "body is not JSON: %v", err))
		return
	}
	var out any
	var aerr *apiError
	s.mu.Lock()
	switch op {
	case "CreateQueue":
		var name string
		_ = json.Unmarshal(in["QueueName"], &name)
		out = map[string]string{"QueueUrl": s.createQueue(name)}
	case "GetQueueAttributes":
		var q *queue
		if q, aerr = s.queue(in); aerr == nil {
			out = map[string]map[string]string{"Attributes": {
				"QueueArn":                              "arn:aws:sqs:" + Region + ":" + Account + ":" + q.name,
				"FifoQueue":                             strconv.FormatBool(q.fifo),
				"ApproximateNumberOfMessages":           strconv.Itoa(len(q.msgs)),
				"MaximumMessageSize":                    strconv.Itoa(maxMessage),
				"ContentBasedDeduplication":             "false",
				"ApproximateNumberOfMessagesNotVisible": "0",
			}}
		}
	case "SendMessage":
		out, aerr = s.sendMessage(in)
	case "SendMessageBatch":
		out, aerr = s.sendMessageBatch(in)
	case "ReceiveMessage":
		out, aerr = s.receive(in)
	case "DeleteMessage":
		var q *queue
		if q, aerr = s.queue(in); aerr == nil {
			var h string
			_ = json.Unmarshal(in["ReceiptHandle"], &h)
			q.delete(h)
			out = struct{}{}
		}
	case "DeleteMessageBatch":
		out, aerr = s.deleteBatch(in)
	default:
		aerr = senderError("InvalidAction", "AWS.SimpleQueueService.InvalidAction", "the action %s is not valid for this endpoint", op)
	}
	s.mu.Unlock()
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	_ = json.NewEncoder(w).Encode(out)
}

func writeError(w http.ResponseWriter, e *apiError) {
	fault := "Receiver"
	if e.sender {
		fault = "Sender"
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Header().Set("x-amzn-query-error", e.query+";"+fault)
	w.WriteHeader(e.status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazonaws.sqs#" + e.code, "message": e.msg})
}

// maxMessage is MaximumMessageSize, SQS's default.
const maxMessage = 256 << 10

func (s *Server) queue(in map[string]json.RawMessage) (*queue, *apiError) {
	var u string
	_ = json.Unmarshal(in["QueueUrl"], &u)
	q := s.queues[u[strings.LastIndexByte(u, '/')+1:]]
	if q == nil || !strings.HasPrefix(u, s.URL+"/"+Account+"/") {
		return nil, senderError("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue", "The specified queue does not exist.")
	}
	return q, nil
}

// sendEntry is one message to send, as SendMessage and the entries of
// SendMessageBatch have it.
type sendEntry struct {
	ID                     string               `json:"Id"`
	MessageBody            string               `json:"MessageBody"`
	MessageAttributes      map[string]attribute `json:"MessageAttributes"`
	MessageGroupID         string               `json:"MessageGroupId"`
	MessageDeduplicationID string               `json:"MessageDeduplicationId"`
}

type entryResult struct {
	ID                     string `json:"Id,omitempty"`
	MessageID              string `json:"MessageId"`
	MD5OfMessageBody       string `json:"MD5OfMessageBody"`
	MD5OfMessageAttributes string `json:"MD5OfMessageAttributes,omitempty"`
	SequenceNumber         string `json:"SequenceNumber,omitempty"`
}

type entryFailure struct {
	ID          string `json:"Id"`
	SenderFault bool   `json:"SenderFault"`
	Code        string `json:"Code"`
	Message     string `json:"Message"`
}

// injectRequestFault reports whether this send request fails as a whole.
func (s *Server) injectRequestFault() *apiError {
	s.stats.Requests++
	if s.faults.Requests > 0 && s.rnd.Float64() < s.faults.Requests {
		s.stats.FailedRequests++
		return &apiError{status: http.StatusInternalServerError, code: "InternalError", query: "InternalError", msg: "injected request failure"}
	}
	return nil
}

func (s *Server) sendMessage(in map[string]json.RawMessage) (any, *apiError) {
	q, aerr := s.queue(in)
	if aerr != nil {
		return nil, aerr
	}
	if aerr := s.injectRequestFault(); aerr != nil {
		return nil, aerr
	}
	raw, _ := json.Marshal(in)
	var e sendEntry
	_ = json.Unmarshal(raw, &e)
	res, fail := s.enqueue(q, e, false)
	if fail != nil {
		return nil, &apiError{status: http.StatusBadRequest, code: fail.Code, query: fail.Code, sender: fail.SenderFault, msg: fail.Message}
	}
	return res, nil
}

func (s *Server) sendMessageBatch(in map[string]json.RawMessage) (any, *apiError) {
	q, aerr := s.queue(in)
	if aerr != nil {
		return nil, aerr
	}
	var es []sendEntry
	_ = json.Unmarshal(in["Entries"], &es)
	switch {
	case len(es) == 0:
		return nil, senderError("EmptyBatchRequest", "AWS.SimpleQueueService.EmptyBatchRequest", "The batch request doesn't contain any entries.")
	case len(es) > 10:
		return nil, senderError("TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest", "Maximum number of entries per request are 10. You have sent %d.", len(es))
	}
	ids, total := map[string]bool{}, 0
	for _, e := range es {
		if ids[e.ID] {
			return nil, senderError("BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", "Id %s repeated.", e.ID)
		}
		ids[e.ID] = true
		total += size(e)
	}
	if total > maxMessage {
		return nil, senderError("BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong", "Batch requests cannot be longer than %d bytes. You have sent %d bytes.", maxMessage, total)
	}
	if aerr := s.injectRequestFault(); aerr != nil {
		return nil, aerr
	}
	out := struct {
		Successful []entryResult  `json:"Successful"`
		Failed     []entryFailure `json:"Failed"`
	}{Successful: []entryResult{}, Failed: []entryFailure{}}
	for _, e := range es {
		res, fail := s.enqueue(q, e, true)
		if fail != nil {
			out.Failed = append(out.Failed, *fail)
			continue
		}
		res.ID = e.ID
		out.Successful = append(out.Successful, *res)
	}
	return out, nil
}

func size(e sendEntry) int {
	n := len(e.MessageBody)
	for k, a := range e.MessageAttributes {
		n += len(k) + len(a.DataType) + len(a.StringValue) + len(a.BinaryValue)
	}
	return n
}

// enqueue checks and enqueues e, or returns why not.
func (s *Server) enqueue(q *queue, e sendEntry, batch bool) (*entryResult, *entryFailure) {
	s.stats.Entries++
	fail := func(sender bool, code, format string, args ...any) (*entryResult, *entryFailure) {
		return nil, &entryFailure{ID: e.ID, SenderFault: sender, Code: code, Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case e.MessageBody == "":
		return fail(true, "MissingParameter", "The request must contain the parameter MessageBody.")
	case size(e) > maxMessage:
		return fail(true, "InvalidParameterValue", "One or more parameters are invalid. Reason: Message must be shorter than %d bytes.", maxMessage)
	case len(e.MessageAttributes) > 10:
		return fail(true, "InvalidParameterValue", "Number of message attributes [%d] exceeds the allowed maximum [10].", len(e.MessageAttributes))
	case q.fifo && e.MessageGroupID == "":
		return fail(true, "MissingParameter", "The request must contain the parameter MessageGroupId.")
	case q.fifo && e.MessageDeduplicationID == "":
		return fail(true, "InvalidParameterValue", "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly")
	case !q.fifo && e.MessageDeduplicationID != "":
		return fail(true, "InvalidParameterValue", "The request include parameter that is not valid for this queue type. Reason: MessageDeduplicationId is invalid.")
	}
	for k, a := range e.MessageAttributes {
		if a.DataType == "String" && a.StringValue == "" {
			return fail(true, "InvalidParameterValue", "Message (user) attribute '%s' must contain a non-empty value of message attribute type 'String'.", k)
		}
	}
	attrs := map[string]string{}
	for k, a := range e.MessageAttributes {
		attrs[k] = a.StringValue
	}
	if s.faults.Refuse != nil {
		if why := s.faults.Refuse(e.MessageGroupID, attrs); why != "" {
			s.stats.Refused++
			return fail(true, "InvalidParameterValue", "%s", why)
		}
	}
	if batch && s.faults.Entries > 0 && s.rnd.Float64() < s.faults.Entries {
		s.stats.FailedEntries++
		return fail(false, "InternalError", "injected entry failure")
	}
	now := s.now()
	s.seq++
	res := &entryResult{MD5OfMessageBody: md5Hex([]byte(e.MessageBody)), MD5OfMessageAttributes: attributesMD5(e.MessageAttributes)}
	if q.fifo {
		res.SequenceNumber = fmt.Sprintf("%020d", s.seq)
		if at, ok := q.dedup[e.MessageDeduplicationID]; ok && now.Sub(at) < DedupInterval {
			s.stats.Dedups++
			res.MessageID = fmt.Sprintf("dedup-%d", s.seq)
			return res, nil
		}
		q.dedup[e.MessageDeduplicationID] = now
	}
	m := &message{id: fmt.Sprintf("%08d-%s", s.seq, messageIDTail), group: e.MessageGroupID, body: e.MessageBody, attrs: e.MessageAttributes, seq: res.SequenceNumber}
	res.MessageID = m.id
	q.msgs = append(q.msgs, m)
	s.stats.Enqueued++
	return res, nil
}

// Sequence returns the position at which the server accepted the message
// with this MessageId (1 for its first), across its queues; 0 for an id it
// did not make. SQS tells a standard queue's consumer no such thing: a test
// uses it to check the order in which a sender's messages were accepted,
// which redelivery after a lost receipt hides.
func Sequence(messageID string) int64 {
	head, rest, ok := strings.Cut(messageID, "-")
	if !ok || rest != messageIDTail {
		return 0
	}
	n, err := strconv.ParseInt(head, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// messageIDTail follows the sequence in the MessageIds the server makes.
const messageIDTail = "0000-4000-8000-000000000000"

func md5Hex(b []byte) string {
	sum := md5.Sum(b)
	return hex.EncodeToString(sum[:])
}

// attributesMD5 is the MD5 of message attributes as SQS computes it: per
// attribute in name order, the name, the data type and the transport type
// (1 string, 2 binary) and value, each length-prefixed (4 bytes, big
// endian).
func attributesMD5(as map[string]attribute) string {
	if len(as) == 0 {
		return ""
	}
	names := make([]string, 0, len(as))
	for k := range as {
		names = append(names, k)
	}
	sort.Strings(names)
	var b []byte
	field := func(v []byte) {
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	for _, k := range names {
		a := as[k]
		field([]byte(k))
		field([]byte(a.DataType))
		if a.BinaryValue != nil {
			b = append(b, 2)
			field(a.BinaryValue)
		} else {
			b = append(b, 1)
			field([]byte(a.StringValue))
		}
	}
	return md5Hex(b)
}

type received struct {
	MessageID              string               `json:"MessageId"`
	ReceiptHandle          string               `json:"ReceiptHandle"`
	MD5OfBody              string               `json:"MD5OfBody"`
	Body                   string               `json:"Body"`
	Attributes             map[string]string    `json:"Attributes,omitempty"`
	MessageAttributes      map[string]attribute `json:"MessageAttributes,omitempty"`
	MD5OfMessageAttributes string               `json:"MD5OfMessageAttributes,omitempty"`
}

// receive returns up to MaxNumberOfMessages visible messages, waiting up
// to WaitTimeSeconds for one; on a FIFO queue it skips every group whose
// first message is in flight (received and not deleted).
func (s *Server) receive(in map[string]json.RawMessage) (any, *apiError) {
	var max, wait int
	_ = json.Unmarshal(in["MaxNumberOfMessages"], &max)
	_ = json.Unmarshal(in["WaitTimeSeconds"], &wait)
	max = min(cmpOr(max, 1), 10)
	deadline := time.Now().Add(time.Duration(wait) * time.Second)
	for {
		q, aerr := s.queue(in)
		if aerr != nil {
			return nil, aerr
		}
		if got := q.take(s.now(), max); len(got) > 0 || !time.Now().Before(deadline) {
			return map[string][]received{"Messages": got}, nil
		}
		s.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		s.mu.Lock()
	}
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// VisibilityTimeout is the queues' (SQS's default): a message received
// and not deleted within it is received again.
const VisibilityTimeout = 30 * time.Second

func (q *queue) take(now time.Time, max int) []received {
	got := []received{}
	blocked := map[string]bool{} // FIFO groups whose first message is in flight
	for _, m := range q.msgs {
		if len(got) == max {
			break
		}
		if q.fifo && blocked[m.group] {
			continue
		}
		if m.visibleAt.After(now) {
			blocked[m.group] = true
			continue
		}
		m.received++
		m.receipt = fmt.Sprintf("%s-%d", m.id, m.received)
		m.visibleAt = now.Add(VisibilityTimeout)
		r := received{MessageID: m.id, ReceiptHandle: m.receipt, MD5OfBody: md5Hex([]byte(m.body)), Body: m.body,
			Attributes:        map[string]string{"ApproximateReceiveCount": strconv.Itoa(m.received)},
			MessageAttributes: m.attrs, MD5OfMessageAttributes: attributesMD5(m.attrs)}
		if q.fifo {
			r.Attributes["MessageGroupId"] = m.group
			r.Attributes["SequenceNumber"] = m.seq
		}
		got = append(got, r)
	}
	return got
}

func (q *queue) delete(receipt string) {
	for i, m := range q.msgs {
		if m.receipt == receipt {
			q.msgs = append(q.msgs[:i], q.msgs[i+1:]...)
			return
		}
	}
}

func (s *Server) deleteBatch(in map[string]json.RawMessage) (any, *apiError) {
	q, aerr := s.queue(in)
	if aerr != nil {
		return nil, aerr
	}
	var es []struct {
		ID            string `json:"Id"`
		ReceiptHandle string `json:"ReceiptHandle"`
	}
	_ = json.Unmarshal(in["Entries"], &es)
	ok := []map[string]string{}
	for _, e := range es {
		q.delete(e.ReceiptHandle)
		ok = append(ok, map[string]string{"Id": e.ID})
	}
	return map[string]any{"Successful": ok, "Failed": []any{}}, nil
}
