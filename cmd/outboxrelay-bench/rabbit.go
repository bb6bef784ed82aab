package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	rabbitExchange = "outbox"
	// rabbitConfirms is how many unconfirmed messages the bare publisher
	// keeps outstanding, the sink's default MaxInFlight.
	rabbitConfirms = 1000
)

// rabbit is the RabbitMQ side: the exchange the relay publishes to and one
// durable queue bound to it with "#" that every run fills and then purges.
// Each administrative step uses a connection of its own: one kept open
// across minutes of benchmark would have to survive heartbeats on a
// saturated machine.
type rabbit struct {
	url   string
	queue string
	pid   int // the local RabbitMQ server (beam.smp), 0 if not found
}

func dialRabbit(url string) (*amqp.Connection, error) {
	return amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
}

// admin runs fn on a fresh channel.
func (r *rabbit) admin(fn func(ch *amqp.Channel) error) error {
	conn, err := dialRabbit(r.url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return fn(ch)
}

// openRabbit declares the exchange and the benchmark's queue. It fails when
// the broker is unreachable; the caller then skips the RabbitMQ rows.
func openRabbit(url, queue string) (*rabbit, error) {
	r := &rabbit{url: url, queue: queue, pid: findProcess("beam.smp", "rabbit")}
	err := r.admin(func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(rabbitExchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", rabbitExchange, err)
		}
		// The queue is bound to "#" and so collects everything published
		// to the exchange: should this process die without deleting it,
		// RabbitMQ deletes it after ten minutes without use.
		args := amqp.Table{"x-expires": int32(10 * 60 * 1000)}
		if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
			return fmt.Errorf("declare queue %s: %w", queue, err)
		}
		if err := ch.QueueBind(queue, "#", rabbitExchange, false, nil); err != nil {
			return fmt.Errorf("bind queue %s: %w", queue, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return r, r.purge()
}

// serverCPU returns the CPU time the local RabbitMQ server has used.
func (r *rabbit) serverCPU() time.Duration {
	if r.pid == 0 {
		return 0
	}
	s := readProc(r.pid)
	if !s.ok { // restarted: look again
		r.pid = findProcess("beam.smp", "rabbit")
		s = readProc(r.pid)
	}
	return s.cpu
}

// waitUp waits up to d for the broker to accept connections again and
// reports whether it does.
func (r *rabbit) waitUp(ctx context.Context, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if err := r.admin(func(*amqp.Channel) error { return nil }); err == nil {
			return true
		}
		time.Sleep(time.Second)
	}
	return false
}

func (r *rabbit) close() {
	_ = r.admin(func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(r.queue, false, false, false)
		return err
	})
}

// settle waits until the queue holds at least want messages (RabbitMQ
// counts a confirmed message at once, but gives it a moment) and returns
// the count and the size of one message body.
func (r *rabbit) settle(ctx context.Context, want int) (count, bodySize int, err error) {
	err = r.admin(func(ch *amqp.Channel) error {
		deadline := time.Now().Add(10 * time.Second)
		for {
			q, err := ch.QueueDeclarePassive(r.queue, true, false, false, false, nil)
			if err != nil {
				return err
			}
			count = q.Messages
			if count >= want || time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if count == 0 {
			return nil
		}
		d, ok, err := ch.Get(r.queue, false)
		if err != nil {
			return err
		}
		if ok {
			bodySize = len(d.Body)
			return d.Nack(false, true)
		}
		return nil
	})
	return count, bodySize, err
}

// queueDepth keeps a channel open to poll the queue's message count.
type queueDepth struct {
	conn  *amqp.Connection
	ch    *amqp.Channel
	queue string
}

func (r *rabbit) depth() (*queueDepth, error) {
	conn, err := dialRabbit(r.url)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &queueDepth{conn: conn, ch: ch, queue: r.queue}, nil
}

func (q *queueDepth) count(context.Context) (int64, error) {
	st, err := q.ch.QueueDeclarePassive(q.queue, true, false, false, false, nil)
	return int64(st.Messages), err
}

func (q *queueDepth) close() { q.conn.Close() }

func (r *rabbit) purge() error {
	return r.admin(func(ch *amqp.Channel) error {
		_, err := ch.QueuePurge(r.queue, false)
		return err
	})
}

// fixedBody returns next for bareAMQP: bodySize bytes of letters, the same
// for every message.
func fixedBody(bodySize int) func() ([]byte, error) {
	body := make([]byte, bodySize)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	return func() ([]byte, error) { return body, nil }
}

// bareAMQP publishes n persistent messages with the properties the sink
// sets (sinks/rabbitmq prepare), keeping rabbitConfirms publishes
// unconfirmed: the ceiling of one amqp091 channel into this queue. next
// returns each body, on the publishing goroutine; the body may be reused
// once the publish returns.
func bareAMQP(ctx context.Context, url string, n int, next func() ([]byte, error)) error {
	conn, err := dialRabbit(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 2*rabbitConfirms))
	slots := make(chan struct{}, rabbitConfirms)
	acked := make(chan error, 1)
	go func() {
		for i := range n {
			select {
			case c, ok := <-confirms:
				if !ok {
					acked <- fmt.Errorf("channel closed after %d confirms", i)
					return
				}
				if !c.Ack {
					acked <- fmt.Errorf("broker nacked delivery %d", c.DeliveryTag)
					return
				}
			case <-ctx.Done():
				acked <- ctx.Err()
				return
			}
			<-slots
		}
		acked <- nil
	}()
	now := time.Now().UTC().Truncate(time.Second)
	for i := range n {
		select {
		case slots <- struct{}{}:
		case err := <-acked:
			if err == nil {
				err = errors.New("confirmations ended early")
			}
			return err
		}
		body, err := next()
		if err != nil {
			return err
		}
		id := strconv.Itoa(i)
		pub := amqp.Publishing{
			Headers: amqp.Table{
				"traceparent":    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
				"aggregate_id":   "order-" + strconv.Itoa(i%1000),
				"aggregate_type": "order",
			},
			ContentType: "application/json", DeliveryMode: amqp.Persistent,
			MessageId: "bench-" + id, Type: "order.created", AppId: "outboxrelay",
			Timestamp: now, Body: body,
		}
		if err := ch.PublishWithContext(ctx, rabbitExchange, "order.order%2Ecreated", true, false, pub); err != nil {
			return err
		}
	}
	return <-acked
}

// walInserts returns next for bareAMQP in the bare pipeline: it receives
// from conn's replication stream until the next pgoutput Insert, answering
// keepalives with the position received so far, and returns the Insert's
// bytes copied into a body of bodySize bytes (cut or padded): about the
// work of a relay that neither decodes the row nor builds an envelope.
func walInserts(ctx context.Context, conn *pgconn.PgConn, bodySize int) func() ([]byte, error) {
	body := make([]byte, bodySize)
	var pos pglogrepl.LSN
	return func() ([]byte, error) {
		for {
			msg, err := conn.ReceiveMessage(context.Background())
			if err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				return nil, fmt.Errorf("receive: %w", err)
			}
			xld, ka, err := replicationMessage(msg)
			switch {
			case err != nil:
				return nil, err
			case xld != nil:
				pos = max(pos, xld.WALStart)
				if len(xld.WALData) > 0 && xld.WALData[0] == 'I' {
					clear(body[copy(body, xld.WALData):])
					return body, nil
				}
			case ka != nil && ka.ReplyRequested:
				err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
					WALWritePosition: pos, WALFlushPosition: pos, WALApplyPosition: pos, ClientTime: time.Now(),
				})
				if err != nil {
					return nil, fmt.Errorf("send status: %w", err)
				}
			}
		}
	}
}

