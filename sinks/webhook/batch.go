package webhook

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/outboxrelay/outboxrelay/relay"
)

// Media types of a batch body: a JSON array of the messages' envelopes,
// or of their CloudEvents in structured mode (the CloudEvents JSON batch
// format).
const (
	batchContentType           = "application/json"
	cloudEventsBatchContenType = "application/cloudevents-batch+json"
)

// sendBatch is the Send of the sink's queue: one message is POSTed as
// itself (see send); several, one of each of distinct aggregates (batch
// mode), are POSTed as one JSON array per URL they render to, in batch
// order. A batch answered with a retryable failure fails each of its
// messages with it, so the relay retries them all; one answered with a
// permanent failure is split, and each message is POSTed alone, so that
// only the messages the receiver refuses by themselves are dead-lettered.
func (s *Sink) sendBatch(ctx context.Context, ms []*relay.Message) []error {
	errs := make([]error, len(ms))
	if len(ms) == 1 {
		errs[0] = s.send(ctx, ms[0])
		return errs
	}
	type group struct {
		u   *url.URL
		idx []int
	}
	var groups []*group
	byURL := map[string]*group{}
	for i, m := range ms {
		u, err := s.ep.render(m)
		if err != nil {
			m.Destination = s.ep.origin
			errs[i] = relay.Permanent(err)
			continue
		}
		m.Destination = destination(u)
		if !json.Valid(m.Envelope) {
			errs[i] = relay.Permanent(fmt.Errorf("message %s: its body is not JSON, so it cannot be sent in a batch (an array of JSON envelopes); set sink.webhook.batch.max_messages to 1 or envelope.format to envelope or cloudevents", m.ID))
			continue
		}
		g := byURL[u.String()]
		if g == nil {
			g = &group{u: u}
			byURL[u.String()] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
	}
	for _, g := range groups {
		if len(g.idx) == 1 {
			errs[g.idx[0]] = s.send(ctx, ms[g.idx[0]])
			continue
		}
		err := s.postBatch(ctx, g.u, ms, g.idx)
		if err != nil && !relay.Retryable(err) {
			for _, i := range g.idx { // split: each alone
				errs[i] = s.send(ctx, ms[i])
			}
			continue
		}
		for _, i := range g.idx {
			errs[i] = err
		}
	}
	return errs
}

// postBatch POSTs the messages ms[idx] to u as one JSON array, signed as
// one Standard Webhooks message whose id is batchID of theirs.
func (s *Sink) postBatch(ctx context.Context, u *url.URL, ms []*relay.Message, idx []int) error {
	var body bytes.Buffer
	ids := make([]string, len(idx))
	body.WriteByte('[')
	for k, i := range idx {
		if k > 0 {
			body.WriteByte(',')
		}
		body.Write(ms[i].Envelope)
		ids[k] = ms[i].ID
	}
	body.WriteByte(']')
	ct := batchContentType
	if ms[idx[0]].Format == relay.FormatCloudEvents {
		ct = cloudEventsBatchContenType
	}
	id := batchID(ids)
	h := http.Header{"Content-Type": {ct}, HeaderWebhookID: {id}}
	return s.post(ctx, u, h, id, body.Bytes(), ms[idx[0]].Destination)
}

// batchID is the webhook-id of a batch of the messages ids, in order:
// "batch_" and the first 32 hex digits of the SHA-256 of the ids, so that
// the same batch sent again has the same id. A batch of other messages
// has another; receivers dedupe on the message_id of each element.
func batchID(ids []string) string {
	h := sha256.New()
	for _, id := range ids {
		h.Write([]byte(id))
		h.Write([]byte{0})
	}
	return "batch_" + hex.EncodeToString(h.Sum(nil))[:32]
}

// MaxBatchMessages is the most messages [Batch.MaxMessages] allows.
const MaxBatchMessages = 1000

// Batch is the optional batch mode: several messages in one POST.
type Batch struct {
	// MaxMessages is the most messages in one request; 0 or 1 (the
	// default) sends every message in a request of its own.
	MaxMessages int `yaml:"max_messages"`
	// Linger is the longest a request of fewer than MaxMessages waits for
	// more messages, default [DefaultBatchLinger]. It waits only while
	// another request is in flight or was just answered: otherwise no
	// answer can release more messages, and it is sent at once.
	Linger time.Duration `yaml:"linger"`
}

// CheckFormat refuses batch mode with a format whose messages carry their
// metadata in headers (cloudevents-binary, debezium): a batch has one set
// of headers for all its messages.
func (c *Config) CheckFormat(format relay.Format) error {
	if c.Batch.MaxMessages > 1 && (format == relay.FormatCloudEventsBinary || format == relay.FormatDebezium) {
		return fmt.Errorf("sink.webhook.batch.max_messages is %d, and envelope.format %s carries each message's metadata in headers, which one request of several messages cannot; use envelope.format envelope or cloudevents, or set sink.webhook.batch.max_messages to 1", c.Batch.MaxMessages, format)
	}
	return nil
}
