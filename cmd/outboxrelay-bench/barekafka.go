package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"
)

// barePipelineCommand is the hidden first argument that makes this binary
// the bulk workloads' Kafka pipeline reference: the bare pglogrepl loop
// producing each insert's pgoutput message with franz-go. It runs as a
// process of its own so that /proc gives its CPU time apart from kfake,
// which runs in this one, as the relay's does.
const barePipelineCommand = "bare-kafka-pipeline"

// barePipelineMain receives from the slot and produces every pgoutput
// Insert to the broker's benchmark topic with the relay sink's producer
// settings (acks=all, idempotent, no linger, no compression), keyed by a
// thousand keys as the relay keys by aggregate. It reports the position
// of every acknowledged transaction end, and exits once it has produced
// -rows inserts and the broker has acknowledged them.
func barePipelineMain(args []string) error {
	fs := flag.NewFlagSet(barePipelineCommand, flag.ContinueOnError)
	url := fs.String("url", "", "database URL")
	slot := fs.String("slot", "", "replication slot")
	publication := fs.String("publication", "outboxrelay", "publication")
	broker := fs.String("broker", "", "Kafka broker")
	rows := fs.Int("rows", 0, "inserts to produce")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := replicationConfig(*url)
	if err != nil {
		return err
	}
	ctx := context.Background()
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect for replication: %w", err)
	}
	defer conn.Close(ctx)
	if err := pglogrepl.StartReplication(ctx, conn, *slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: pluginArgs(*publication)}); err != nil {
		return fmt.Errorf("start replication: %w", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(*broker), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0), kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.DefaultProduceTopic(topic))
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()

	var (
		acked    atomic.Uint64 // position of the last acknowledged transaction end
		mu       sync.Mutex
		produced error
	)
	keys := make([][]byte, 1000)
	for i := range keys {
		keys[i] = []byte("order-" + strconv.Itoa(i))
	}
	var end pglogrepl.LSN // of the transaction being received
	for n := 0; n < *rows; {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		xld, ka, err := replicationMessage(msg)
		switch {
		case err != nil:
			return err
		case xld != nil && len(xld.WALData) > 0:
			switch xld.WALData[0] {
			case 'B':
				lm, err := pglogrepl.Parse(xld.WALData)
				if err != nil {
					return fmt.Errorf("parse begin: %w", err)
				}
				if b, ok := lm.(*pglogrepl.BeginMessage); ok {
					end = b.FinalLSN
				}
			case 'I':
				// The message buffer is reused: the record keeps a copy.
				rec := &kgo.Record{Key: keys[n%len(keys)], Value: append([]byte(nil), xld.WALData...)}
				txEnd := uint64(end)
				n++
				cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
					if err != nil {
						mu.Lock()
						produced = cmp.Or(produced, fmt.Errorf("produce: %w", err))
						mu.Unlock()
						return
					}
					// Later transactions' records may be acknowledged
					// first on another partition; for the benchmark's
					// drain only the last position matters.
					acked.Store(max(acked.Load(), txEnd))
				})
			}
		case ka != nil && ka.ReplyRequested:
			p := pglogrepl.LSN(acked.Load())
			err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
				WALWritePosition: p, WALFlushPosition: p, WALApplyPosition: p, ClientTime: time.Now(),
			})
			if err != nil {
				return fmt.Errorf("send status: %w", err)
			}
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	mu.Lock()
	defer mu.Unlock()
	return produced
}

// runBareKafkaPipeline runs barePipelineMain on slot into a kfake of its
// own, timed as runRelayKafka times the relay: until the broker holds
// every row.
func runBareKafkaPipeline(ctx context.Context, env *benchEnv, w workload, db, slot string, end pglogrepl.LSN) (measurement, error) {
	kb, err := newBenchKafka()
	if err != nil {
		return measurement{}, err
	}
	defer kb.close()
	watch, err := watchSlot(ctx, env.pg.URL(db), slot, end)
	if err != nil {
		return measurement{}, err
	}
	self, err := os.Executable()
	if err != nil {
		watch.close()
		return measurement{}, err
	}
	logf, err := os.Create(filepath.Join(env.workDir, slot+".log"))
	if err != nil {
		watch.close()
		return measurement{}, err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, self, barePipelineCommand, "-url", env.pg.URL(db), "-slot", slot,
		"-publication", env.publication, "-broker", kb.addr, "-rows", strconv.Itoa(w.Rows))
	cmd.Stdout, cmd.Stderr = logf, logf
	// The process exits once every record is acknowledged, and kfake
	// appends a batch before it acknowledges it: the broker holds them all.
	m, err := runConsumer(cmd, watch)
	if err != nil {
		return measurement{}, fmt.Errorf("%s: %w (log in %s)", barePipelineCommand, err, logf.Name())
	}
	m.Delivered, err = kb.rc.count(ctx)
	return m, err
}