// runBarePipeline drains slot's rows bareLoop's way and publishes each
// insert with bareAMQP, on one goroutine as the relay's stream does: the
// reference that reads the WAL too, so that it shares the machine with a
// walsender as the relay does.
func runBarePipeline(ctx context.Context, env *benchEnv, rb *rabbit, db, slot string, end pglogrepl.LSN, rows, bodySize int) (measurement, error) {
	if err := rb.purge(); err != nil {
		return measurement{}, err
	}
	defer rb.purge() // the next run purges first too
	watch, err := watchSlot(ctx, env.pg.URL(db), slot, end)
	if err != nil {
		return measurement{}, err
	}
	cfg, err := replicationConfig(env.pg.URL(db))
	if err != nil {
		watch.close()
		return measurement{}, err
	}
	busy0, cpu0, b0 := machineBusy(), selfCPU(), rb.serverCPU()
	m := measurement{launched: time.Now(), inProcess: true, Note: fmt.Sprintf("%d B bodies, the size of the relay's envelopes", bodySize)}
	err = func() error {
		conn, err := pgconn.ConnectConfig(ctx, cfg)
		if err != nil {
			return fmt.Errorf("connect for replication: %w", err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: pluginArgs(env.publication)}); err != nil {
			return fmt.Errorf("start replication: %w", err)
		}
		stop := context.AfterFunc(ctx, func() { _ = conn.Conn().Close() })
		defer stop()
		return bareAMQP(ctx, rb.url, rows, walInserts(ctx, conn, bodySize))
	}()
	m.done, m.consumerCPU, m.machineBusy, m.brokerCPU = time.Now(), selfCPU()-cpu0, machineBusy()-busy0, rb.serverCPU()-b0
	ws, started := watch.close()
	m.walsenderCPU, m.streamed = ws.cpu, started
	if err != nil {
		return m, err
	}
	n, _, err := rb.settle(ctx, rows)
	m.Delivered = int64(n)
	return m, err
}
