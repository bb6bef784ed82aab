package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"
)

// bareLoopCommand is the hidden first argument that makes this binary the
// latency run's reference consumer instead of the benchmark. It runs as a
// process of its own so that /proc gives its CPU time apart from kfake, the
// inserting connection and the measuring consumer, which share this one.
const bareLoopCommand = "bare-latency-loop"

// bareLatency is what the reference consumer reports on its stdout.
type bareLatency struct {
	// MS holds, for every transaction with an insert, the time from its
	// commit (pgoutput's commit timestamp, PostgreSQL's clock) to the
	// loop's receipt of its Commit message, in milliseconds.
	MS []float64 `json:"ms"`
	// CPU and context switches of the loop, from getrusage, from its first
	// transaction with an insert to its last; Rows is how many it received
	// in that span.
	CPUSeconds  float64 `json:"cpu_seconds"`
	Voluntary   int64   `json:"voluntary_switches"`
	Involuntary int64   `json:"involuntary_switches"`
	Rows        int     `json:"rows"`
}

// usage returns this process's CPU time and context switches so far.
func usage() (time.Duration, switches) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, switches{}
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return cpu, switches{voluntary: ru.Nvcsw, involuntary: ru.Nivcsw}
}

// bareLatencyMain is the reference consumer: a bare pglogrepl loop on the
// relay's pgoutput options that reads the commit timestamp of each
// transaction and nothing else, reports its position every 100 ms (the
// benchmark relay's postgres.status_interval) and answers reply requests
// at once. It stops after -n transactions with an insert, or when stdin
// closes.
func bareLatencyMain(args []string) error {
	fs := flag.NewFlagSet(bareLoopCommand, flag.ContinueOnError)
	url := fs.String("url", "", "database URL")
	slot := fs.String("slot", "", "replication slot")
	publication := fs.String("publication", "outboxrelay", "publication")
	n := fs.Int("n", 0, "transactions with an insert to wait for")
	produce := fs.String("produce", "", "Kafka broker: produce each transaction's insert there and confirm it once acknowledged")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := replicationConfig(*url)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect for replication: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := pglogrepl.StartReplication(ctx, conn, *slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: pluginArgs(*publication)}); err != nil {
		return fmt.Errorf("start replication: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Conn().Close() })
	defer stop()

	out := bareLatency{MS: make([]float64, 0, *n)}
	// The loop receives with a context that is never done, as the relay
	// does (a context per receive costs pgconn a watcher per message); a
	// goroutine reports the position every 100 ms, as the relay's status
	// writer does, and the loop answers reply requests at once.
	var pos atomic.Uint64
	var writeMu sync.Mutex
	status := func() error {
		writeMu.Lock()
		defer writeMu.Unlock()
		p := pglogrepl.LSN(pos.Load())
		return pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: p, WALFlushPosition: p, WALApplyPosition: p, ClientTime: time.Now(),
		})
	}
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_ = status() // a broken connection ends the reader too
			}
		}
	}()
	var prod *bareProducer
	if *produce != "" {
		if prod, err = newBareProducer(*produce, &pos); err != nil {
			return err
		}
		defer prod.cl.Close()
	}
	var held []byte // the insert of the open transaction, in produce mode
	sawInsert := false
	var cpu0 time.Duration
	var sw0 switches
	for seen := 0; seen < *n; {
		msg, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return fmt.Errorf("receive: %w", err)
		}
		xld, ka, err := replicationMessage(msg)
		switch {
		case err != nil:
			return err
		case ka != nil && ka.ReplyRequested:
			if err := status(); err != nil {
				return fmt.Errorf("send status: %w", err)
			}
		case xld != nil && len(xld.WALData) > 0:
			if prod == nil {
				pos.Store(max(pos.Load(), uint64(xld.WALStart)))
			}
			switch xld.WALData[0] {
			case 'I':
				sawInsert = true
				if prod != nil {
					held = append([]byte(nil), xld.WALData...) // the message buffer is reused
				}
			case 'C':
				if !sawInsert {
					continue
				}
				sawInsert = false
				lm, err := pglogrepl.Parse(xld.WALData)
				if err != nil {
					return fmt.Errorf("parse commit: %w", err)
				}
				if c, ok := lm.(*pglogrepl.CommitMessage); ok {
					seen++
					if seen == 1 {
						cpu0, sw0 = usage()
					}
					if prod != nil {
						prod.produce(held, c)
					} else {
						out.MS = append(out.MS, ms(time.Since(c.CommitTime)))
					}
				}
			}
		}
	}
	if prod != nil {
		if err := prod.cl.Flush(ctx); err != nil && ctx.Err() == nil {
			return fmt.Errorf("flush: %w", err)
		}
		prod.mu.Lock()
		out.MS = prod.ms
		err := prod.err
		prod.mu.Unlock()
		if err != nil {
			return err
		}
	}
	if len(out.MS) > 1 {
		cpu, sw := usage()
		out.CPUSeconds, out.Rows = (cpu - cpu0).Seconds(), len(out.MS)-1
		out.Voluntary, out.Involuntary = sw.voluntary-sw0.voluntary, sw.involuntary-sw0.involuntary
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// bareProducer is the reference consumer's Kafka side with -produce: a
// franz-go client with the relay sink's producer settings (acks=all,
// idempotent, no linger, no compression), which produces each
// transaction's raw pgoutput Insert and confirms the transaction's end
// once the broker acknowledged it. It measures what reading PostgreSQL and
// producing to Kafka cost with these two libraries and nothing else.
type bareProducer struct {
	cl  *kgo.Client
	pos *atomic.Uint64 // the confirmed position the status goroutine reports

	mu  sync.Mutex
	ms  []float64 // commit to acknowledgement, per transaction
	err error
}

func newBareProducer(broker string, pos *atomic.Uint64) (*bareProducer, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.DefaultProduceTopic(bareTopic), kgo.AllowAutoTopicCreation())
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return &bareProducer{cl: cl, pos: pos}, nil
}

