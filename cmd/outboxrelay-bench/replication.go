package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// pluginArgs are the pgoutput options the relay sends (cdc/stream.go), so
// that every consumer makes the walsender do the same work.
func pluginArgs(publication string) []string {
	return []string{"proto_version '1'", "publication_names '" + publication + "'", "messages 'true'"}
}

// slotWatch polls a slot every 50 ms: its walsender's CPU time and its
// confirmed position.
type slotWatch struct {
	mu        sync.Mutex
	walsender procSample // latest sample of the walsender serving the slot
	started   time.Time  // when the first walsender for the slot started
	consumer  int        // pid of a consumer process to sample, 0 for none
	hwmKiB    int64      // the consumer's latest VmHWM
	confirmed pglogrepl.LSN
	reached   chan struct{} // closed once confirmed >= end
	stop      context.CancelFunc
	done      chan struct{}
}

func watchSlot(ctx context.Context, url, slot string, end pglogrepl.LSN) (*slotWatch, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect slot watcher: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &slotWatch{reached: make(chan struct{}), stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer conn.Close(context.WithoutCancel(ctx))
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		pid := 0
		for {
			var activePID *int32
			var confirmed *string
			err := conn.QueryRow(ctx, "SELECT active_pid, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&activePID, &confirmed)
			if err == nil {
				if activePID != nil {
					pid = int(*activePID)
				}
				w.mu.Lock()
				if pid != 0 {
					if s := readProc(pid); s.ok {
						w.walsender = s
						if w.started.IsZero() {
							w.started = s.started
						}
					}
				}
				if w.consumer != 0 {
					if s := readProc(w.consumer); s.ok {
						w.hwmKiB = s.hwmKiB
					}
				}
				if confirmed != nil {
					if lsn, err := pglogrepl.ParseLSN(*confirmed); err == nil && lsn > w.confirmed {
						w.confirmed = lsn
						if lsn >= end {
							select {
							case <-w.reached:
							default:
								close(w.reached)
							}
						}
					}
				}
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return w, nil
}

// track makes the watcher sample the peak RSS of process pid.
func (w *slotWatch) track(pid int) {
	w.mu.Lock()
	w.consumer = pid
	w.mu.Unlock()
}

// close stops polling and returns the walsender's latest sample and the
// time it started.
func (w *slotWatch) close() (procSample, time.Time) {
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.walsender, w.started
}

// runRecvlogical drains slot with pg_recvlogical into /dev/null until it
// passes end: the decoding ceiling, all of it in C.
func runRecvlogical(ctx context.Context, env *benchEnv, db, slot string, end pglogrepl.LSN) (measurement, error) {
	watch, err := watchSlot(ctx, env.pg.URL(db), slot, end)
	if err != nil {
		return measurement{}, err
	}
	args := []string{
		"--dbname=" + env.pg.URL(db), "--slot=" + slot, "--start", "--no-loop",
		"--endpos=" + end.String(), "--file=/dev/null",
		"--option=proto_version=1", "--option=publication_names=" + env.publication, "--option=messages=true",
	}
	cmd := exec.CommandContext(ctx, filepath.Join(env.pg.BinDir(), "pg_recvlogical"), args...)
	logf, err := os.Create(filepath.Join(env.workDir, "pg_recvlogical-"+slot+".log"))
	if err != nil {
		watch.close()
		return measurement{}, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	m, err := runConsumer(cmd, watch)
	if err != nil {
		return measurement{}, fmt.Errorf("pg_recvlogical: %w (log in %s)", err, logf.Name())
	}
	return m, nil
}

// runConsumer runs cmd, a consumer of watch's slot, to its exit, and closes
// watch. The measurement ends when the process exits and holds its CPU
// time, the walsender's, and this process's as benchCPU (kfake's, when it
// runs here). The CPU time comes from wait4; the peak RSS from /proc,
// because ru_maxrss of a child forked from this process counts this
// process's memory too.
func runConsumer(cmd *exec.Cmd, watch *slotWatch) (measurement, error) {
	busy0, self0 := machineBusy(), selfCPU()
	launched := time.Now()
	err := cmd.Start()
	if err == nil {
		watch.track(cmd.Process.Pid)
		err = cmd.Wait()
	}
	done := time.Now()
	busy, self := machineBusy()-busy0, selfCPU()-self0
	ws, started := watch.close()
	if err != nil {
		return measurement{}, err
	}
	m := measurement{launched: launched, streamed: started, done: done,
		walsenderCPU: ws.cpu, benchCPU: self, machineBusy: busy, PeakRSSMB: float64(watch.hwmKiB) / 1024}
	if st := cmd.ProcessState; st != nil {
		m.consumerCPU = st.UserTime() + st.SystemTime()
	}
	return m, nil
}

// replicationConfig parses url for a replication connection.
func replicationConfig(url string) (*pgconn.Config, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["replication"] = "database"
	return cfg, nil
}

// runBareReplication drains slot with a minimal pglogrepl loop in this
// process: it receives every XLogData message, does not decode pgoutput,
// and confirms the received position on each keepalive. It is the ceiling
// of a Go client on pgconn.
func runBareReplication(ctx context.Context, env *benchEnv, db, slot string, end pglogrepl.LSN) (measurement, error) {
	watch, err := watchSlot(ctx, env.pg.URL(db), slot, end)
	if err != nil {
		return measurement{}, err
	}
	cfg, err := replicationConfig(env.pg.URL(db))
	if err != nil {
		watch.close()
		return measurement{}, err
	}
	busy0, cpu0 := machineBusy(), selfCPU()
	launched := time.Now()
	err = bareLoop(ctx, cfg, slot, env.publication, end)
	done := time.Now()
	cpu, busy := selfCPU()-cpu0, machineBusy()-busy0
	ws, started := watch.close()
	if err != nil {
		return measurement{}, err
	}
	return measurement{launched: launched, streamed: started, done: done,
		consumerCPU: cpu, walsenderCPU: ws.cpu, machineBusy: busy, inProcess: true}, nil
}

func bareLoop(ctx context.Context, cfg *pgconn.Config, slot, publication string, end pglogrepl.LSN) error {
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect for replication: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: pluginArgs(publication)}); err != nil {
		return fmt.Errorf("start replication: %w", err)
	}
	// The loop receives with a context that is never done, as a lean client
	// would; cancellation closes the socket instead.
	stop := context.AfterFunc(ctx, func() { _ = conn.Conn().Close() })
	defer stop()
	var pos pglogrepl.LSN
	for pos < end {
		msg, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("receive: %w", err)
		}
		xld, ka, err := replicationMessage(msg)
		switch {
		case err != nil:
			return err
		case xld != nil:
			pos = max(pos, xld.WALStart)
		case ka != nil:
			pos = max(pos, ka.ServerWALEnd)
			err = pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
				WALWritePosition: pos, WALFlushPosition: pos, WALApplyPosition: pos, ClientTime: time.Now(),
			})
			if err != nil {
				return fmt.Errorf("send status: %w", err)
			}
		}
	}
	return nil
}

