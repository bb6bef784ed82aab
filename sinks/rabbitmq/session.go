package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// session is one connection with its confirm-mode channel. The sink
// replaces it whenever either closes.
type session struct {
	conn *amqp.Connection
	ch   *amqp.Channel

	// Notification channels, read only by the goroutine of Run. amqp091
	// abandons a notification that blocks for 5s, so confirms and returns
	// are buffered for every message that can be in flight.
	confirms   chan amqp.Confirmation
	returns    chan amqp.Return
	blocks     chan amqp.Blocking
	chClosed   chan *amqp.Error
	connClosed chan *amqp.Error

	// Guarded by Sink.mu.
	inflight map[uint64]*pending // by delivery tag
	dead     bool                // no new publishes
	blocked  bool                // connection.blocked is in effect

	acked bool // a confirmation arrived: the broker works, reset the backoff
}

// dial connects, declares or checks the exchange and opens a confirm-mode
// channel. Cancelling ctx aborts it, also during the handshakes.
func (s *Sink) dial(ctx context.Context) (*session, error) {
	var (
		mu      sync.Mutex
		netConn net.Conn
	)
	abort := func() {
		mu.Lock()
		defer mu.Unlock()
		if netConn != nil {
			_ = netConn.SetDeadline(time.Unix(1, 0))
		}
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("outboxrelay")
	cfg := amqp.Config{
		Properties: props,
		Locale:     "en_US",
		SASL:       s.cfg.SASL,
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: s.cfg.DialTimeout}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Bounds the TLS and AMQP handshakes; amqp091 clears it after.
			if err := c.SetDeadline(time.Now().Add(s.cfg.DialTimeout)); err != nil {
				c.Close()
				return nil, err
			}
			mu.Lock()
			netConn = c
			mu.Unlock()
			return newBatchConn(c), nil
		},
	}
	if s.cfg.TLS != nil {
		cfg.TLSClientConfig = s.cfg.TLS.Clone()
	}
	// Channel open, exchange declare and confirm.select cannot be cancelled
	// either: a past deadline on the socket ends them all.
	stop := context.AfterFunc(ctx, abort)

	sess, err := s.open(cfg)
	if !stop() {
		if sess != nil {
			_ = sess.conn.Close()
		}
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, fmt.Errorf("connect to rabbitmq at %s: %w", redact.URL(s.cfg.URL), redact.Error(err, s.cfg.URL))
	}
	return sess, nil
}

func (s *Sink) open(cfg amqp.Config) (*session, error) {
	conn, err := amqp.DialConfig(s.cfg.URL, cfg)
	if err != nil {
		return nil, err
	}
	ch, err := s.channel(conn)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	n := s.cfg.MaxInFlight
	sess := &session{
		conn:     conn,
		ch:       ch,
		inflight: make(map[uint64]*pending, n),
	}
	// Registered before confirm.select and before any publish.
	sess.confirms = ch.NotifyPublish(make(chan amqp.Confirmation, 2*n))
	sess.returns = ch.NotifyReturn(make(chan amqp.Return, n))
	sess.chClosed = ch.NotifyClose(make(chan *amqp.Error, 1))
	sess.connClosed = conn.NotifyClose(make(chan *amqp.Error, 1))
	sess.blocks = conn.NotifyBlocked(make(chan amqp.Blocking, 16))
	if err := ch.Confirm(false); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	return sess, nil
}

// channel opens the channel and declares the exchange, or checks that it
// exists when the sink does not declare it.
func (s *Sink) channel(conn *amqp.Connection) (*amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	ex := s.cfg.Exchange
	if s.cfg.Declare {
		if err := ch.ExchangeDeclare(ex, s.cfg.ExchangeType, *s.cfg.Durable, false, false, false, nil); err != nil {
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
				return nil, fmt.Errorf("exchange %q exists with other settings than type %s durable %t; change sink.rabbitmq.exchange_type/durable to match or delete the exchange: %w", ex, s.cfg.ExchangeType, *s.cfg.Durable, err)
			}
			return nil, fmt.Errorf("declare exchange %q: %w", ex, err)
		}
		return ch, nil
	}
	if err := ch.ExchangeDeclarePassive(ex, s.cfg.ExchangeType, *s.cfg.Durable, false, false, false, nil); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return nil, fmt.Errorf("exchange %q does not exist; create it or set sink.rabbitmq.declare: true", ex)
		}
		return nil, fmt.Errorf("check exchange %q: %w", ex, err)
	}
	return ch, nil
}
