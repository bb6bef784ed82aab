package rules

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"cel.dev/cel-go/cel"
	"go.yaml.in/yaml/v3"
)

// nativeBools and nativeStrings are expressions of each form native.go
// compiles, and of forms next to them it must leave to CEL: numbers of
// the other type, absent keys, errors on either side of && and ||.
var (
	nativeBools = []string{
		`aggregate_type == "order"`, `aggregate_type != "order"`, `"order" == aggregate_type`,
		`event_type == "order.refunded" || event_type == "payment.refunded"`,
		`aggregate_type in ["customer", "account", "order"]`, `aggregate_type in []`,
		`event_type.endsWith(".deleted")`, `aggregate_id.startsWith("test-")`, `aggregate_id.contains("-")`,
		`event_type.matches("^order\\.")`, `aggregate_type < "m"`, `aggregate_type >= aggregate_id`,
		`schema_version == 1`, `schema_version >= 2`, `schema_version < 2 && table == "public.outbox"`,
		`"tenant" in headers && headers["tenant"] == "acme"`, `headers["tenant"] == "acme"`, `headers.tenant == "acme"`,
		`has(headers.tenant)`, `"x-partner" in headers`, `aggregate_id in row`,
		`"region" in row && row["region"] == "eu"`, `row["region"] == "eu"`, `row[aggregate_type] == "x"`,
		`aggregate_type == "order" && has(payload.priority) && payload.priority == "high"`,
		`payload.priority == "high"`, `"high" != payload.priority`, `payload.flag == true`, `payload.flag`, `!payload.flag`,
		`payload.seq > 0.0`, `payload.seq >= -1.5`, `0.5 < payload.seq`, `payload.seq <= payload.seq`, `payload.seq == 42.0`,
		`payload.seq == 42`, `payload.seq > 0`, `payload.seq == null`, `payload.a.b == "x"`, `has(payload.a.b)`, `has(payload.a)`,
		`payload.seq > 1.0 || "x-partner" in headers`, `"x-partner" in headers || payload.seq > 1.0`,
		`payload.missing == "a" && false`, `false && payload.missing == "a"`, `payload.missing == "a" || true`,
		`payload.name in ["a", "b"]`, `payload.flag ? true : false`, `(payload.seq > 0.0 ? "y" : "n") == "y"`,
		`has(payload.seq) ? payload.seq > 10.0 : aggregate_type == "order"`, `payload == null`,
		`aggregate_type == "order" && payload.seq > 0.0`,
	}
	nativeStrings = []string{
		`aggregate_type + ":" + aggregate_id`, `has(payload.seq) ? string(int(payload.seq)) : ""`,
		`string(int(payload.seq))`, `payload.name`, `headers["tenant"]`, `row.region`, `string(schema_version)`,
		`has(payload.name) ? payload.name : "none"`, `string(aggregate_type)`, `headers.tenant + "/" + row["region"]`,
		`string(int(payload.big))`, `string(int(payload.seq * 100.0))`, `payload.flag ? "y" : "n"`,
	}
)

