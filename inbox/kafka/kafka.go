// Package kafka runs an inbox over a Kafka consumer group (franz-go).
//
// The Runner takes records from the group's partitions and processes each
// through inbox.Inbox.Receive: one record of an aggregate (record key,
// within its partition) at a time and in offset order, records of
// different aggregates in parallel, at most Config.MaxInFlight taken and
// not finished. A record is finished when Receive returned a durable
// outcome (processed, duplicate, parked, dead-lettered). Offsets are
// committed only up to the lowest unfinished record of each partition, so
// a record that is committed to Kafka is always committed to the inbox;
// the converse gap (inbox committed, offset not yet) is a redelivery the
// inbox reports as a duplicate.
//
// When a rebalance revokes partitions, the Runner stops starting their
// records, waits up to Config.DrainTimeout for the running ones, abandons
// the rest (their transactions roll back; their offsets are not
// committed), commits the finished offsets and only then lets the
// partitions go. When partitions are lost (the session expired), their
// work is abandoned at once and nothing is committed.
//
// This package is a module of its own so that a Kafka consumer's module
// graph holds no AMQP, NATS or Redis client.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/dispatch"
)

// Config configures a Runner.
type Config struct {
	// Brokers are the seed brokers, host:port.
	Brokers []string
	// Group is the consumer group; Topics the topics it consumes.
	Group  string
	Topics []string
	// MaxInFlight bounds the records taken from Kafka and not finished;
	// 256 by default.
	MaxInFlight int
	// DrainTimeout is how long a stop or a revoke waits for running
	// handlers before it abandons them; 10s by default. Keep it below the
	// group's rebalance timeout.
	DrainTimeout time.Duration
	// CommitInterval is how often finished offsets are committed; 1s by
	// default. A stop and a revoke always commit.
	CommitInterval time.Duration
	// Batch > 1 turns on batch mode: up to Batch records of one
	// partition, of any aggregates, are processed in one transaction
	// (inbox.ReceiveBatch), each aggregate's in offset order, and their
	// offsets become committable only after the commit. A record whose
	// handler fails falls back to its own transaction (retries, then a
	// dead letter) without failing the others. Keep it at or below
	// MaxInFlight; 0 or 1: one transaction per record.
	Batch int
	// LagInterval is how often the consumer lag of each assigned
	// partition, its high watermark minus the group's committed offset
	// (the log start offset while the group has none), as of the last
	// fetch (asked of the broker for a partition empty since it was
	// assigned), goes to the inbox's Observer.Lag, source
	// topic/partition; 10s by default.
	LagInterval time.Duration
	// SessionTimeout is how long the group waits for a member that stopped
	// heartbeating (killed, partitioned) before it hands the member's
	// partitions to the others: the failover time, less the rebalance.
	// 6s by default, the lowest a broker accepts by default
	// (group.min.session.timeout.ms); franz-go's own default is 45s.
	SessionTimeout time.Duration
	// HeartbeatInterval is how often a member heartbeats, and so how soon
	// the survivors learn of a rebalance; 1s by default. Keep it at most a
	// third of SessionTimeout.
	HeartbeatInterval time.Duration
	// Opts are further franz-go options (TLS, SASL, client id). They come
	// after the session timeout and heartbeat interval above, so a
	// kgo.SessionTimeout or kgo.HeartbeatInterval here wins. The Runner
	// sets the seed brokers, the group, the topics, manual commits and its
	// rebalance callbacks itself.
	Opts []kgo.Opt
	// Logger, nil for none.
	Logger *slog.Logger
}

// Runner consumes one group into one Inbox.
type Runner struct {
	cfg Config
	in  *inbox.Inbox
	h   inbox.Handler
	log *slog.Logger
}

