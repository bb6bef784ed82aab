package nats

import (
	"context"
	"errors"
	"fmt"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/verify"
	"time"
)

var _ sinks.Verifiable = (*Config)(nil)

// VerifyReader reads the sink's JetStream stream.
func (c *Config) VerifyReader(sinks.VerifyOptions) (verify.Reader, func(*relay.Message) (string, error), error) {
	return verifyReader{URL: c.URL, CredentialsFile: c.CredentialsFile, Stream: c.Stream}, nil, nil
}

// verifyReader reads the message_id header of the messages of a JetStream stream
// stored at or after since, up to the stream's last message when Read
// started, through an ordered consumer: ephemeral, it acknowledges nothing
// and leaves the stream and its consumers as they were.
type verifyReader struct {
	URL             string
	CredentialsFile string
	Stream          string
}

var _ verify.Reader = verifyReader{}

// Read implements verify.Reader; it ignores destinations and reads the stream.
func (n verifyReader) Read(ctx context.Context, since time.Time, _ []string, fn func(id string) error) error {
	opts := []natsgo.Option{natsgo.Name("outboxrelay verify")}
	if n.CredentialsFile != "" {
		opts = append(opts, natsgo.UserCredentials(n.CredentialsFile))
	}
	nc, err := natsgo.Connect(n.URL, opts...)
	if err != nil {
		return fmt.Errorf("connect to nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream, err := js.Stream(ctx, n.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil // nothing was published to it
	}
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", n.Stream, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream %s: %w", n.Stream, err)
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 || info.State.LastTime.Before(since) {
		return nil
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since,
	})
	if err != nil {
		return fmt.Errorf("read stream %s: %w", n.Stream, err)
	}
	for {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return fmt.Errorf("read stream %s: %w", n.Stream, err)
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			md, err := msg.Metadata()
			if err != nil {
				return err
			}
			if md.Sequence.Stream > last {
				return nil
			}
			id := msg.Headers().Get("message_id")
			if id == "" {
				id = msg.Headers().Get(natsgo.MsgIdHdr)
			}
			if id != "" {
				if err := fn(id); err != nil {
					return err
				}
			}
			if md.Sequence.Stream >= last || md.NumPending == 0 {
				return nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, natsgo.ErrTimeout) {
			return fmt.Errorf("read stream %s: %w", n.Stream, err)
		}
		if got == 0 {
			// The messages up to last were deleted or expired meanwhile.
			if err := ctx.Err(); err != nil {
				return err
			}
			return nil
		}
	}
}

// Close implements verify.Reader.
func (verifyReader) Close() error { return nil }
