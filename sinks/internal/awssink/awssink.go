// Package awssink is what the sqs and sns sinks share: the AWS client
// configuration, message attributes from the relay's headers (with SQS's
// and SNS's limit of 10 per message), the checks of a body and a group
// id, and the mapping of per-entry batch outcomes.
package awssink

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/smithy-go"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

// Client is the connection settings of a sink, as its configuration
// holds them.
type Client struct {
	Region, Endpoint                           string
	AccessKeyID, SecretAccessKey, SessionToken string
	Timeout                                    time.Duration
	TLS                                        *tls.Config
}

// Config returns the AWS configuration of c: static credentials when
// AccessKeyID is set, otherwise the SDK's default chain (environment,
// shared files, web identity, instance role). The SDK does not retry: the
// relay retries failed messages itself, with its backoff, so that a retry
// is counted and an entry is never sent twice by two layers.
func (c Client) Config(ctx context.Context) (aws.Config, error) {
	hc := awshttp.NewBuildableClient().WithTimeout(c.Timeout).WithTransportOptions(func(tr *http.Transport) {
		if c.TLS != nil {
			tr.TLSClientConfig = c.TLS
		}
	})
	opts := []func(*config.LoadOptions) error{
		config.WithHTTPClient(hc),
		config.WithRetryMaxAttempts(1),
	}
	if c.Region != "" {
		opts = append(opts, config.WithRegion(c.Region))
	}
	if c.AccessKeyID != "" {
		opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(c.AccessKeyID, c.SecretAccessKey, c.SessionToken)))
	}
	if c.Endpoint != "" {
		opts = append(opts, config.WithBaseEndpoint(c.Endpoint))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return aws.Config{}, err
	}
	if cfg.Region == "" {
		return aws.Config{}, errors.New("no AWS region: set region, or AWS_REGION in the environment")
	}
	return cfg, nil
}

// MaxAttributes is the most message attributes SQS and SNS accept on one
// message.
const MaxAttributes = 10

// PackedAttribute names the attribute that holds, as one JSON object, the
// headers that do not fit in attributes of their own.
const PackedAttribute = "outboxrelay_headers"

// Attribute is one String message attribute.
type Attribute struct{ Name, Value string }

// Attributes maps m's headers (b.Headers: the relay's, then the row's) to
// message attributes. When there are at most MaxAttributes and none is
// empty (SQS refuses an empty String value), each header is an attribute
// of its own, named as the header. Otherwise the first MaxAttributes-1
// non-empty headers are attributes of their own and every other header is
// a member of one JSON object in the attribute PackedAttribute: no header
// is dropped. A header whose name cannot name an attribute, or a row
// header named PackedAttribute, is an error meant as a permanent failure.
func Attributes(b sinks.Binding, m *relay.Message) ([]Attribute, error) {
	var own [16]envelope.Header
	hs, _ := b.Headers(own[:0], m)
	if err := sinks.CheckHeaders(hs); err != nil {
		return nil, err
	}
	fit := len(hs) <= MaxAttributes
	for _, h := range hs {
		if err := checkName(h.Key); err != nil {
			return nil, err
		}
		if h.Value == "" {
			fit = false
		}
	}
	attrs := make([]Attribute, 0, min(len(hs), MaxAttributes))
	if fit {
		for _, h := range hs {
			attrs = append(attrs, Attribute{h.Key, h.Value})
		}
		return attrs, nil
	}
	packed := map[string]string{}
	for _, h := range hs {
		if h.Value != "" && len(attrs) < MaxAttributes-1 {
			attrs = append(attrs, Attribute{h.Key, h.Value})
			continue
		}
		packed[h.Key] = h.Value
	}
	js, err := json.Marshal(packed)
	if err != nil {
		return nil, err
	}
	return append(attrs, Attribute{PackedAttribute, string(js)}), nil
}

// checkName reports why s cannot name a message attribute: SQS's and
// SNS's rule is up to 256 of A-Z, a-z, 0-9, "_", "-" and ".", no leading,
// trailing or repeated ".", no AWS. or Amazon. prefix.
func checkName(s string) error {
	why := ""
	switch {
	case s == PackedAttribute:
		why = "the sink packs the headers that do not fit in attributes of their own under it"
	case s == "" || len(s) > 256:
		why = "an attribute name has 1 to 256 characters"
	case strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") || strings.Contains(s, ".."):
		why = "an attribute name does not start or end with a period or repeat one"
	case len(s) >= 4 && strings.EqualFold(s[:4], "aws.") || len(s) >= 7 && strings.EqualFold(s[:7], "amazon."):
		why = "AWS reserves the prefixes AWS. and Amazon."
	default:
		for i := 0; i < len(s); i++ {
			c := s[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
				why = fmt.Sprintf("an attribute name has only letters, digits, _, - and . (%s at offset %d)", sinks.Char(s, i), i)
				break
			}
		}
	}
	if why == "" {
		return nil
	}
	return fmt.Errorf("header %q cannot be a message attribute: %s; rename it in the row", s, why)
}

