package rabbitmq

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/relay"
)

// A scripted broker: it speaks just enough AMQP 0-9-1 over TCP to open a
// connection and a confirm-mode channel, takes publishes and answers them
// with the confirmations a test chooses, in the order it chooses. RabbitMQ
// sends such sequences under load, but not on demand; this makes one
// sequence certain. It proves how confirmations are read, never delivery.

// AMQP frame types and the methods the scripted broker handles, as
// class<<16 | method.
const (
	frameMethod    = 1
	frameHeader    = 2
	frameBody      = 3
	frameHeartbeat = 8
	frameEnd       = 0xCE

	connectionStart   = 10<<16 | 10
	connectionStartOk = 10<<16 | 11
	connectionTune    = 10<<16 | 30
	connectionTuneOk  = 10<<16 | 31
	connectionOpen    = 10<<16 | 40
	connectionOpenOk  = 10<<16 | 41
	connectionClose   = 10<<16 | 50
	connectionCloseOk = 10<<16 | 51
	channelOpen       = 20<<16 | 10
	channelOpenOk     = 20<<16 | 11
	channelClose      = 20<<16 | 40
	channelCloseOk    = 20<<16 | 41
	exchangeDeclare   = 40<<16 | 10
	exchangeDeclareOk = 40<<16 | 11
	basicPublish      = 60<<16 | 40
	basicAck          = 60<<16 | 80
	basicNack         = 60<<16 | 120
	confirmSelect     = 85<<16 | 10
	confirmSelectOk   = 85<<16 | 11
)

// confirmFrame is one basic.ack or basic.nack the scripted broker sends.
type confirmFrame struct {
	ack      bool
	tag      uint64
	multiple bool
}

// scriptedBroker answers one connection; once it received publishes
// messages (method, header and body), it sends script.
type scriptedBroker struct {
	ln        net.Listener
	publishes int
	script    []confirmFrame
	done      chan error
}

// startScriptedBroker starts a scriptedBroker on loopback and returns its
// URL. The test fails if the broker saw a frame it does not handle.
func startScriptedBroker(tb testing.TB, publishes int, script []confirmFrame) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	b := &scriptedBroker{ln: ln, publishes: publishes, script: script, done: make(chan error, 1)}
	go func() { b.done <- b.serve() }()
	tb.Cleanup(func() {
		ln.Close()
		if err := <-b.done; err != nil {
			tb.Errorf("scripted broker: %v", err)
		}
	})
	return "amqp://guest:guest@" + ln.Addr().String() + "/"
}

func (b *scriptedBroker) serve() error {
	c, err := b.ln.Accept()
	if err != nil {
		return err
	}
	b.ln.Close() // one connection only
	defer c.Close()
	r := bufio.NewReader(c)
	proto := make([]byte, 8)
	if _, err := io.ReadFull(r, proto); err != nil {
		return err
	}
	if string(proto) != "AMQP\x00\x00\x09\x01" {
		return errors.New("not an AMQP 0-9-1 client")
	}
	w := bufio.NewWriter(c)
	send := func(typ byte, ch uint16, payload []byte) error {
		var h [7]byte
		h[0] = typ
		binary.BigEndian.PutUint16(h[1:], ch)
		binary.BigEndian.PutUint32(h[3:], uint32(len(payload)))
		w.Write(h[:])
		w.Write(payload)
		w.WriteByte(frameEnd)
		return w.Flush()
	}
	method := func(ch uint16, id uint32, args ...byte) error {
		p := binary.BigEndian.AppendUint32(nil, id)
		return send(frameMethod, ch, append(p, args...))
	}

	// connection.start: version 0-9, no server properties, PLAIN, en_US.
	start := []byte{0, 9, 0, 0, 0, 0}
	start = append(binary.BigEndian.AppendUint32(start, 5), "PLAIN"...)
	start = append(binary.BigEndian.AppendUint32(start, 5), "en_US"...)
	if err := method(0, connectionStart, start...); err != nil {
		return err
	}
	published := 0
	var bodyLeft uint64
	for {
		typ, ch, payload, err := readFrame(r)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		switch typ {
		case frameHeartbeat:
			continue
		case frameHeader:
			if len(payload) < 12 {
				return errors.New("short content header")
			}
			bodyLeft = binary.BigEndian.Uint64(payload[4:12])
		case frameBody:
			bodyLeft -= uint64(len(payload))
		case frameMethod:
			if len(payload) < 4 {
				return errors.New("short method frame")
			}
			var reply []byte
			answer := true
			var replyID uint32
			switch id := binary.BigEndian.Uint32(payload); id {
			case connectionStartOk:
				// channel-max 0, frame-max 128 KiB, no heartbeat.
				replyID, reply = connectionTune, []byte{0, 0, 0, 2, 0, 0, 0, 0}
			case connectionTuneOk:
				answer = false
			case connectionOpen:
				replyID, reply = connectionOpenOk, []byte{0}
			case channelOpen:
				replyID, reply = channelOpenOk, []byte{0, 0, 0, 0}
			case exchangeDeclare:
				replyID = exchangeDeclareOk
			case confirmSelect:
				replyID = confirmSelectOk
			case basicPublish:
				published++
				answer = false
			case channelClose:
				replyID = channelCloseOk
			case connectionClose:
				if err := method(0, connectionCloseOk); err != nil {
					return err
				}
				return nil
			default:
				return errors.New("unexpected method from the client")
			}
			if answer {
				if err := method(ch, replyID, reply...); err != nil {
					return err
				}
			}
		}
		if typ != frameMethod && bodyLeft == 0 && published == b.publishes {
			for _, f := range b.script {
				id, flags := uint32(basicNack), byte(0)
				if f.ack {
					id = basicAck
				}
				if f.multiple {
					flags = 1
				}
				if err := method(1, id, append(binary.BigEndian.AppendUint64(nil, f.tag), flags)...); err != nil {
					return err
				}
			}
			published = -1 // script sent
		}
	}
}

