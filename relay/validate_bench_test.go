package relay_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/outbox/schema"
	"github.com/outboxrelay/outboxrelay/relay"
)

// rowSource hands the relay outbox rows of one table in transactions of 100.
type rowSource struct {
	rel  *cdc.Relation
	rows [][][]byte
}

func newRowSource(n, aggregates int, payload func(i int) []byte) *rowSource {
	s := &rowSource{rel: &cdc.Relation{ID: 1, Namespace: "public", Name: "outbox", Columns: []cdc.Column{
		{Name: "id", TypeOID: cdc.OIDUUID, Key: true}, {Name: "aggregate_type", TypeOID: cdc.OIDText},
		{Name: "aggregate_id", TypeOID: cdc.OIDText}, {Name: "event_type", TypeOID: cdc.OIDText},
		{Name: "payload", TypeOID: cdc.OIDJSONB},
	}}}
	for i := range n {
		s.rows = append(s.rows, [][]byte{
			fmt.Appendf(nil, "00000000-0000-4000-8000-%012d", i), []byte("order"),
			fmt.Appendf(nil, "a%d", i%aggregates), []byte("order.created"), payload(i),
		})
	}
	return s
}

func (s *rowSource) Run(ctx context.Context, h cdc.Handler) error {
	if err := h.Start(ctx, 0); err != nil {
		return err
	}
	lsn := cdc.LSN(100)
	for i := 0; i < len(s.rows); {
		_ = h.Begin(ctx, cdc.Begin{FinalLSN: lsn + 200})
		for j := 0; j < 100 && i < len(s.rows); j, i = j+1, i+1 {
			lsn++
			if err := h.Insert(ctx, &cdc.Insert{Relation: s.rel, Values: s.rows[i], LSN: lsn}); err != nil {
				return err
			}
		}
		lsn += 2
		_ = h.Commit(ctx, cdc.Commit{EndLSN: lsn})
	}
	return h.Drain(ctx)
}

// BenchmarkValidateCost measures what schema validation costs the relay at
// the 1 KB rows of make bench's relay->kafka+schemas workload: 20,000 rows
// of 1,000 aggregates through a sink that acknowledges at once, without
// ("schemas=off", the reference, run just before in the same process) and
// with every payload validated through relay.Options.Validator as
// internal/app wires it. "x-off" is throughput with validation as a
// fraction of the reference, "cpu-x-off" the same for the process's CPU
// time per row. Run with -benchtime=3x and -count.
func BenchmarkValidateCost(b *testing.B) {
	dir := b.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "order.created"), 0o755); err != nil {
		b.Fatal(err)
	}
	// The schema of cmd/outboxrelay-bench.
	sch := `{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "required": ["seq", "data"],
	 "properties": {"seq": {"type": "integer", "minimum": 1}, "data": {"type": "string", "maxLength": 65536}}}`
	if err := os.WriteFile(filepath.Join(dir, "order.created", "v1.json"), []byte(sch), 0o644); err != nil {
		b.Fatal(err)
	}
	set, err := schema.Load(dir)
	if err != nil {
		b.Fatal(err)
	}
	data := strings.Repeat("0123456789abcdef", 61)
	const n = 20_000
	src := newRowSource(n, 1000, func(i int) []byte { return fmt.Appendf(nil, `{"seq": %d, "data": "%s"}`, i+1, data) })
	var reference float64
	var refCPU time.Duration
	for _, validate := range []bool{false, true} {
		name := "schemas=off"
		if validate {
			name = "schemas=on"
		}
		b.Run(name, func(b *testing.B) {
			var elapsed, cpu time.Duration
			for range b.N {
				b.StopTimer()
				var opts relay.Options
				if validate {
					opts.Validator = relay.ValidateFunc(func(em *envelope.Message) error {
						return set.Validate(em.EventType, em.SchemaVersion, em.Payload)
					})
				}
				s := &rttSink{queue: make(chan rttAttempt, n)}
				r := relay.New(relay.Config{}, s, nil, opts)
				b.StartTimer()
				start, cpu0 := time.Now(), processCPU(b)
				if err := r.Run(context.Background(), src); err != nil {
					b.Fatal(err)
				}
				elapsed, cpu = elapsed+time.Since(start), cpu+processCPU(b)-cpu0
			}
			rate := float64(n*b.N) / elapsed.Seconds()
			b.ReportMetric(rate, "msgs/s")
			// CPU time says more than wall time on a loaded machine.
			b.ReportMetric(float64(cpu.Microseconds())/float64(n*b.N), "cpu-µs/msg")
			if !validate {
				reference, refCPU = rate, cpu
			} else if reference > 0 && refCPU > 0 {
				b.ReportMetric(rate/reference, "x-off")
				b.ReportMetric(float64(cpu)/float64(refCPU), "cpu-x-off")
			}
		})
	}
}

// processCPU is the CPU time this process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
