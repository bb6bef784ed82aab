package verify

import (
	"context"
	"errors"
	"fmt"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATS reads the message_id header of the messages of a JetStream stream
// stored at or after since, up to the stream's last message when Read
// started, through an ordered consumer: ephemeral, it acknowledges nothing
// and leaves the stream and its consumers as they were.
type NATS struct {
	URL             string
	CredentialsFile string
	Stream          string
}

var _ Reader = NATS{}

// Read implements Reader; it ignores destinations and reads the stream.
func (n NATS) Read(ctx context.Context, since time.Time, _ []string, fn func(id string) error) error {
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

// Close implements Reader.
func (NATS) Close() error { return nil }