func readFrame(r *bufio.Reader) (typ byte, ch uint16, payload []byte, err error) {
	var h [7]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, 0, nil, err
	}
	payload = make([]byte, binary.BigEndian.Uint32(h[3:]))
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, 0, nil, err
	}
	end, err := r.ReadByte()
	if err != nil {
		return 0, 0, nil, err
	}
	if end != frameEnd {
		return 0, 0, nil, errors.New("frame without frame-end")
	}
	return h[0], binary.BigEndian.Uint16(h[1:]), payload, nil
}

// nackThenMultipleAck is the sequence RabbitMQ sends when a reject-publish
// queue refuses publish 2 while publishes 1 and 3, which it took, wait for
// their disk write: a single nack of 2 at once, then one multiple ack up
// to 3, which covers 1 and 3 only (2 is already confirmed).
var nackThenMultipleAck = []confirmFrame{{ack: false, tag: 2}, {ack: true, tag: 3, multiple: true}}

// TestAmqp091MultipleAckAfterOutOfOrderNack shows what amqp091 makes of
// that sequence: the deferred confirmation of publish 2 reports the nack,
// which the sink relies on. It logs what NotifyPublish reports; in
// amqp091-go v1.16.0 that is an ack for all three (confirms.Multiple walks
// every tag up to 3 and reports each with the ack flag of the frame).
func TestAmqp091MultipleAckAfterOutOfOrderNack(t *testing.T) {
	verifyNoLeaks(t)
	url := startScriptedBroker(t, 3, nackThenMultipleAck)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 3))
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	var dcs []*amqp.DeferredConfirmation
	for range 3 {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "x", "k", false, false, amqp.Publishing{Body: []byte("m")})
		if err != nil {
			t.Fatal(err)
		}
		dcs = append(dcs, dc)
	}
	notified := map[uint64]bool{}
	for range 3 {
		select {
		case c := <-confirms:
			notified[c.DeliveryTag] = c.Ack
		case <-time.After(5 * time.Second):
			t.Fatalf("NotifyPublish delivered %d of 3 confirmations", len(notified))
		}
	}
	for i, dc := range dcs {
		tag := uint64(i + 1)
		ack, err := dc.WaitContext(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if want := tag != 2; ack != want {
			t.Errorf("deferred confirmation of tag %d: ack %t, want %t", tag, ack, want)
		}
	}
	t.Logf("NotifyPublish: tag 1 ack=%t, tag 2 ack=%t, tag 3 ack=%t (broker sent nack 2, ack 3 multiple)", notified[1], notified[2], notified[3])
	if notified[2] {
		t.Logf("amqp091 reports the nacked tag 2 as acked on NotifyPublish: its ack flag cannot be trusted")
	}
}

// TestSinkReportsNackOvertakenByMultipleAck sends the sink the same
// sequence: publish 2 must be reported nacked (retried by the relay), not
// delivered.
func TestSinkReportsNackOvertakenByMultipleAck(t *testing.T) {
	verifyNoLeaks(t)
	url := startScriptedBroker(t, 3, nackThenMultipleAck)
	s := startSink(t, Config{URL: url, Exchange: "scripted"})
	run := uniqueName(t)
	l := newLedger(3)
	for i := range 3 {
		s.Publish(context.Background(), testMessage(run, i, 0, "order"), l.done(i))
	}
	l.wait(t, 10*time.Second)
	for i, err := range l.errs {
		if i == 1 {
			if !errors.Is(err, ErrNacked) || !relay.Retryable(err) {
				t.Errorf("publish 2 (nacked): done(%v), want a retryable ErrNacked", err)
			}
			continue
		}
		if err != nil {
			t.Errorf("publish %d (acked): done(%v), want nil", i+1, err)
		}
	}
}