// replicationMessage returns the XLogData or the keepalive that msg carries,
// both nil for any other message, and an error for a message that ends the
// stream.
func replicationMessage(msg pgproto3.BackendMessage) (*pglogrepl.XLogData, *pglogrepl.PrimaryKeepaliveMessage, error) {
	switch msg := msg.(type) {
	case *pgproto3.CopyData:
		if len(msg.Data) == 0 {
			return nil, nil, nil
		}
		switch msg.Data[0] {
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
			if err != nil {
				return nil, nil, fmt.Errorf("parse xlogdata: %w", err)
			}
			return &xld, nil, nil
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
			if err != nil {
				return nil, nil, fmt.Errorf("parse keepalive: %w", err)
			}
			return nil, &ka, nil
		}
	case *pgproto3.ErrorResponse:
		return nil, nil, pgconn.ErrorResponseToPgError(msg)
	case *pgproto3.CopyDone:
		return nil, nil, errors.New("walsender ended the stream")
	}
	return nil, nil, nil
}

// relayProc is a running `outboxrelay run`.
type relayProc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func startRelay(env *benchEnv, name, config, slot string) (*relayProc, error) {
	cfgPath := filepath.Join(env.workDir, name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		return nil, err
	}
	logPath := filepath.Join(env.workDir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(env.relayBin, "run", "--config", cfgPath)
	// The bench creates every slot before it loads the backlog, so the slot
	// holds every row and the tables have none to add. With
	// postgres.backfill: auto the first relay's first start would still
	// peek the whole backlog to find that out, and the run would time it.
	cmd.Env = append(append(relayEnv(), env.relayExtraEnv...), "OUTBOXRELAY_POSTGRES_SLOT="+slot, "OUTBOXRELAY_POSTGRES_BACKFILL=none")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start relay: %w", err)
	}
	p := &relayProc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// relayEnv is this process's environment without OUTBOXRELAY_ variables,
// so that only the benchmark's settings reach the relay.
func relayEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if len(kv) < 12 || kv[:12] != "OUTBOXRELAY_" {
			out = append(out, kv)
		}
	}
	return out
}

