package kafka

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
)

// encodeAvro encodes the JSON payload as Avro binary of s (no wire header).
//
// The payload is plain JSON, as producers write it, not Avro's JSON
// encoding: a union's value is given as it is (null, or a value of one of
// its branches, the first branch that takes it winning), not wrapped in an
// object naming the branch. Numbers must fit their type (a fraction or an
// out-of-range value for an int or long is a mismatch); bytes and fixed
// take a string whose code points are 0-255, as in Avro's JSON encoding;
// timestamp-millis, timestamp-micros and their local forms take an RFC 3339
// string or a number, date a YYYY-MM-DD string or a number, decimal a
// number or a numeric string. A record field missing from the payload takes
// its default and is a mismatch without one; a payload field the record
// does not declare is a mismatch too, since encoding would drop it.
func encodeAvro(s avro.Schema, payload []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("payload is not JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("payload is not JSON: text after the value")
	}
	v, err := avroValue(s, doc, "")
	if err != nil {
		return nil, err
	}
	b, err := avro.Marshal(s, v)
	if err != nil {
		return nil, fmt.Errorf("avro: %w", err)
	}
	return b, nil
}

// mismatch is the error of a payload value that s cannot hold, at the JSON
// pointer ptr of the payload.
func mismatch(ptr string, s avro.Schema, v any, why string) error {
	return fmt.Errorf("at %q: %s, want Avro %s%s", ptr, describeJSON(v), avroTypeName(s), why)
}

func describeJSON(v any) string {
	switch x := v.(type) {
	case nil:
		return "got null"
	case bool:
		return "got boolean"
	case json.Number:
		return "got number " + x.String()
	case string:
		return "got string"
	case []any:
		return "got array"
	case map[string]any:
		return "got object"
	}
	return fmt.Sprintf("got %T", v)
}

// avroTypeName is the name hamba/avro gives a union branch: the full name
// of a named type, else the type, with its logical type after a dot.
func avroTypeName(s avro.Schema) string {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	name := string(s.Type())
	if l, ok := s.(avro.LogicalTypeSchema); ok && l.Logical() != nil {
		name += "." + string(l.Logical().Type())
	}
	return name
}

// avroValue converts the decoded JSON value v into the Go value hamba/avro
// encodes as s.
func avroValue(s avro.Schema, v any, ptr string) (any, error) {
	switch s := s.(type) {
	case *avro.RefSchema:
		return avroValue(s.Schema(), v, ptr)
	case *avro.PrimitiveSchema:
		return avroPrimitive(s, v, ptr)
	case *avro.RecordSchema:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, mismatch(ptr, s, v, "")
		}
		out := make(map[string]any, len(obj))
		for _, f := range s.Fields() {
			fv, ok := obj[f.Name()]
			if !ok {
				if !f.HasDefault() {
					return nil, fmt.Errorf("at %q: required field %q is missing and has no default in the Avro schema", ptr, f.Name())
				}
				continue // hamba/avro writes the default
			}
			cv, err := avroValue(f.Type(), fv, ptr+"/"+escapeToken(f.Name()))
			if err != nil {
				return nil, err
			}
			out[f.Name()] = cv
		}
		for k := range obj {
			if _, ok := out[k]; !ok && !slices.ContainsFunc(s.Fields(), func(f *avro.Field) bool { return f.Name() == k }) {
				return nil, fmt.Errorf("at %q: field %q is not in Avro record %s; add it to the schema, or leave it out of the payload", ptr, k, s.FullName())
			}
		}
		return out, nil
	case *avro.EnumSchema:
		str, ok := v.(string)
		if !ok || !slices.Contains(s.Symbols(), str) {
			return nil, mismatch(ptr, s, v, " (one of "+strings.Join(s.Symbols(), ", ")+")")
		}
		return str, nil
	case *avro.ArraySchema:
		arr, ok := v.([]any)
		if !ok {
			return nil, mismatch(ptr, s, v, "")
		}
		out := make([]any, len(arr))
		for i, e := range arr {
			cv, err := avroValue(s.Items(), e, fmt.Sprintf("%s/%d", ptr, i))
			if err != nil {
				return nil, err
			}
			out[i] = cv
		}
		return out, nil
	case *avro.MapSchema:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, mismatch(ptr, s, v, "")
		}
		out := make(map[string]any, len(obj))
		for k, e := range obj {
			cv, err := avroValue(s.Values(), e, ptr+"/"+escapeToken(k))
			if err != nil {
				return nil, err
			}
			out[k] = cv
		}
		return out, nil
	case *avro.UnionSchema:
		var first error
		for _, b := range s.Types() {
			if b.Type() == avro.Null {
				if v == nil {
					return map[string]any{"null": nil}, nil
				}
				continue
			}
			cv, err := avroValue(b, v, ptr)
			if err == nil {
				return map[string]any{avroTypeName(b): cv}, nil
			}
			if first == nil {
				first = err
			}
		}
		if first == nil || len(s.Types()) > 2 || !s.Nullable() {
			return nil, mismatch(ptr, s, v, "")
		}
		return nil, first // a nullable type: say why the one other branch refused it
	case *avro.FixedSchema:
		if l := s.Logical(); l != nil && l.Type() == avro.Decimal {
			return avroDecimal(s, v, ptr)
		}
		b, err := avroBytes(s, v, ptr)
		if err != nil {
			return nil, err
		}
		if len(b) != s.Size() {
			return nil, mismatch(ptr, s, v, fmt.Sprintf(" of %d bytes, got %d", s.Size(), len(b)))
		}
		arr := reflect.New(reflect.ArrayOf(s.Size(), reflect.TypeFor[byte]())).Elem()
		reflect.Copy(arr, reflect.ValueOf(b))
		return arr.Interface(), nil
	}
	return nil, fmt.Errorf("at %q: Avro %s is not supported", ptr, s.Type())
}