// A row of every kind the expressions treat apart, from r's choices.
func randomRow(r *rand.Rand) *Row {
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	row := &Row{
		MessageID: "m", AggregateType: pick("order", "payment", "", "Ωmega", "m"), AggregateID: pick("a-1", "test-9", "order", ""),
		EventType: pick("order.created", "payment.refunded", "x.deleted", "order"), Table: pick("public.outbox", "t"),
		SchemaVersion: r.IntN(3), Headers: map[string]string{}, PayloadValid: true,
	}
	if r.IntN(2) == 0 {
		row.Headers["tenant"] = pick("acme", "other", "")
	}
	if r.IntN(3) == 0 {
		row.Headers["x-partner"] = ""
	}
	if r.IntN(4) == 0 {
		row.Headers = nil
	}
	cols := map[string]string{}
	if r.IntN(2) == 0 {
		cols["region"] = pick("eu", "us")
	}
	if r.IntN(4) == 0 {
		cols["order"] = "x"
	}
	if r.IntN(2) == 0 {
		row.Columns = cols
	} else {
		row.ReadColumns = func() map[string]string { return cols }
	}
	value := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	fields := map[string]string{
		"seq":      value(`42`, `-0.5`, `0`, `1e300`, `9.3e18`, `-4.6e18`, `2.5`, `"7"`, `null`, `true`, `[1]`, `{"n": 1}`),
		"big":      value(`1e19`, `-1e19`, `4611686018427387904`, `3`),
		"name":     value(`"a"`, `"b"`, `"caf\u00e9"`, `"x\"y"`, `1`, `null`),
		"priority": value(`"high"`, `"low"`, `1`, `false`),
		"flag":     value(`true`, `false`, `"true"`, `0`),
		"a":        value(`{"b": "x"}`, `{"b": 1}`, `{}`, `[]`, `"b"`),
	}
	switch r.IntN(12) {
	case 0:
		row.Payload = []byte(pick(`[1]`, `null`, `"s"`, `3`, ``))
	case 1:
		row.Payload, row.PayloadValid = []byte(pick(`{"seq": 1`, `nope`, "{\"name\": \"\xff\"}")), false
	case 2:
		row.Payload = nil
	case 3:
		// A repeated field (the last counts, the same escaped or not), and
		// a field json.Unmarshal refuses beside those the expressions read.
		row.Payload = []byte(pick(`{"seq": 1, "s\u0065q": "x", "name": "a", "name": "b", "flag": true, "fl\u0061g": false}`,
			`{"priority": "high", "seq": 2.5, "other": [1e400]}`, `{"name": "a", "other": -1E+309}`))
	default:
		p := []byte("{")
		for name, v := range fields {
			if r.IntN(4) == 0 {
				continue // absent
			}
			if len(p) > 1 {
				p = append(p, ',')
			}
			p = fmt.Appendf(p, "%q: %s", name, v)
		}
		row.Payload = append(p, '}')
	}
	return row
}

// agree evaluates every expression on row natively (with CEL where the Go
// function does not answer) and in CEL only, and reports any difference.
// use is what a Set of the expressions would read of the payload.
func agree(t testing.TB, use payloadUse, bools, strs []*program, row *Row) {
	t.Helper()
	for _, p := range bools {
		got, gotErr := p.bool(&activation{r: row, use: &use})
		cel := *p
		cel.fastBool = nil
		want, wantErr := cel.bool(&activation{r: row, use: &use})
		if got != want || (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
			t.Errorf("%s on %+v payload %s: native %v (%v), CEL %v (%v)", p.rule, *row, row.Payload, got, gotErr, want, wantErr)
		}
	}
	for _, p := range strs {
		got, gotErr := p.string(&activation{r: row, use: &use})
		cel := *p
		cel.fastString = nil
		want, wantErr := cel.string(&activation{r: row, use: &use})
		if got != want || (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
			t.Errorf("%s on %+v payload %s: native %q (%v), CEL %q (%v)", p.rule, *row, row.Payload, got, gotErr, want, wantErr)
		}
	}
}

// nativeUse is what compileAll's expressions read of the payload: the
// whole payload, as some of them read it so. fieldsUse is what those that
// read only top-level fields (readsFields) read: a Set of only those
// decodes no more than the fields.
var (
	nativeUse, fieldsUse payloadUse
	readsFields          = map[*program]bool{}
)

// withFields are the programs of ps that read only payload fields.
func withFields(ps []*program) []*program {
	var out []*program
	for _, p := range ps {
		if readsFields[p] {
			out = append(out, p)
		}
	}
	return out
}

// compileAll compiles the expressions as a Set does, each with its Go
// function when it has one, and reports how many have one.
func compileAll(t testing.TB, exprs []string, want *cel.Type) (ps []*program, fast int) {
	t.Helper()
	env, err := newEnv()
	if err != nil {
		t.Fatal(err)
	}
	for _, expr := range exprs {
		ast, iss := env.Compile(expr)
		if iss.Err() != nil {
			t.Fatalf("%s: %v", expr, iss.Err())
		}
		nativeUse.add(ast)
		var own payloadUse
		if own.add(ast); !own.whole {
			fieldsUse.add(ast)
		}
		prg, err := env.Program(ast, cel.EvalOptions(cel.OptOptimize))
		if err != nil {
			t.Fatal(err)
		}
		p := &program{rule: expr, prg: prg}
		n := compileNative(ast.NativeRep().Expr())
		if want == cel.BoolType {
			p.fastBool = n.asBool()
		} else {
			p.fastString = n.asString()
		}
		if p.fastBool != nil || p.fastString != nil {
			fast++
		}
		readsFields[p] = !own.whole
		ps = append(ps, p)
	}
	return ps, fast
}

