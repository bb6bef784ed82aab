package schema_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/outbox/schema"
)

// benchPayload has the shape and size of make bench's 1 KB rows, as
// PostgreSQL prints jsonb.
var benchPayload = []byte(`{"seq": 12345, "data": "` + strings.Repeat("0123456789abcdef", 61) + `"}`)

// BenchSchema is the schema cmd/outboxrelay-bench validates its rows with.
const benchSchema = `{"type": "object", "required": ["seq", "data"],
 "properties": {"seq": {"type": "integer", "minimum": 1}, "data": {"type": "string", "maxLength": 65536}}}`

func BenchmarkValidate1KB(b *testing.B) {
	benchmarkValidate(b, benchSchema, benchPayload)
}

// orderSchema is what an order service writes: nested objects, an array of
// lines, enums, bounds, decimal strings by pattern and formats (annotations
// in draft 2020-12).
const orderSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "order.created",
  "type": "object",
  "required": ["order_id", "customer", "status", "currency", "total", "lines"],
  "properties": {
    "order_id": {"type": "integer", "minimum": 1},
    "customer": {
      "type": "object",
      "required": ["id", "email"],
      "properties": {
        "id": {"type": "string", "minLength": 1, "maxLength": 64},
        "email": {"type": "string", "format": "email", "maxLength": 254},
        "name": {"type": ["string", "null"], "maxLength": 200}
      }
    },
    "status": {"type": "string", "enum": ["created", "paid", "shipped", "cancelled"]},
    "currency": {"type": "string", "enum": ["EUR", "USD", "GBP"], "default": "EUR"},
    "total": {"type": "string", "pattern": "^-?[0-9]+(\\.[0-9]{1,4})?$"},
    "created_at": {"type": "string", "format": "date-time"},
    "lines": {
      "type": "array", "minItems": 1, "maxItems": 500,
      "items": {
        "type": "object",
        "required": ["sku", "qty", "price"],
        "properties": {
          "sku": {"type": "string", "minLength": 1, "maxLength": 32},
          "title": {"type": "string", "maxLength": 200},
          "qty": {"type": "integer", "minimum": 1, "maximum": 10000},
          "price": {"type": "string", "pattern": "^-?[0-9]+(\\.[0-9]{1,4})?$"},
          "weight_kg": {"type": "number", "exclusiveMinimum": 0}
        }
      }
    },
    "shipping": {
      "type": "object",
      "properties": {
        "street": {"type": "string"}, "city": {"type": "string"},
        "zip": {"type": "string", "maxLength": 16}, "country": {"type": "string", "minLength": 2, "maxLength": 2}
      }
    },
    "gift": {"type": "boolean"},
    "note": {"type": ["string", "null"], "maxLength": 1000}
  }
}`

// orderPayload is a 1 KB order as PostgreSQL prints jsonb.
var orderPayload = []byte(`{"gift": false, "note": "Leave at the door, ring twice – thanks!", "lines": [` +
	`{"qty": 2, "sku": "SKU-0001", "price": "19.95", "title": "Espresso beans, 1 kg", "weight_kg": 1.02}, ` +
	`{"qty": 1, "sku": "SKU-0042", "price": "89.00", "title": "Hand grinder, ceramic burrs", "weight_kg": 0.7}, ` +
	`{"qty": 3, "sku": "SKU-0107", "price": "4.50", "title": "Paper filters, 100 pieces", "weight_kg": 0.15}, ` +
	`{"qty": 1, "sku": "SKU-0220", "price": "24.90", "title": "Milk jug, stainless steel, 600 ml", "weight_kg": 0.3}, ` +
	`{"qty": 6, "sku": "SKU-0311", "price": "2.10", "title": "Cleaning tablets", "weight_kg": 0.05}, ` +
	`{"qty": 1, "sku": "SKU-0400", "price": "12.00", "title": "Tamper, 58 mm", "weight_kg": 0.45}], ` +
	`"total": "215.15", "status": "created", "currency": "EUR", "customer": {"id": "c-88120457", ` +
	`"name": "Ada Lovelace", "email": "ada.lovelace@example.com"}, "order_id": 1234567, "shipping": ` +
	`{"zip": "10115", "city": "Berlin", "street": "Invalidenstraße 117", "country": "DE"}, ` +
	`"created_at": "2026-12-01T12:00:00.123456+00:00"}`)

func BenchmarkValidateOrder1KB(b *testing.B) {
	benchmarkValidate(b, orderSchema, orderPayload)
}

func benchmarkValidate(b *testing.B, sch string, payload []byte) {
	dir := b.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "order.created"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "order.created", "v1.json"), []byte(sch), 0o644); err != nil {
		b.Fatal(err)
	}
	s, err := schema.Load(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Validate("order.created", 1, payload); err != nil {
			b.Fatal(err)
		}
	}
}