func avroPrimitive(s *avro.PrimitiveSchema, v any, ptr string) (any, error) {
	var logical avro.LogicalType
	if l := s.Logical(); l != nil {
		logical = l.Type()
	}
	switch s.Type() {
	case avro.Null:
		if v != nil {
			return nil, mismatch(ptr, s, v, "")
		}
		return nil, nil
	case avro.Boolean:
		b, ok := v.(bool)
		if !ok {
			return nil, mismatch(ptr, s, v, "")
		}
		return b, nil
	case avro.Int, avro.Long:
		if str, ok := v.(string); ok && avroTimes[logical] != "" {
			t, err := time.Parse(avroTimes[logical], str)
			if err != nil {
				return nil, mismatch(ptr, s, v, ": "+err.Error())
			}
			return t, nil
		}
		n, ok := v.(json.Number)
		if !ok {
			return nil, mismatch(ptr, s, v, "")
		}
		i, err := n.Int64()
		if err != nil || s.Type() == avro.Int && (i < math.MinInt32 || i > math.MaxInt32) {
			return nil, mismatch(ptr, s, v, " (an integer in range)")
		}
		// int, not int32 or int64: hamba/avro writes an int as either
		// type without reading it as a time.Duration or time.Time.
		return int(i), nil
	case avro.Float, avro.Double:
		n, ok := v.(json.Number)
		if !ok {
			return nil, mismatch(ptr, s, v, "")
		}
		f, err := n.Float64()
		if err != nil {
			return nil, mismatch(ptr, s, v, "")
		}
		if s.Type() == avro.Float {
			return float32(f), nil
		}
		return f, nil
	case avro.String:
		str, ok := v.(string)
		if !ok {
			return nil, mismatch(ptr, s, v, "")
		}
		return str, nil
	case avro.Bytes:
		if logical == avro.Decimal {
			return avroDecimal(s, v, ptr)
		}
		return avroBytes(s, v, ptr)
	}
	return nil, fmt.Errorf("at %q: Avro %s is not supported", ptr, s.Type())
}

// avroTimes are the layouts of the logical types that take a string.
var avroTimes = map[avro.LogicalType]string{
	avro.Date:                 time.DateOnly,
	avro.TimestampMillis:      time.RFC3339Nano,
	avro.TimestampMicros:      time.RFC3339Nano,
	avro.LocalTimestampMillis: time.RFC3339Nano,
	avro.LocalTimestampMicros: time.RFC3339Nano,
}

func avroBytes(s avro.Schema, v any, ptr string) ([]byte, error) {
	str, ok := v.(string)
	if !ok {
		return nil, mismatch(ptr, s, v, "")
	}
	b := make([]byte, 0, len(str))
	for _, r := range str {
		if r > 0xff {
			return nil, mismatch(ptr, s, v, " (a string of code points 0 to 255)")
		}
		b = append(b, byte(r))
	}
	return b, nil
}

func avroDecimal(s avro.Schema, v any, ptr string) (*big.Rat, error) {
	var text string
	switch x := v.(type) {
	case json.Number:
		text = x.String()
	case string:
		text = x
	default:
		return nil, mismatch(ptr, s, v, "")
	}
	r, ok := new(big.Rat).SetString(text)
	if !ok {
		return nil, mismatch(ptr, s, v, " (a decimal number)")
	}
	return r, nil
}

func escapeToken(t string) string {
	return strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1")
}
