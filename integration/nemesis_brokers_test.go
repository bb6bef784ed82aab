package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

// arrival is one message as the consumer received it, in arrival order.
type arrival struct {
	id  string // message_id
	key string // aggregate_id as the broker carries it
}

// nemesisTarget is the broker side of a nemesis run: how the relay reaches
// it, what the consumer received, and the faults only this broker has.
type nemesisTarget struct {
	name       string
	env        []string // for the relay
	poisonType string   // an aggregate_type the broker never takes: its rows must be dead-lettered
	faults     []nemesisFault
	arrivals   func() []arrival
	// heal ends every broker fault still active and returns once the broker
	// takes messages again.
	heal func()
	// figures are broker-specific counts for the report (fault hits).
	figures func() string
}

// nemesisFault is one kind of fault. inject returns once the fault is
// injected; a fault that lasts (a window of errors) ends by itself when its
// time is up or ctx is done, in a goroutine that wg tracks. Each injection
// calls hit once, when it knows, with how many times it took effect
// (requests failed, connections cut, processes stopped): 0 is a miss.
type nemesisFault struct {
	kind   string
	inject func(ctx context.Context, r *rand.Rand, wg *sync.WaitGroup, hit func(n int64)) error
}

// kafkaNemesis is a kfake cluster that can be stopped and started again on
// the same port with the same data directory, so the relay and the consumer
// find it where they left it.
type kafkaNemesis struct {
	t    *testing.T
	port int
	dir  string

	mu      sync.Mutex
	cluster *kfake.Cluster

	produceFaults  atomic.Int64 // produce requests answered with an injected error code
	metadataFaults atomic.Int64 // metadata requests answered with an injected error code
	cuts           atomic.Int64 // produce requests whose connection was cut
}

const nemesisTopic = "outbox.nemesis"

func newKafkaNemesis(t *testing.T, e *env) *nemesisTarget {
	e.kafka.Close()
	k := &kafkaNemesis{t: t, port: freePort(t), dir: t.TempDir()}
	if err := k.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		k.cluster.Close()
	})
	e.brokers = k.cluster.ListenAddrs()[0]
	c := e.consume(nemesisTopic)
	return &nemesisTarget{
		name:       "kafka",
		poisonType: "no good", // outbox.no good is not a legal topic name
		arrivals: func() []arrival {
			recs := c.records()
			out := make([]arrival, len(recs))
			for i, r := range recs {
				out[i] = arrival{id: r.Headers["message_id"], key: r.Key}
			}
			return out
		},
		faults: []nemesisFault{
			{"kafka_restart", k.restart},
			{"kafka_produce_cut", k.produceCut},
			{"kafka_produce_error", k.produceError},
			{"kafka_metadata_error", k.metadataError},
		},
		heal: func() {}, // every window ends by itself; a restart is synchronous
		figures: func() string {
			return fmt.Sprintf("produce requests failed %d, metadata requests failed %d, produce connections cut %d",
				k.produceFaults.Load(), k.metadataFaults.Load(), k.cuts.Load())
		},
	}
}

func (k *kafkaNemesis) start() error {
	cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(k.port), kfake.DataDir(k.dir), kfake.SyncWrites(),
		kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
	if err != nil {
		return fmt.Errorf("start kfake on port %d: %w", k.port, err)
	}
	k.cluster = cl
	return nil
}

func (k *kafkaNemesis) current() *kfake.Cluster {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cluster
}

// restart stops the broker, every connection with it, and starts it again
// after up to 2.5 s. The faults installed on the old cluster die with it.
func (k *kafkaNemesis) restart(ctx context.Context, r *rand.Rand, _ *sync.WaitGroup, hit func(int64)) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cluster.Close()
	sleepCtx(ctx, time.Duration(200+r.IntN(2300))*time.Millisecond)
	// The port was ours a moment ago; give the kernel a few tries to free it.
	var err error
	for range 50 {
		if err = k.start(); err == nil {
			hit(1)
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// produceCut closes the connection of every produce request for up to 2 s.
func (k *kafkaNemesis) produceCut(ctx context.Context, r *rand.Rand, wg *sync.WaitGroup, hit func(int64)) error {
	cl := k.current()
	var over atomic.Bool
	var cuts atomic.Int64
	cl.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		if over.Load() {
			cl.DropControl()
			return nil, nil, false
		}
		cl.KeepControl()
		cuts.Add(1)
		return nil, errors.New("nemesis: connection cut"), true
	})
	window(ctx, wg, time.Duration(300+r.IntN(1700))*time.Millisecond, func() {
		over.Store(true)
		k.cuts.Add(cuts.Load())
		hit(cuts.Load())
	})
	return nil
}