// New returns a Runner that processes the records of cfg.Topics with h
// through in. It starts nothing; Run does.
func New(in *inbox.Inbox, h inbox.Handler, cfg Config) (*Runner, error) {
	switch {
	case len(cfg.Brokers) == 0:
		return nil, errors.New("kafka inbox: no brokers; set Config.Brokers")
	case cfg.Group == "":
		return nil, errors.New("kafka inbox: no consumer group; set Config.Group")
	case len(cfg.Topics) == 0:
		return nil, errors.New("kafka inbox: no topics; set Config.Topics")
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 256
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.CommitInterval <= 0 {
		cfg.CommitInterval = time.Second
	}
	if cfg.LagInterval <= 0 {
		cfg.LagInterval = 10 * time.Second
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = 6 * time.Second
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = time.Second
	}
	if cfg.HeartbeatInterval >= cfg.SessionTimeout {
		return nil, fmt.Errorf("kafka inbox: HeartbeatInterval %v is not below SessionTimeout %v; keep it at most a third of it", cfg.HeartbeatInterval, cfg.SessionTimeout)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Runner{cfg: cfg, in: in, h: h, log: log}, nil
}

type tp struct {
	topic     string
	partition int32
}

// item is a record taken from partition p.
type item struct {
	rec *kgo.Record
	p   *part
}

// part is one assigned partition.
type part struct {
	id     string          // unique within the Run: an assignment's aggregates are its own
	ctx    context.Context // cancelled when its work is abandoned
	cancel context.CancelFunc
	// taken are the offsets taken and not yet trimmed, ascending; done
	// those of them finished. mark is the offset to commit: after the
	// last of a finished prefix; -1 while there is none.
	taken     []int64
	done      map[int64]bool
	mark      int64
	committed int64
	hw, start int64 // high watermark and log start offset, as of the last fetch; -1: none yet
	stopping  bool  // revoked, lost or shutting down: start nothing more
	inflight  int   // taken and not finished or dropped
}

// finish records that offset o is done and trims the finished prefix.
func (p *part) finish(o int64) {
	p.done[o] = true
	for len(p.taken) > 0 && p.done[p.taken[0]] {
		delete(p.done, p.taken[0])
		p.mark = p.taken[0] + 1
		p.taken = p.taken[1:]
	}
}

// session is the state of one Run.
type session struct {
	r           *Runner
	cl          *kgo.Client
	workCtx     context.Context // outlives Run's ctx by the drain
	d           *dispatch.Dispatcher[item]
	mu          sync.Mutex
	cond        *sync.Cond // signalled when a partition's inflight falls
	parts       map[tp]*part
	assignments int // so far: the parts' ids
	closing     bool
	commitMu    sync.Mutex // one commit at a time, the revoke's last
}

// Run consumes until ctx is cancelled, then stops fetching, waits up to
// DrainTimeout for running handlers, commits what finished, leaves the
// group and returns nil. It returns an error when the client cannot be
// created or the group fails for good.
//
// Beside the deliveries, every inbox.Config.ReplayInterval, it runs the
// replays an operator requested for the inbox's consumer
// (`outboxrelay inbox dlq replay`; inbox.Inbox.ReplayRequested).
func (r *Runner) Run(ctx context.Context) error {
	// Replays an operator requested (outboxrelay inbox dlq replay) run
	// beside the deliveries, with this runner's handler.
	defer dispatch.StartReplays(ctx, r.in, r.h, r.log, what)()
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	s := &session{r: r, workCtx: workCtx, parts: map[tp]*part{}}
	s.cond = sync.NewCond(&s.mu)
	s.d = s.dispatcher()
	// The group's timeouts first, so that Opts may still override them.
	opts := append([]kgo.Opt{kgo.SessionTimeout(r.cfg.SessionTimeout), kgo.HeartbeatInterval(r.cfg.HeartbeatInterval)}, r.cfg.Opts...)
	opts = append(opts,
		kgo.SeedBrokers(r.cfg.Brokers...),
		kgo.ConsumerGroup(r.cfg.Group),
		kgo.ConsumeTopics(r.cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(s.assigned),
		kgo.OnPartitionsRevoked(s.revoked),
		kgo.OnPartitionsLost(s.lost),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka inbox: create the client: %w", err)
	}
	s.cl = cl

	commitDone := make(chan struct{})
	go func() {
		defer close(commitDone)
		t := time.NewTicker(r.cfg.CommitInterval)
		defer t.Stop()
		lag := time.NewTicker(r.cfg.LagInterval)
		defer lag.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.commit(ctx, nil)
			case <-lag.C:
				s.reportLag(ctx)
			}
		}
	}()

	err = s.poll(ctx)

	// Stop: start nothing more, let the running handlers finish within the
	// drain, abandon the rest, commit what finished, leave.
	s.mu.Lock()
	s.closing = true
	all := make([]tp, 0, len(s.parts))
	for k, p := range s.parts {
		p.stopping = true
		all = append(all, k)
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	<-commitDone
	s.drain(all)
	cctx, cancel := context.WithTimeout(workCtx, r.cfg.DrainTimeout)
	s.commit(cctx, all)
	cancel()
	cl.Close()
	cancelWork()
	s.d.Close()
	return err
}

func (s *session) poll(ctx context.Context) error {
	for {
		free := s.d.Wait(ctx)
		if free == 0 {
			return nil
		}
		fs := s.cl.PollRecords(ctx, free)
		if fs.IsClientClosed() {
			s.cl.AllowRebalance()
			return nil
		}
		for _, fe := range fs.Errors() {
			if errors.Is(fe.Err, context.Canceled) || errors.Is(fe.Err, context.DeadlineExceeded) {
				continue
			}
			s.r.log.Warn("kafka inbox: fetch failed", "topic", fe.Topic, "partition", fe.Partition, "error", fe.Err)
		}
		var items []item
		s.mu.Lock()
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			if p := s.parts[tp{fp.Topic, fp.Partition}]; p != nil && fp.Err == nil {
				p.hw, p.start = fp.HighWatermark, fp.LogStartOffset
			}
		})
		fs.EachRecord(func(rec *kgo.Record) {
			if it, ok := s.takeLocked(rec); ok {
				items = append(items, it)
			}
		})
		s.mu.Unlock()
		for _, it := range items {
			s.d.Take(it.p.id+"\x00"+string(it.rec.Key), it)
		}
		s.cl.AllowRebalance()
	}
}