// stop sends SIGTERM and waits for a clean exit.
func (p *relayProc) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("relay did not stop within 60s of SIGTERM (log %s)", p.log)
	}
	if p.err != nil {
		return fmt.Errorf("relay exited with %v (log %s)", p.err, p.log)
	}
	return nil
}

// runRelay runs the relay binary on slot. The run is timed twice: until the
// broker holds all rows (delivered, polled every interval), and until the
// slot's confirmed_flush_lsn passes end (polled every 50 ms), which the
// relay reports only after it has recorded its checkpoint (once a second)
// and sent its status (postgres.status_interval). CPU and peak RSS are read
// from /proc at confirmation, before the relay is stopped, so that shutdown
// is not counted.
func runRelay(ctx context.Context, env *benchEnv, name string, config func(listen string) string, db, slot string, end pglogrepl.LSN,
	rows int, delivered func(context.Context) (int64, error), every time.Duration, profile string) (measurement, error) {
	watch, err := watchSlot(ctx, env.pg.URL(db), slot, end)
	if err != nil {
		return measurement{}, err
	}
	// Generous for this machine, yet short enough that a relay stuck on a
	// blocked broker does not eat the benchmark's time budget.
	ctx, cancel := context.WithTimeout(ctx, time.Minute+time.Duration(rows)*time.Second/2000)
	defer cancel()
	listen, err := freeAddr()
	if err != nil {
		watch.close()
		return measurement{}, err
	}
	busy0 := machineBusy()
	self0 := selfCPU()
	launched := time.Now()
	p, err := startRelay(env, name, config(listen), slot)
	if err != nil {
		watch.close()
		return measurement{}, err
	}
	var perf *exec.Cmd
	if profile != "" {
		perf = exec.Command("perf", "record", "-q", "-F", "1999", "-g", "-p", strconv.Itoa(p.cmd.Process.Pid), "-o", profile)
		perf.Stdout, perf.Stderr = os.Stderr, os.Stderr
		if err := perf.Start(); err != nil {
			perf = nil
			fmt.Fprintln(os.Stderr, "perf record:", err)
		}
	}
	acked := make(chan time.Time, 1)
	pollCtx, stopPoll := context.WithCancel(ctx)
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if n, err := delivered(pollCtx); err == nil && n >= int64(rows) {
				acked <- time.Now()
				return
			}
			select {
			case <-pollCtx.Done():
				return
			case <-t.C:
			}
		}
	}()
	var runErr error
	var ackedAt time.Time
	reached := watch.reached
	for runErr == nil && (ackedAt.IsZero() || reached != nil) {
		select {
		case ackedAt = <-acked:
		case <-reached:
			reached = nil // wait for acked too
		case <-p.done:
			runErr = fmt.Errorf("relay exited early: %v (log %s)", p.err, p.log)
		case <-ctx.Done():
			runErr = fmt.Errorf("relay did not finish: %w (log %s)", ctx.Err(), p.log)
		}
	}
	confirmed := time.Now()
	stopPoll()
	rs := readProc(p.cmd.Process.Pid)
	self, busy := selfCPU()-self0, machineBusy()-busy0
	gm, _ := scrapeMetrics(ctx, listen, "go_memstats_alloc_bytes_total", "go_gc_duration_seconds_count")
	ws, started := watch.close()
	if perf != nil {
		_ = perf.Process.Signal(syscall.SIGINT)
		_ = perf.Wait()
	}
	if stopErr := p.stop(); runErr == nil && stopErr != nil {
		runErr = stopErr
	}
	if runErr != nil {
		return measurement{}, runErr
	}
	return measurement{
		launched: launched, streamed: started, done: ackedAt, confirmed: confirmed,
		consumerCPU: rs.cpu, walsenderCPU: ws.cpu, benchCPU: self,
		PeakRSSMB: float64(rs.hwmKiB) / 1024, machineBusy: busy,
		allocBytes: gm["go_memstats_alloc_bytes_total"], GCs: int(gm["go_gc_duration_seconds_count"]),
	}, nil
}