// Check checks m for sending: its body (CheckBody), its attributes
// (Attributes) and its size against maxBytes, the setting key names. It
// returns the attributes and the size; an error is meant as a permanent
// failure.
func Check(m *relay.Message, b sinks.Binding, key string, maxBytes int) ([]Attribute, int, error) {
	if err := CheckBody(m.Envelope); err != nil {
		return nil, 0, err
	}
	attrs, err := Attributes(b, m)
	if err != nil {
		return nil, 0, err
	}
	size := Size(m.Envelope, attrs)
	if size > maxBytes {
		return nil, 0, fmt.Errorf("the message is %d bytes with its attributes, above %s (%d)", size, key, maxBytes)
	}
	return attrs, size, nil
}

// Size is what a message counts against the service's size limit: the
// body and every attribute's name, type ("String") and value.
func Size(body []byte, attrs []Attribute) int {
	n := len(body)
	for _, a := range attrs {
		n += len(a.Name) + len("String") + len(a.Value)
	}
	return n
}

// CheckBody reports why body cannot be a message body: SQS and SNS take
// text, the XML characters #x9, #xA, #xD, #x20-#xD7FF, #xE000-#xFFFD and
// #x10000-#x10FFFF in UTF-8. A binary envelope (a bytea payload is
// base64 in the JSON formats; a debezium body is the payload as is) with
// other bytes cannot be sent.
func CheckBody(body []byte) error {
	for i := 0; i < len(body); {
		r, n := utf8.DecodeRune(body[i:])
		if r == utf8.RuneError && n <= 1 {
			return fmt.Errorf("the message body is not UTF-8 text (byte 0x%02X at offset %d), which SQS and SNS cannot carry; use envelope.format envelope or cloudevents, which carry a binary payload as base64", body[i], i)
		}
		if !(r == 0x9 || r == 0xA || r == 0xD || r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000) {
			return fmt.Errorf("the message body has the character %U at offset %d, which SQS and SNS refuse", r, i)
		}
		i += n
	}
	return nil
}

// GroupID is the MessageGroupId of an aggregate on a FIFO queue or topic:
// its aggregate_id when that is 1 to 128 printable ASCII characters, the
// only ones a group id may hold, and otherwise "sha256:" and the hex of
// its SHA-256, which keeps the aggregate's messages in one group.
func GroupID(aggregateID string) string {
	ok := aggregateID != "" && len(aggregateID) <= 128
	for i := 0; ok && i < len(aggregateID); i++ {
		ok = aggregateID[i] > 0x20 && aggregateID[i] < 0x7f
	}
	if ok {
		return aggregateID
	}
	sum := sha256.Sum256([]byte(aggregateID))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// EntryOutcome is the outcome of a batch entry the service failed: a
// relay.Permanent error when the service blames the entry (SenderFault),
// which the relay dead-letters with this reason, and a retryable one
// otherwise.
func EntryOutcome(what string, senderFault bool, code, msg string) error {
	err := fmt.Errorf("%s refused the message: %s: %s", what, code, msg)
	if senderFault {
		return relay.Permanent(err)
	}
	return err
}

// RequestOutcome is the outcome, for each of its messages, of a batch
// request that failed as a whole: retryable, whatever the cause. A
// request-level refusal (access denied, no such queue, throttling) is the
// destination's or the configuration's, not a message's, so it never
// dead-letters the messages; the relay retries until it is fixed.
func RequestOutcome(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return fmt.Errorf("%s: %s: %s", what, ae.ErrorCode(), ae.ErrorMessage())
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Entry is one message of a batch, ready to send to Dest.
type Entry[T any] struct {
	I    int    // the message's index in the batch
	Dest string // queue URL or topic ARN
	In   T      // the request entry
	Size int    // what it counts against the size limit
}

// Requests splits es into requests: by destination, in the order each
// first appears, and within one into runs of at most maxBytes in all (an
// entry alone may be up to maxBytes), calling send for each.
func Requests[T any](es []Entry[T], maxBytes int, send func(dest string, es []Entry[T])) {
	var dests []string
	by := map[string][]Entry[T]{}
	for _, e := range es {
		if _, ok := by[e.Dest]; !ok {
			dests = append(dests, e.Dest)
		}
		by[e.Dest] = append(by[e.Dest], e)
	}
	for _, d := range dests {
		run := by[d]
		for len(run) > 0 {
			n, size := 0, 0
			for n < len(run) && (n == 0 || size+run[n].Size <= maxBytes) {
				size += run[n].Size
				n++
			}
			send(d, run[:n])
			run = run[n:]
		}
	}
}

// Answered sets, in errs, the outcome of every entry of es the service
// left out of its answer: ok holds the request ids ("0", "1", ... by
// position in es) it reported, successful or failed.
func Answered[T any](what string, es []Entry[T], ok map[string]bool, errs []error) {
	for k, e := range es {
		if !ok[fmt.Sprint(k)] {
			errs[e.I] = fmt.Errorf("%s: the batch answer has no outcome for entry %d", what, k)
		}
	}
}