// bareTopic is where the reference consumer produces in -produce mode.
// newKafka creates it, so that the measuring consumer reads it from the
// first record on.
const bareTopic = "bare.order"

// commitHeader carries, on each record the reference produces, its
// transaction's commit time (pgoutput's, PostgreSQL's clock) in
// microseconds since the Unix epoch: the measuring consumer times the
// reference's records from commit to receipt as it times the relay's.
const commitHeader = "commit-us"

func (p *bareProducer) produce(value []byte, c *pglogrepl.CommitMessage) {
	end := uint64(c.TransactionEndLSN)
	r := &kgo.Record{Value: value, Headers: []kgo.RecordHeader{{Key: commitHeader, Value: strconv.AppendInt(nil, c.CommitTime.UnixMicro(), 10)}}}
	p.cl.Produce(context.Background(), r, func(_ *kgo.Record, err error) {
		acked := time.Now()
		p.mu.Lock()
		defer p.mu.Unlock()
		if err != nil {
			p.err = cmp.Or(p.err, fmt.Errorf("produce: %w", err))
			return
		}
		p.ms = append(p.ms, ms(acked.Sub(c.CommitTime)))
		// One partition's promises arrive in produce order, and the
		// default partitioner keeps to one partition while batches are
		// single records; max makes the position safe either way.
		p.pos.Store(max(p.pos.Load(), end))
	})
}

// bareLoopProc is a running reference consumer.
type bareLoopProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   strings.Builder
	done  chan struct{}
	err   error
}

// startBareLoop starts the reference consumer on slot, waiting for n
// transactions.
func startBareLoop(env *benchEnv, url, slot string, n int, extra ...string) (*bareLoopProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	p := &bareLoopProc{done: make(chan struct{})}
	args := append([]string{bareLoopCommand, "-url", url, "-slot", slot, "-publication", env.publication, "-n", strconv.Itoa(n)}, extra...)
	p.cmd = exec.Command(self, args...)
	// A runtime setting under test (-relay-env GOMAXPROCS=1, GOGC=...)
	// applies to the reference too.
	p.cmd.Env = append(os.Environ(), env.relayExtraEnv...)
	logf, err := os.Create(filepath.Join(env.workDir, slot+".log"))
	if err != nil {
		return nil, err
	}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, logf
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		logf.Close()
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start the bare loop: %w", err)
	}
	go func() {
		p.err = p.cmd.Wait()
		logf.Close()
		if p.err != nil {
			p.err = fmt.Errorf("bare loop: %w (log %s)", p.err, logf.Name())
		}
		close(p.done)
	}()
	return p, nil
}

// result waits up to wait for the consumer to have every transaction, then
// stops it and returns its latencies.
func (p *bareLoopProc) result(wait time.Duration) (bareLatency, error) {
	select {
	case <-p.done:
	case <-time.After(wait):
		p.stop()
	}
	var bl bareLatency
	if p.err != nil {
		return bl, p.err
	}
	if err := json.Unmarshal([]byte(p.out.String()), &bl); err != nil {
		return bl, fmt.Errorf("bare loop output: %w", err)
	}
	return bl, nil
}

// stop ends the consumer if it still runs.
func (p *bareLoopProc) stop() {
	_ = p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