// TestNativeAgreesWithCEL: on rows of every kind, each expression gives
// natively the value or the error CEL gives, and the forms native.go
// claims do compile to Go.
func TestNativeAgreesWithCEL(t *testing.T) {
	bools, fastBools := compileAll(t, nativeBools, cel.BoolType)
	strs, fastStrs := compileAll(t, nativeStrings, cel.StringType)
	// What must have a Go function: everything but the forms that need
	// CEL's number conversions (== 42, > 0, == null, in with a payload
	// value).
	if want := len(nativeBools) - 5; fastBools != want {
		for _, p := range bools {
			t.Logf("%s: Go %v", p.rule, p.fastBool != nil)
		}
		t.Errorf("%d of %d bool expressions compiled to Go, want %d", fastBools, len(bools), want)
	}
	// All strings but the arithmetic one.
	if want := len(nativeStrings) - 1; fastStrs != want {
		t.Errorf("%d of %d string expressions compiled to Go, want %d", fastStrs, len(strs), want)
	}
	if !nativeUse.whole || fieldsUse.whole || len(withFields(bools)) == 0 || len(withFields(strs)) == 0 {
		t.Fatalf("whole %v, fields-only %v of %d and %d: want both ways of reading the payload", nativeUse.whole,
			fieldsUse.whole, len(withFields(bools)), len(withFields(strs)))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		row := randomRow(r)
		agree(t, nativeUse, bools, strs, row)
		agree(t, fieldsUse, withFields(bools), withFields(strs), row)
	}
}

// TestBenchRoutesAreNative: every expression of make bench's routes
// compiles to Go, so that the benchmark measures the path rules of its
// forms take.
func TestBenchRoutesAreNative(t *testing.T) {
	b, err := os.ReadFile("../../cmd/outboxrelay-bench/routes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c Config
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	s := mustCompile(t, c)
	for _, r := range s.routes {
		if r.when != nil && r.when.fastBool == nil {
			t.Errorf("%s has no Go function", r.when.rule)
		}
	}
	if s.tKey == nil || s.tKey.fastString == nil {
		t.Error("transform.key has no Go function")
	}
	for _, h := range s.tHeaders {
		if h.fastString == nil {
			t.Errorf("%s has no Go function", h.rule)
		}
	}
}

// FuzzNative: whatever a row's strings and payload hold, the Go functions
// and CEL agree.
func FuzzNative(f *testing.F) {
	f.Add("order", "a-1", "order.created", "acme", "eu", []byte(`{"seq": 42, "priority": "high", "a": {"b": "x"}}`), true)
	f.Add("", "", "", "", "", []byte(`{"seq": "1", "flag": 0, "big": 1e19}`), true)
	f.Add("payment", "test-", "x.deleted", "", "us", []byte(`[{"seq": 1}]`), false)
	bools, _ := compileAll(f, nativeBools, cel.BoolType)
	strs, _ := compileAll(f, nativeStrings, cel.StringType)
	f.Fuzz(func(t *testing.T, aggType, aggID, event, tenant, region string, payload []byte, valid bool) {
		row := &Row{AggregateType: aggType, AggregateID: aggID, EventType: event, Table: "public.outbox",
			Headers: map[string]string{"tenant": tenant}, Columns: map[string]string{"region": region}, Payload: payload,
			PayloadValid: valid && json.Valid(payload)}
		agree(t, nativeUse, bools, strs, row)
		agree(t, fieldsUse, withFields(bools), withFields(strs), row)
	})
}

// BenchmarkExpression prices one rule on a 1 KB row both ways: its Go
// function ("go") and CEL's interpreter ("cel").
func BenchmarkExpression(b *testing.B) {
	data := strings.Repeat("0123456789abcdef", 61)
	row := &Row{AggregateType: "order", AggregateID: "a17", EventType: "order.created", PayloadValid: true,
		Payload: []byte(`{"seq": 42, "data": "` + data + `"}`)}
	ps, fast := compileAll(b, []string{`aggregate_type == "order" && payload.seq > 0.0`}, cel.BoolType)
	if fast != 1 {
		b.Fatal("the expression has no Go function")
	}
	for _, path := range []string{"go", "cel"} {
		p := *ps[0]
		if path == "cel" {
			p.fastBool = nil
		}
		b.Run(path, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if ok, err := p.bool(&activation{r: row, use: &nativeUse}); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		})
	}
}