// takeLocked counts rec as taken from its partition; false when the
// partition is not this member's any more (the next owner fetches it).
func (s *session) takeLocked(rec *kgo.Record) (item, bool) {
	p := s.parts[tp{rec.Topic, rec.Partition}]
	if p == nil || p.stopping {
		return item{}, false
	}
	p.taken = append(p.taken, rec.Offset)
	p.inflight++
	return item{rec, p}, true
}

const what = "kafka inbox"

// dispatcher runs records through the inbox, one at a time per aggregate
// (record key within its partition's assignment) or in batches of one
// partition's records. A record that finished moves its partition's
// commit mark; one dropped or abandoned does not, so it is never
// committed and the partition's next owner gets it again.
func (s *session) dispatcher() *dispatch.Dispatcher[item] {
	r := s.r
	release := func(its ...item) {
		s.mu.Lock()
		for _, it := range its {
			it.p.inflight--
		}
		s.cond.Broadcast()
		s.mu.Unlock()
	}
	return dispatch.New(dispatch.Config[item]{
		MaxInFlight: r.cfg.MaxInFlight,
		Batch:       r.cfg.Batch,
		Group:       func(it item) string { return it.p.id },
		Process: func(it item) bool {
			_, ok := dispatch.Receive(it.p.ctx, r.in, r.h, r.log, what, raw(it.rec))
			return ok
		},
		ProcessBatch: func(its []item) []bool {
			rs := dispatch.ReceiveBatch(its[0].p.ctx, r.in, r.h, r.log, what, its, // one partition's
				func(it item) inbox.Raw { return raw(it.rec) })
			oks := make([]bool, len(its))
			for i := range its {
				oks[i] = rs[i].Outcome != 0
			}
			return oks
		},
		Skip: func(it item) bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return it.p.stopping // not started: not committed, the next owner gets it
		},
		Done: func(it item, ok bool) {
			if ok {
				s.mu.Lock()
				it.p.finish(it.rec.Offset)
				s.mu.Unlock()
			}
			release(it)
		},
		Dropped: func(its []item) { release(its...) },
	})
}

// raw is rec as the inbox's broker-independent input.
func raw(rec *kgo.Record) inbox.Raw {
	raw := inbox.Raw{Key: rec.Key, Value: rec.Value, Headers: make(map[string]string, len(rec.Headers))}
	for _, h := range rec.Headers {
		raw.Headers[h.Key] = string(h.Value)
	}
	return raw
}

// reportLag reports each assigned partition's lag to the inbox's
// Observer: its high watermark minus the group's committed offset, or
// minus the log start offset while the group has committed none. franz-go
// passes on only fetches with records or errors, so a partition that was
// empty since it was assigned has no fetch to read its offsets from: they
// are asked of the broker instead, so that its lag reads 0, not nothing.
func (s *session) reportLag(ctx context.Context) {
	s.mu.Lock()
	var unfetched []tp
	for k, p := range s.parts {
		if p.hw < 0 {
			unfetched = append(unfetched, k)
		}
	}
	s.mu.Unlock()
	if len(unfetched) > 0 {
		lctx, cancel := context.WithTimeout(ctx, s.r.cfg.LagInterval)
		hw, start := s.listOffsets(lctx, unfetched, -1), s.listOffsets(lctx, unfetched, -2)
		cancel()
		s.mu.Lock()
		for k, h := range hw {
			from, ok := start[k]
			if p := s.parts[k]; p != nil && p.hw < 0 && ok {
				p.hw, p.start = h, from
			}
		}
		s.mu.Unlock()
	}

	committed := s.cl.CommittedOffsets()
	type reading struct {
		source string
		lag    int64
	}
	var rs []reading
	s.mu.Lock()
	for k, p := range s.parts {
		if p.hw < 0 {
			continue // the broker did not answer: unknown, not 0
		}
		from := p.start
		if eo, ok := committed[k.topic][k.partition]; ok && eo.Offset >= 0 {
			from = eo.Offset
		}
		if from < 0 {
			continue
		}
		rs = append(rs, reading{k.topic + "/" + strconv.Itoa(int(k.partition)), max(p.hw-from, 0)})
	}
	s.mu.Unlock()
	for _, r := range rs {
		s.r.in.ReportLag(r.source, r.lag)
	}
}