// retriableProduceErrors are the answers of a broker in a rolling restart,
// a partition move or a slow ISR: a client must retry every one of them.
// NOT_ENOUGH_REPLICAS_AFTER_APPEND and REQUEST_TIMED_OUT are answered after
// the records were stored, so the retry is a duplicate the idempotent
// producer has to recognise.
var retriableProduceErrors = []*kerr.Error{
	kerr.NotLeaderForPartition, kerr.UnknownTopicOrPartition, kerr.LeaderNotAvailable,
	kerr.RequestTimedOut, kerr.NotEnoughReplicas, kerr.NotEnoughReplicasAfterAppend,
}

// produceError answers produce requests for some partitions with a retriable
// error for up to 8 s: longer than franz-go's own retries of an unknown topic.
func (k *kafkaNemesis) produceError(ctx context.Context, r *rand.Rand, wg *sync.WaitGroup, hit func(int64)) error {
	code := retriableProduceErrors[r.IntN(len(retriableProduceErrors))]
	h := k.current().Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: nemesisTopic, Partitions: somePartitions(r),
		Err: code, Count: -1})
	window(ctx, wg, time.Duration(500+r.IntN(7500))*time.Millisecond, func() {
		h.Remove()
		k.produceFaults.Add(int64(h.Hits()))
		hit(int64(h.Hits()))
	})
	return nil
}

// metadataError answers metadata requests for the topic's partitions with a
// retriable error for 5.5 to 8 s, as a cluster electing leaders does. One
// produce request answered NOT_LEADER_FOR_PARTITION first makes the
// producer ask for metadata within the window: franz-go asks at most every
// 5 s (kgo.MetadataMinAge), so a shorter window often saw no request.
func (k *kafkaNemesis) metadataError(ctx context.Context, r *rand.Rand, wg *sync.WaitGroup, hit func(int64)) error {
	codes := []*kerr.Error{kerr.LeaderNotAvailable, kerr.UnknownTopicOrPartition, kerr.NotLeaderForPartition}
	cl := k.current()
	h := cl.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Metadata}, Topic: nemesisTopic,
		Err: codes[r.IntN(len(codes))], Count: -1})
	trigger := cl.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: nemesisTopic, Err: kerr.NotLeaderForPartition})
	window(ctx, wg, time.Duration(5500+r.IntN(2500))*time.Millisecond, func() {
		h.Remove()
		trigger.Remove()
		k.metadataFaults.Add(int64(h.Hits()))
		k.produceFaults.Add(int64(trigger.Hits()))
		hit(int64(h.Hits()))
	})
	return nil
}

// somePartitions is a random non-empty subset of the topic's 4 partitions.
func somePartitions(r *rand.Rand) []int32 {
	var ps []int32
	for len(ps) == 0 {
		for p := range int32(4) {
			if r.IntN(2) == 0 {
				ps = append(ps, p)
			}
		}
	}
	return ps
}

// window runs end after d, or as soon as ctx is done, in a goroutine wg tracks.
func window(ctx context.Context, wg *sync.WaitGroup, d time.Duration, end func()) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		sleepCtx(ctx, d)
		end()
	}()
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// rabbitNemesis puts a TCP proxy between the relay and RabbitMQ, so that the
// test can cut the relay's connections, and have the broker close them,
// without touching any other client of the shared broker. The consumer
// reads a durable queue with x-max-length and x-overflow=reject-publish
// directly; when it slows down the queue fills and the broker nacks.
type rabbitNemesis struct {
	t        *testing.T
	exchange string
	queue    string
	proxy    *tcpProxy

	slow  atomic.Bool
	mu    sync.Mutex
	got   []arrival
	cuts  atomic.Int64 // connections cut by the proxy
	kicks atomic.Int64 // connections the broker closed
	slows atomic.Int64 // slow-consumer windows
	fulls atomic.Int64 // samples that found the queue full during them
}

// nemesisQueueLength is the queue's x-max-length: small, so that a slow
// consumer makes the broker reject publishes within a second.
const nemesisQueueLength = 20

