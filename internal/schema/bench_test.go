package schema_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/internal/schema"
)

// benchPayload has the shape and size of make bench's 1 KB rows, as
// PostgreSQL prints jsonb.
var benchPayload = []byte(`{"seq": 12345, "data": "` + strings.Repeat("0123456789abcdef", 61) + `"}`)

// BenchSchema is the schema cmd/outboxrelay-bench validates its rows with.
const benchSchema = `{"type": "object", "required": ["seq", "data"],
 "properties": {"seq": {"type": "integer", "minimum": 1}, "data": {"type": "string", "maxLength": 65536}}}`

func BenchmarkValidate1KB(b *testing.B) {
	dir := b.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "order.created"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "order.created", "v1.json"), []byte(benchSchema), 0o644); err != nil {
		b.Fatal(err)
	}
	s, err := schema.Load(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(benchPayload)))
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Validate("order.created", 1, benchPayload); err != nil {
			b.Fatal(err)
		}
	}
}