// listOffsets asks the partitions' leaders for an offset of each: at -1
// the high watermark, at -2 the log start offset. A partition that failed
// is left out.
func (s *session) listOffsets(ctx context.Context, parts []tp, at int64) map[tp]int64 {
	req := kmsg.NewPtrListOffsetsRequest()
	byTopic := map[string]int{}
	for _, k := range parts {
		i, ok := byTopic[k.topic]
		if !ok {
			i = len(req.Topics)
			byTopic[k.topic] = i
			t := kmsg.NewListOffsetsRequestTopic()
			t.Topic = k.topic
			req.Topics = append(req.Topics, t)
		}
		p := kmsg.NewListOffsetsRequestTopicPartition()
		p.Partition, p.Timestamp = k.partition, at
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, p)
	}
	out := map[tp]int64{}
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return out
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode == 0 && p.Offset >= 0 {
				out[tp{t.Topic, p.Partition}] = p.Offset
			}
		}
	}
	return out
}

func (s *session) assigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for topic, ps := range assigned {
		for _, n := range ps {
			ctx, cancel := context.WithCancel(s.workCtx)
			s.assignments++
			s.parts[tp{topic, n}] = &part{id: strconv.Itoa(s.assignments), ctx: ctx, cancel: cancel, done: map[int64]bool{}, mark: -1, committed: -1, hw: -1, start: -1}
		}
	}
}

// revoked finishes or abandons the partitions' work and commits what
// finished before the group hands them to another member.
func (s *session) revoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	ks := s.stop(revoked)
	s.drain(ks)
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if !closing { // Run commits itself before it closes the client
		s.commit(ctx, ks)
	}
	s.forget(ks)
}

// lost abandons the partitions' work at once: another member may own them
// already, so nothing is committed.
func (s *session) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	ks := s.stop(lost)
	s.mu.Lock()
	for _, k := range ks {
		s.parts[k].cancel()
	}
	s.mu.Unlock()
	s.forget(ks)
}

func (s *session) stop(m map[string][]int32) []tp {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ks []tp
	for topic, ps := range m {
		for _, n := range ps {
			k := tp{topic, n}
			if p := s.parts[k]; p != nil {
				p.stopping = true
				ks = append(ks, k)
			}
		}
	}
	return ks
}

// drain waits up to DrainTimeout for the partitions' running handlers,
// then cancels the rest and waits for them to return.
func (s *session) drain(ks []tp) {
	deadline := time.Now().Add(s.r.cfg.DrainTimeout)
	timer := time.AfterFunc(s.r.cfg.DrainTimeout, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer timer.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	busy := func() bool {
		for _, k := range ks {
			if p := s.parts[k]; p != nil && p.inflight > 0 {
				return true
			}
		}
		return false
	}
	for busy() && time.Now().Before(deadline) {
		s.cond.Wait()
	}
	if !busy() {
		return
	}
	s.r.log.Warn("kafka inbox: drain timeout; abandoning the handlers still running")
	for _, k := range ks {
		if p := s.parts[k]; p != nil {
			p.cancel()
		}
	}
	for busy() {
		s.cond.Wait()
	}
}

func (s *session) forget(ks []tp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range ks {
		if p := s.parts[k]; p != nil {
			p.cancel()
			delete(s.parts, k)
		}
	}
}

// commit commits the finished offsets of ks (nil: every partition) that
// moved since their last commit.
func (s *session) commit(ctx context.Context, ks []tp) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	offs := map[string]map[int32]kgo.EpochOffset{}
	s.mu.Lock()
	if ks == nil {
		for k := range s.parts {
			ks = append(ks, k)
		}
	}
	for _, k := range ks {
		p := s.parts[k]
		if p == nil || p.mark < 0 || p.mark == p.committed {
			continue
		}
		if offs[k.topic] == nil {
			offs[k.topic] = map[int32]kgo.EpochOffset{}
		}
		offs[k.topic][k.partition] = kgo.EpochOffset{Epoch: -1, Offset: p.mark}
	}
	s.mu.Unlock()
	if len(offs) == 0 {
		return
	}
	s.cl.CommitOffsetsSync(ctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			s.r.log.Warn("kafka inbox: offset commit failed", "error", err)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, t := range resp.Topics {
			for _, rp := range t.Partitions {
				if rp.ErrorCode != 0 {
					s.r.log.Warn("kafka inbox: offset commit refused", "topic", t.Topic, "partition", rp.Partition, "code", rp.ErrorCode)
					continue
				}
				if p := s.parts[tp{t.Topic, rp.Partition}]; p != nil {
					p.committed = offs[t.Topic][rp.Partition].Offset
				}
			}
		}
	})
}