func newRabbitNemesis(t *testing.T) *nemesisTarget {
	pgservertest.RequireTCP(t, "127.0.0.1:5672", "RabbitMQ")
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Fatalf("rabbitmqctl not found: %v", err)
	}
	name := fmt.Sprintf("nemesis-%d", time.Now().UnixNano())
	q := &rabbitNemesis{t: t, exchange: name, queue: name}
	conn, err := amqp.Dial(rabbitURL)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(name, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// Durable, so that persistent messages are confirmed late, in batches,
	// while rejected ones are nacked at once: confirms arrive out of order.
	args := amqp.Table{"x-max-length": nemesisQueueLength, "x-overflow": "reject-publish"}
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(name, "nemesis.#", name, false, nil); err != nil {
		t.Fatal(err)
	}
	conn.Close()

	q.proxy, err = startTCPProxy("127.0.0.1:5672")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		q.consume(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		q.proxy.close()
		if c, err := amqp.Dial(rabbitURL); err == nil {
			if ch, err := c.Channel(); err == nil {
				ch.QueueDelete(name, false, false, false)
				ch.ExchangeDelete(name, false, false)
			}
			c.Close()
		}
	})
	return &nemesisTarget{
		name: "rabbitmq",
		env: []string{
			"OUTBOXRELAY_SINK_TYPE=rabbitmq",
			"OUTBOXRELAY_SINK_RABBITMQ_URL=amqp://guest:guest@" + q.proxy.addr() + "/",
			"OUTBOXRELAY_SINK_RABBITMQ_EXCHANGE=" + name,
		},
		poisonType: "stray", // routing key stray.* has no queue: returned
		arrivals: func() []arrival {
			q.mu.Lock()
			defer q.mu.Unlock()
			return append([]arrival(nil), q.got...)
		},
		faults: []nemesisFault{
			{"rabbitmq_connection_cut", q.cut},
			{"rabbitmq_connection_closed", q.closeByBroker},
			{"rabbitmq_reject_publish", q.slowDown},
		},
		heal: func() { q.slow.Store(false) },
		figures: func() string {
			return fmt.Sprintf("connections cut %d, closed by the broker %d, slow-consumer windows %d (x-max-length %d, seen full in %d samples)",
				q.cuts.Load(), q.kicks.Load(), q.slows.Load(), nemesisQueueLength, q.fulls.Load())
		},
	}
}

// consume reads the queue with manual acks, recording arrivals in order.
// While slow is set it acknowledges one message every 25 ms, so the queue
// fills up to its x-max-length and the broker rejects further publishes.
func (q *rabbitNemesis) consume(ctx context.Context) {
	for ctx.Err() == nil {
		conn, err := amqp.Dial(rabbitURL)
		if err != nil {
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		err = q.consumeOn(ctx, conn)
		conn.Close()
		if err != nil && ctx.Err() == nil {
			q.t.Logf("nemesis consumer: %v; reconnecting", err)
		}
	}
}

func (q *rabbitNemesis) consumeOn(ctx context.Context, conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(nemesisQueueLength, 0, false); err != nil {
		return err
	}
	msgs, err := ch.Consume(q.queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-msgs:
			if !ok {
				return errors.New("deliveries closed")
			}
			key, _ := d.Headers["aggregate_id"].(string)
			q.mu.Lock()
			q.got = append(q.got, arrival{id: d.MessageId, key: key})
			q.mu.Unlock()
			if q.slow.Load() {
				sleepCtx(ctx, 25*time.Millisecond)
			}
			if err := d.Ack(false); err != nil {
				return err
			}
		}
	}
}

// cut closes the relay's TCP connections to the broker without a word.
func (q *rabbitNemesis) cut(_ context.Context, _ *rand.Rand, _ *sync.WaitGroup, hit func(int64)) error {
	n := int64(q.proxy.cut())
	q.cuts.Add(n)
	hit(n)
	return nil
}

// closeByBroker has RabbitMQ close the relay's connections (connection.close
// with CONNECTION_FORCED), found by the proxy's upstream ports so that no
// other client of the shared broker is touched.
func (q *rabbitNemesis) closeByBroker(ctx context.Context, _ *rand.Rand, _ *sync.WaitGroup, hit func(int64)) error {
	ours := map[string]bool{}
	var closed int64
	for _, p := range q.proxy.upstreamPorts() {
		ours[strconv.Itoa(p)] = true
	}
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "list_connections", "-q", "--no-table-headers", "pid", "peer_port").CombinedOutput()
	if err != nil {
		return fmt.Errorf("rabbitmqctl list_connections: %v: %s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || !ours[f[1]] {
			continue
		}
		if out, err := exec.CommandContext(ctx, "rabbitmqctl", "close_connection", f[0], "nemesis").CombinedOutput(); err != nil {
			return fmt.Errorf("rabbitmqctl close_connection: %v: %s", err, out)
		}
		q.kicks.Add(1)
		closed++
	}
	hit(closed)
	return nil
}

