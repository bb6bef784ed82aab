package schema_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/outbox/schema"
)

func load(t testing.TB, opts ...schema.Option) *schema.Set {
	t.Helper()
	s, err := schema.Load("testdata/schemas", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestLoadFindsEveryVersion(t *testing.T) {
	got := fmt.Sprint(load(t).Keys())
	if want := "[order.created v1 order.created v2]"; got != want {
		t.Fatalf("keys %s, want %s", got, want)
	}
}

func TestValidate(t *testing.T) {
	s := load(t)
	for _, tc := range []struct {
		name, payload string
		version       int
		want          string // "" means valid
	}{
		{"valid", `{"order_id": 42, "total": "99.90"}`, 1, ""},
		{"unknown fields are tolerated", `{"order_id": 42, "total": "99.90", "note": "gift"}`, 1, ""},
		{"v2 field", `{"order_id": 42, "total": "99.90", "currency": "EUR"}`, 2, ""},
		{"wrong type", `{"order_id": 42, "total": 99.9}`, 1,
			`payload does not match schema order.created v1: at "/total", rule _shared/money.json#/type: got number, want string`},
		{"missing required", `{"total": "1"}`, 1,
			`payload does not match schema order.created v1: at "", rule order.created/v1.json#/required: missing property 'order_id'`},
		{"nested item", `{"order_id": 42, "total": "1", "lines": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 0}]}`, 1,
			`payload does not match schema order.created v1: at "/lines/1/qty", rule order.created/v1.json#/properties/lines/items/properties/qty/minimum: minimum: got 0, want 1`},
		{"enum", `{"order_id": 42, "total": "1", "currency": "GBP"}`, 2,
			`payload does not match schema order.created v2: at "/currency", rule order.created/v2.json#/properties/currency/enum: value must be one of 'EUR', 'USD'`},
		{"two failures", `{"order_id": 0, "total": 1}`, 1, `(and 1 more)`},
		{"not JSON", `{"order_id": `, 1, `payload does not match schema order.created v1 (order.created/v1.json): payload is not JSON`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Validate("order.created", tc.version, []byte(tc.payload))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("valid payload refused: %v", err)
				}
				return
			}
			var verr *schema.ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("error %v, want a *schema.ValidationError", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error\n%s\nwant it to contain\n%s", err, tc.want)
			}
		})
	}
}

func TestMissingSchema(t *testing.T) {
	err := load(t).Validate("order.created", 3, []byte(`{}`))
	if !errors.Is(err, schema.ErrNoSchema) || !strings.Contains(err.Error(), "add order.created/v3.json") {
		t.Fatalf("error %v, want ErrNoSchema naming the file to add", err)
	}
	if err := load(t, schema.AllowMissing()).Validate("order.shipped", 1, []byte(`{}`)); err != nil {
		t.Fatalf("AllowMissing: %v", err)
	}
}

func TestLoadRefusesBadFolders(t *testing.T) {
	for _, tc := range []struct {
		name, file, content, want string
	}{
		{"misnamed", "order.created/1.json", `{}`, "is not named v<version>.json"},
		{"not JSON", "order.created/v1.json", `{"type": `, "schema order.created/v1.json:"},
		{"not a schema", "order.created/v1.json", `{"type": "strin"}`, "schema order.created/v1.json:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, tc.file)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := schema.Load(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := schema.Load(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("a missing folder loaded")
	}
}

// TestValidateNumberBeyondValidator checks that a number the library
// cannot compare with a bound is refused with an error, not a panic.
func TestValidateNumberBeyondValidator(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "e"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "e", "v1.json"), []byte(`{"properties": {"n": {"minimum": 0}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := schema.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{`{"n": 1e1000001}`, `{"n": 0E10000000000000000000}`} {
		err := s.Validate("e", 1, []byte(p))
		var verr *schema.ValidationError
		if !errors.As(err, &verr) || !strings.Contains(err.Error(), "payload does not match schema e v1 (e/v1.json): payload cannot be validated: the validator failed") {
			t.Errorf("%s: error %v", p, err)
		}
	}
	if err := s.Validate("e", 1, []byte(`{"n": 1e99999}`)); err != nil {
		t.Errorf("valid payload refused: %v", err)
	}
}
