package kafka

import (
	"bytes"
	"fmt"
	"io"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// BenchmarkCompression measures each codec of sink.kafka.compression on a
// batch of 100 typical 1 KB envelopes, with the libraries and levels
// franz-go uses. It reports ns per batch, the compressed size as a share of
// the input (ratio) and the cost relative to gzip measured in the same run
// is printed by comparing the ns/op lines. Run:
//
//	go test ./sinks/kafka -run '^$' -bench Compression
func BenchmarkCompression(b *testing.B) {
	var batch bytes.Buffer
	for i := range 100 {
		fmt.Fprintf(&batch, `{"envelope_version":1,"message_id":"0193a5b0-7d4e-7c1a-9f3e-%012x","event_type":"order.created","schema_version":1,"aggregate_type":"order","aggregate_id":"%d","occurred_at":"2026-11-29T08:00:00.123456Z","trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","headers":{"tenant":"acme"},"source":{"database":"shop","table":"public.outbox","lsn":"0/1A2B3C4","commit_lsn":"0/1A2B400","xid":%d,"committed_at":"2026-11-29T08:00:00.130001Z"},"payload":{"order_id":%d,"customer":"customer-%d","lines":[{"sku":"SKU-%d","qty":%d,"price":"19.90"},{"sku":"SKU-%d","qty":1,"price":"5.00"}],"total":"%d.90","currency":"EUR","status":"created","note":"deliver to the back door, ring twice"}}`,
			i, i*7, 1000+i, i, i%50, i%300, i%4+1, (i+11)%300, 20+i)
	}
	in := batch.Bytes()
	zw, _ := zstd.NewWriter(nil, zstd.WithWindowSize(64<<10), zstd.WithEncoderConcurrency(1), zstd.WithZeroFrames(true))
	codecs := []struct {
		name string
		fn   func(dst *bytes.Buffer)
	}{
		{"none", func(dst *bytes.Buffer) { dst.Write(in) }},
		{"gzip", func(dst *bytes.Buffer) {
			w, _ := gzip.NewWriterLevel(dst, gzip.DefaultCompression)
			_, _ = w.Write(in)
			_ = w.Close()
		}},
		{"snappy", func(dst *bytes.Buffer) { dst.Write(s2.EncodeSnappy(nil, in)) }},
		{"lz4", func(dst *bytes.Buffer) {
			w := lz4.NewWriter(dst)
			_, _ = io.Copy(w, bytes.NewReader(in))
			_ = w.Close()
		}},
		{"zstd", func(dst *bytes.Buffer) { dst.Write(zw.EncodeAll(in, nil)) }},
	}
	for _, c := range codecs {
		b.Run(c.name, func(b *testing.B) {
			var out bytes.Buffer
			b.SetBytes(int64(len(in)))
			for range b.N {
				out.Reset()
				c.fn(&out)
			}
			b.ReportMetric(float64(out.Len())/float64(len(in)), "ratio")
		})
	}
}