// slowDown makes the consumer slow for 1-5 s. It took effect when the queue
// was seen holding x-max-length ready messages, where the broker rejects
// the next publish.
func (q *rabbitNemesis) slowDown(ctx context.Context, r *rand.Rand, wg *sync.WaitGroup, hit func(int64)) error {
	q.slows.Add(1)
	q.slow.Store(true)
	d := time.Duration(1000+r.IntN(4000)) * time.Millisecond
	wg.Add(1)
	go func() {
		defer wg.Done()
		full := q.fullDuring(ctx, d)
		q.slow.Store(false)
		q.fulls.Add(full)
		hit(full)
	}()
	return nil
}

// fullDuring samples the queue's ready messages every 50 ms for d, or until
// ctx is done, and returns how many samples found it full.
func (q *rabbitNemesis) fullDuring(ctx context.Context, d time.Duration) int64 {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	conn, err := amqp.Dial(rabbitURL)
	if err != nil {
		q.t.Logf("nemesis: sample the queue: %v", err)
		sleepCtx(ctx, d)
		return 0
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		q.t.Logf("nemesis: sample the queue: %v", err)
		sleepCtx(ctx, d)
		return 0
	}
	var full int64
	for ctx.Err() == nil {
		qs, err := ch.QueueDeclarePassive(q.queue, true, false, false, false, amqp.Table{"x-max-length": nemesisQueueLength, "x-overflow": "reject-publish"})
		if err != nil {
			q.t.Logf("nemesis: sample the queue: %v", err)
			sleepCtx(ctx, d)
			return full
		}
		if qs.Messages >= nemesisQueueLength {
			full++
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
	return full
}

// tcpProxy forwards every connection it accepts to target, and can cut them,
// or hold what target sends back. Safe for concurrent use.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	pairs map[*proxyPair]struct{}
	wg    sync.WaitGroup
	// hanging holds the connections accepted while the proxy hangs
	// (setHang): open, never forwarded, never answered.
	hanging []net.Conn
	hang    bool
	// held is closed when what target sends may be forwarded again; nil
	// while nothing is held. release closes it (close too).
	held    chan struct{}
	release func()
}

// setHang makes the proxy hang, as a partitioned broker does: it cuts the
// forwarded connections and holds every new one open without an answer.
// setHang(false) closes the held connections and forwards again.
func (p *tcpProxy) setHang(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hang = on
	if on {
		for pair := range p.pairs {
			pair.close()
		}
		return
	}
	for _, c := range p.hanging {
		c.Close()
	}
	p.hanging = nil
}

// hold stops forwarding what target sends (a broker's acknowledgements,
// as when it is too busy to answer) until release is called.
func (p *tcpProxy) hold() (release func()) {
	held := make(chan struct{})
	release = sync.OnceFunc(func() {
		p.mu.Lock()
		p.held = nil
		p.mu.Unlock()
		close(held)
	})
	p.mu.Lock()
	p.held, p.release = held, release
	p.mu.Unlock()
	return release
}

// answer is the writer of what target sends: it waits while it is held.
type answer struct {
	p   *tcpProxy
	dst net.Conn
}

func (a answer) Write(b []byte) (int, error) {
	a.p.mu.Lock()
	held := a.p.held
	a.p.mu.Unlock()
	if held != nil {
		<-held
	}
	return a.dst.Write(b)
}

type proxyPair struct{ client, server net.Conn }

func (p *proxyPair) close() {
	p.client.Close()
	p.server.Close()
}

func startTCPProxy(target string) (*tcpProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &tcpProxy{ln: ln, target: target, pairs: map[*proxyPair]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *tcpProxy) addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) serve() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.hang {
			p.hanging = append(p.hanging, client)
			p.mu.Unlock()
			continue
		}
		p.mu.Unlock()
		server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			client.Close()
			continue
		}
		pair := &proxyPair{client: client, server: server}
		p.mu.Lock()
		p.pairs[pair] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		pipe := func(dst io.Writer, src net.Conn) {
			defer p.wg.Done()
			_, _ = io.Copy(dst, src)
			pair.close()
			p.mu.Lock()
			delete(p.pairs, pair)
			p.mu.Unlock()
		}
		go pipe(server, client)
		go pipe(answer{p: p, dst: client}, server)
	}
}

// cut closes every forwarded connection and returns how many there were.
func (p *tcpProxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pair := range p.pairs {
		pair.close()
	}
	return len(p.pairs)
}

// upstreamPorts are the local ports of the connections to target: the
// peer ports the broker sees.
func (p *tcpProxy) upstreamPorts() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ports []int
	for pair := range p.pairs {
		ports = append(ports, pair.server.LocalAddr().(*net.TCPAddr).Port)
	}
	return ports
}

func (p *tcpProxy) close() {
	p.mu.Lock()
	release := p.release
	p.mu.Unlock()
	if release != nil {
		release()
	}
	p.ln.Close()
	p.setHang(false)
	p.cut()
	p.wg.Wait()
}
