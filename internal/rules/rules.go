// Package rules compiles and runs the routing rules of issue 31: an ordered
// list of routes, each with a CEL condition (cel.dev/cel-go) and what a
// matching row becomes (a destination template, a key, headers, a format),
// a policy for the rows no route matches, and transform expressions that
// set headers, the key and payload fields.
//
// Every expression is compiled and type-checked by Compile, so that a typo
// is one error at configuration load naming the rule and the position,
// never a failure on the first row. An expression sees the envelope fields
// (message_id, aggregate_type, aggregate_id, event_type, schema_version,
// table, headers, payload) and the row's columns as row, a map from column
// name to the column's text (a NULL column is absent).
//
// A Set is immutable and safe for concurrent use.
package rules

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/interpreter"
	"google.golang.org/protobuf/types/known/structpb"
)

var jsonValue = reflect.TypeOf(&structpb.Value{})

// Route is one entry of the routes list.
type Route struct {
	// Name names the route in errors, metrics and the dry run; default
	// route-<index>.
	Name string `yaml:"name"`
	// When is a CEL expression of type bool; empty matches every row.
	When string `yaml:"when"`
	// Destination is the destination template the sink renders (topic,
	// routing key, subject, stream); empty keeps the sink's own.
	Destination string `yaml:"destination"`
	// Key is a CEL expression of type string: the record key; empty keeps
	// the key the row has.
	Key string `yaml:"key"`
	// Headers are header names to CEL expressions of type string, added to
	// the message.
	Headers map[string]string `yaml:"headers"`
	// Format overrides envelope.format for the route's messages.
	Format string `yaml:"format"`
	// Continue: a row this route matches is also tried against the routes
	// after it, instead of the first match winning.
	Continue bool `yaml:"continue"`
	// Sink names the sink (a key of the file's sinks section) the route's
	// messages go to; empty is the first sink listed, or the one sink.
	Sink string `yaml:"sink"`
}

// Transform sets headers, the key and top-level payload fields of every
// routed message, before the routes' own key and headers.
type Transform struct {
	Key     string            `yaml:"key"`
	Headers map[string]string `yaml:"headers"`
	// Payload maps a top-level field of a JSON object payload to a CEL
	// expression whose value the field gets.
	Payload map[string]string `yaml:"payload"`
}

// Config is the routing configuration.
type Config struct {
	Routes []Route `yaml:"routes"`
	// Unmatched is what becomes of a row no route matches: UnmatchedDeadLetter
	// (the default), UnmatchedDrop, or the name of a route whose settings it
	// gets (a default route; its when is not evaluated).
	Unmatched string    `yaml:"unmatched"`
	Transform Transform `yaml:"transform"`
}

// Docs describes Config's keys for the configuration reference.
func (Config) Docs() map[string]string {
	return map[string]string{
		"routes":            "ordered routing rules: `name`, `when` (CEL, bool), `destination` (template; empty keeps the sink's), `key` and `headers` (CEL, string), `format`, `continue`, `sink` (a name from `sinks`; empty: the first one); the first match wins unless it says `continue` (see Routing)",
		"unmatched":         "a row no route matches: `deadletter` (empty means it), `drop` (counted in `outboxrelay_messages_filtered_total`), or the name of the route that takes it",
		"transform.key":     "CEL (string): the record key of every routed row, before the route's own",
		"transform.headers": "header names to CEL (string) expressions, added to every routed row",
		"transform.payload": "top-level payload fields to CEL expressions whose value they get (checked against `relay.schemas` when set)",
	}
}

// The policies of Config.Unmatched besides a route name.
const (
	UnmatchedDeadLetter = "deadletter"
	UnmatchedDrop       = "drop"
)

// Row is what the expressions of a Set see of one outbox row.
type Row struct {
	MessageID, AggregateType, AggregateID, EventType, Table string
	SchemaVersion                                           int
	Headers                                                 map[string]string
	// Payload is the payload's JSON text; nil is JSON null.
	Payload []byte
	// PayloadValid says Payload is known to be valid JSON (PostgreSQL's
	// json and jsonb columns): what only the expressions' fields are
	// decoded of is then not checked whole again.
	PayloadValid bool
	// Columns are the row's columns as text, without its NULL ones.
	Columns map[string]string
	// ReadColumns, when Columns is nil and ReadColumns is not, makes the
	// columns the first time an expression reads row, at most once.
	ReadColumns func() map[string]string
	// Key is the row's record key before the rules; empty means
	// AggregateID.
	Key string
}

// Match is one route a row took and what it made of the row.
type Match struct {
	Route string
	// Sink is the route's sink name; empty is the first (or only) sink.
	Sink        string
	Destination string
	Key         string
	// Headers are the transform's and the route's, sorted by name; a
	// route's header replaces the transform's of the same name.
	Headers []Header
	Format  string
}

// A Header is one header a Match adds to its message.
type Header struct{ Name, Value string }

// Header is the value of the header m adds under name.
func (m Match) Header(name string) (string, bool) {
	for _, h := range m.Headers {
		if h.Name == name {
			return h.Value, true
		}
	}
	return "", false
}

// setHeader sets name's header in hs, which stays sorted by name.
func setHeader(hs []Header, name, value string) []Header {
	i, found := slices.BinarySearchFunc(hs, name, func(h Header, name string) int { return strings.Compare(h.Name, name) })
	if found {
		hs[i].Value = value
		return hs
	}
	return slices.Insert(hs, i, Header{Name: name, Value: value})
}

// Decision is what a Set made of a row.
type Decision struct {
	// Matches are the routes the row took, in order; empty when it
	// matched none.
	Matches []Match
	// Dropped: no route matched and Unmatched is drop.
	Dropped bool
	// Payload is the transformed payload JSON, or nil when the transform
	// sets no payload field.
	Payload []byte
	// headers holds the transform's headers, for DecideTo to reuse.
	headers []Header
}

// ErrUnmatched is wrapped by Decide's error for a row no route matches
// when Unmatched is deadletter: the row is dead-lettered with it.
var ErrUnmatched = errors.New("no route matches the row and unmatched is deadletter")

// A RuleError is a rule that fails, at Compile or on a row.
type RuleError struct {
	// Rule is the rule's place in the configuration: routes[1] (orders).when.
	Rule string
	Err  error
}

func (e *RuleError) Error() string { return fmt.Sprintf("rule %s: %v", e.Rule, e.Err) }
func (e *RuleError) Unwrap() error { return e.Err }

type program struct {
	rule string
	prg  cel.Program
	// fastBool or fastString, when set, is the expression in Go
	// (native.go), which answers for most rows without CEL.
	fastBool   boolFn
	fastString strFn
}

type headerProgram struct {
	name string
	program
}

type compiledRoute struct {
	name, destination, format, sink string
	when, key                       *program
	headers                         []headerProgram
	cont                            bool
}

// Set is a compiled Config.
type Set struct {
	routes    []compiledRoute
	unmatched string
	fallback  *compiledRoute
	tKey      *program
	tHeaders  []headerProgram
	tPayload  []headerProgram
	// payload is what the expressions read of the payload.
	payload payloadUse
}

func newEnv() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable("message_id", cel.StringType),
		cel.Variable("aggregate_type", cel.StringType),
		cel.Variable("aggregate_id", cel.StringType),
		cel.Variable("event_type", cel.StringType),
		cel.Variable("table", cel.StringType),
		cel.Variable("schema_version", cel.IntType),
		cel.Variable("headers", cel.MapType(cel.StringType, cel.StringType)),
		cel.Variable("row", cel.MapType(cel.StringType, cel.StringType)),
		cel.Variable("payload", cel.DynType),
	)
}

// Compile compiles and type-checks every expression of c. Its error lists
// every problem, each naming its rule (routes[i] (name).when, say) and,
// for an expression, the line and column CEL reports.
func Compile(c Config) (*Set, error) {
	env, err := newEnv()
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	var errs []error
	var payload payloadUse
	compile := func(rule, expr string, want *cel.Type) *program {
		if strings.TrimSpace(expr) == "" {
			if want == cel.BoolType {
				return nil
			}
			errs = append(errs, &RuleError{Rule: rule, Err: errors.New("is empty")})
			return nil
		}
		ast, iss := env.CompileSource(common.NewStringSource(expr, rule))
		if iss.Err() != nil {
			errs = append(errs, &RuleError{Rule: rule, Err: iss.Err()})
			return nil
		}
		if t := ast.OutputType(); want != nil && !t.IsExactType(want) && !t.IsExactType(cel.DynType) {
			errs = append(errs, &RuleError{Rule: rule, Err: fmt.Errorf("%q is of type %s, want %s", expr, t, want)})
			return nil
		}
		payload.add(ast)
		prg, err := env.Program(ast, cel.EvalOptions(cel.OptOptimize))
		if err != nil {
			errs = append(errs, &RuleError{Rule: rule, Err: err})
			return nil
		}
		p := &program{rule: rule, prg: prg}
		switch fast := compileNative(ast.NativeRep().Expr()); want {
		case cel.BoolType:
			p.fastBool = fast.asBool()
		case cel.StringType:
			p.fastString = fast.asString()
		}
		return p
	}
	headers := func(prefix string, hs map[string]string, want *cel.Type) []headerProgram {
		var out []headerProgram
		for _, name := range slices.Sorted(maps.Keys(hs)) {
			if name == "" {
				errs = append(errs, &RuleError{Rule: prefix, Err: errors.New("has an empty name")})
				continue
			}
			if p := compile(prefix+"."+name, hs[name], want); p != nil {
				out = append(out, headerProgram{name: name, program: *p})
			}
		}
		return out
	}
	s := &Set{unmatched: c.Unmatched}
	if s.unmatched == "" {
		s.unmatched = UnmatchedDeadLetter
	}
	names := map[string]bool{}
	for i, r := range c.Routes {
		name := r.Name
		if name == "" {
			name = fmt.Sprintf("route-%d", i)
		}
		if names[name] {
			errs = append(errs, fmt.Errorf("routes[%d]: the name %q is used by an earlier route", i, name))
		}
		names[name] = true
		at := fmt.Sprintf("routes[%d] (%s)", i, name)
		cr := compiledRoute{name: name, destination: r.Destination, format: r.Format, sink: r.Sink, cont: r.Continue,
			when: compile(at+".when", r.When, cel.BoolType)}
		if r.Key != "" {
			cr.key = compile(at+".key", r.Key, cel.StringType)
		}
		cr.headers = headers(at+".headers", r.Headers, cel.StringType)
		s.routes = append(s.routes, cr)
	}
	switch s.unmatched {
	case UnmatchedDeadLetter, UnmatchedDrop:
	default:
		i := slices.IndexFunc(s.routes, func(r compiledRoute) bool { return r.name == s.unmatched })
		if i < 0 {
			errs = append(errs, fmt.Errorf("unmatched %q is not deadletter, drop or the name of a route", c.Unmatched))
		} else {
			s.fallback = &s.routes[i]
		}
	}
	if c.Transform.Key != "" {
		s.tKey = compile("transform.key", c.Transform.Key, cel.StringType)
	}
	s.tHeaders = headers("transform.headers", c.Transform.Headers, cel.StringType)
	s.tPayload = headers("transform.payload", c.Transform.Payload, nil)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	s.payload = payload
	// transform.payload decodes the whole payload anyway.
	s.payload.whole = s.payload.whole || len(s.tPayload) > 0
	return s, nil
}

// activation is the variables of one row, as every expression the row is
// run through reads them: a variable is made a CEL value only when an
// expression reads it, and the payload is parsed at most once per row
// (CEL's own lazy bindings of a map would parse it again in every
// expression that reads it).
type activation struct {
	r   *Row
	use *payloadUse
	// colsMap are the row's columns once an expression read them, and cols
	// the same as a CEL value once CEL read them.
	colsMap  map[string]string
	colsRead bool
	cols     ref.Val
	// value is the payload as the expressions see it (the fields they read
	// of a JSON object, or the whole payload), once one read it; payload
	// is the same as a CEL value once CEL read it.
	value     any
	valueErr  error
	valueRead bool
	payload   ref.Val
	// fields are the payload fields the expressions read, once read, when
	// they read only fields of a JSON object payload (fieldsOK); fieldBuf
	// holds the first few.
	fields     []field
	fieldsRead bool
	fieldsOK   bool
	fieldBuf   [4]field
	// obj is the payload decoded whole, for transformPayload; decoded
	// tells it apart from JSON null.
	obj     any
	decoded bool
	err     error
}

// columns are the row's columns, made at most once.
func (a *activation) columns() map[string]string {
	if !a.colsRead {
		a.colsRead = true
		a.colsMap = a.r.Columns
		if a.colsMap == nil && a.r.ReadColumns != nil {
			a.colsMap = a.r.ReadColumns()
		}
	}
	return a.colsMap
}

// payloadValue is the payload as the expressions see it, decoded at most
// once: only the top-level fields they read when they read no more of a
// JSON object payload, else the whole payload.
func (a *activation) payloadValue() (any, error) {
	if !a.valueRead {
		a.valueRead = true
		if a.readFields() {
			a.value = fieldMap(a.fields)
		} else {
			a.value, a.valueErr = a.parsed()
		}
	}
	return a.value, a.valueErr
}

// readFields reads the payload fields the expressions read, once, and
// says whether they are all the expressions read of it.
func (a *activation) readFields() bool {
	if !a.fieldsRead {
		a.fieldsRead = true
		if !a.use.whole {
			a.fields, a.fieldsOK = readFields(a.fieldBuf[:0], a.r.Payload, a.use.fields, a.r.PayloadValid)
		}
	}
	return a.fieldsOK
}

// payloadField is the top-level field name of the payload, when the
// payload is a JSON object that has it.
func (a *activation) payloadField(name string) (any, bool) {
	if a.readFields() {
		return lookup(a.fields, name)
	}
	v, err := a.payloadValue()
	obj, ok := v.(map[string]any)
	if err != nil || !ok {
		return nil, false
	}
	f, ok := obj[name]
	return f, ok
}

// stringMap is m as a CEL map; nil is the empty map.
func stringMap(m map[string]string) ref.Val {
	if m == nil {
		m = map[string]string{}
	}
	return types.NewStringStringMap(types.DefaultTypeAdapter, m)
}

func (a *activation) ResolveName(name string) (any, bool) {
	r := a.r
	switch name {
	case "message_id":
		return types.String(r.MessageID), true
	case "aggregate_type":
		return types.String(r.AggregateType), true
	case "aggregate_id":
		return types.String(r.AggregateID), true
	case "event_type":
		return types.String(r.EventType), true
	case "table":
		return types.String(r.Table), true
	case "schema_version":
		return types.Int(r.SchemaVersion), true
	case "headers":
		return stringMap(r.Headers), true
	case "row":
		if a.cols == nil {
			a.cols = stringMap(a.columns())
		}
		return a.cols, true
	case "payload":
		if a.payload == nil {
			if v, err := a.payloadValue(); err != nil {
				a.payload = types.NewErr("payload is not JSON: %v", err)
			} else {
				a.payload = types.DefaultTypeAdapter.NativeToValue(v)
			}
		}
		return a.payload, true
	}
	return nil, false
}

func (a *activation) Parent() interpreter.Activation { return nil }

// parsed is the payload decoded from JSON, once per row; an empty payload
// is JSON null. The value is shared by every expression: nothing may
// change it.
func (a *activation) parsed() (any, error) {
	if !a.decoded {
		a.decoded = true
		if len(a.r.Payload) > 0 {
			a.err = json.Unmarshal(a.r.Payload, &a.obj)
		}
	}
	return a.obj, a.err
}

func (p *program) eval(vars *activation) (ref.Val, error) {
	out, _, err := p.prg.Eval(vars)
	if err != nil {
		return nil, &RuleError{Rule: p.rule, Err: err}
	}
	return out, nil
}

func (p *program) bool(vars *activation) (bool, error) {
	if p.fastBool != nil {
		if v, ok := p.fastBool(vars); ok {
			return v, nil
		}
	}
	out, err := p.eval(vars)
	if err != nil {
		return false, err
	}
	b, ok := out.Value().(bool)
	if !ok {
		return false, &RuleError{Rule: p.rule, Err: fmt.Errorf("gave %s, not a bool", out.Type().TypeName())}
	}
	return b, nil
}

func (p *program) string(vars *activation) (string, error) {
	if p.fastString != nil {
		if v, ok := p.fastString(vars); ok {
			return v, nil
		}
	}
	out, err := p.eval(vars)
	if err != nil {
		return "", err
	}
	s, ok := out.Value().(string)
	if !ok {
		return "", &RuleError{Rule: p.rule, Err: fmt.Errorf("gave %s, not a string", out.Type().TypeName())}
	}
	return s, nil
}

func setHeaders(dst []Header, hs []headerProgram, vars *activation) ([]Header, error) {
	for _, h := range hs {
		v, err := h.string(vars)
		if err != nil {
			return dst, err
		}
		dst = setHeader(dst, h.name, v)
	}
	return dst, nil
}

// Decide runs the rules on r. An error (a *RuleError, or ErrUnmatched
// wrapped) means the row is dead-lettered with it; the Set stays usable
// for the next row.
func (s *Set) Decide(r *Row) (Decision, error) {
	var d Decision
	err := s.DecideTo(&d, r)
	return d, err
}

// DecideTo is Decide into d, reusing the memory of d's matches and
// headers: what an earlier call left in d is overwritten. A caller that
// decides row after row and is done with each decision before the next
// allocates no new matches. On an error d holds no match.
func (s *Set) DecideTo(d *Decision, r *Row) error {
	*d = Decision{Matches: d.Matches[:0], headers: d.headers[:0]}
	if err := s.decide(d, r); err != nil {
		*d = Decision{Matches: d.Matches[:0], headers: d.headers[:0]}
		return err
	}
	return nil
}

func (s *Set) decide(d *Decision, r *Row) error {
	vars := activations.Get().(*activation)
	*vars = activation{r: r, use: &s.payload}
	defer func() {
		*vars = activation{} // hold nothing of the row
		activations.Put(vars)
	}()
	base := Match{Key: cmp.Or(r.Key, r.AggregateID)}
	if s.tKey != nil {
		k, err := s.tKey.string(vars)
		if err != nil {
			return err
		}
		base.Key = k
	}
	var err error
	if base.Headers, err = setHeaders(d.headers, s.tHeaders, vars); err != nil {
		return err
	}
	d.headers = base.Headers
	if len(s.tPayload) > 0 {
		p, err := s.transformPayload(vars)
		if err != nil {
			return err
		}
		d.Payload = p
	}
	for i := range s.routes {
		cr := &s.routes[i]
		if cr.when != nil {
			ok, err := cr.when.bool(vars)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
		}
		if err := d.take(cr, base, vars); err != nil {
			return err
		}
		if !cr.cont {
			break
		}
	}
	if len(d.Matches) > 0 {
		return nil
	}
	switch {
	case s.fallback != nil:
		return d.take(s.fallback, base, vars)
	case s.unmatched == UnmatchedDrop:
		d.Dropped = true
		return nil
	}
	return fmt.Errorf("%w (%d routes)", ErrUnmatched, len(s.routes))
}

// activations are Decide's, reused: a row's variables are garbage once
// Decide returns.
var activations = sync.Pool{New: func() any { return new(activation) }}

// take adds route cr's match to d, from base, what the transform made.
func (d *Decision) take(cr *compiledRoute, base Match, vars *activation) error {
	m := Match{Route: cr.name, Sink: cr.sink, Destination: cr.destination, Format: cr.format, Key: base.Key, Headers: base.Headers}
	if cr.key != nil {
		k, err := cr.key.string(vars)
		if err != nil {
			return err
		}
		m.Key = k
	}
	if len(cr.headers) > 0 {
		var err error
		if m.Headers, err = setHeaders(slices.Clone(base.Headers), cr.headers, vars); err != nil {
			return err
		}
	}
	d.Matches = append(d.Matches, m)
	return nil
}

// transformPayload sets the transform's payload fields in a JSON object
// payload.
func (s *Set) transformPayload(vars *activation) ([]byte, error) {
	v, err := vars.parsed()
	parsed, ok := v.(map[string]any)
	if err != nil || !ok {
		return nil, &RuleError{Rule: "transform.payload", Err: errors.New("the payload is not a JSON object")}
	}
	// The parsed payload is what the expressions read: the fields are set
	// in a copy of its top level.
	obj := maps.Clone(parsed)
	for _, f := range s.tPayload {
		out, err := f.eval(vars)
		if err != nil {
			return nil, err
		}
		v, err := out.ConvertToNative(jsonValue)
		if err != nil {
			return nil, &RuleError{Rule: f.rule, Err: fmt.Errorf("gave a value JSON cannot hold: %w", err)}
		}
		obj[f.name] = v.(*structpb.Value).AsInterface()
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, &RuleError{Rule: "transform.payload", Err: err}
	}
	return b, nil
}

// payloadIsObject says whether the payload is a JSON object.
func (a *activation) payloadIsObject() bool {
	if a.readFields() {
		return true
	}
	v, err := a.payloadValue()
	_, ok := v.(map[string]any)
	return err == nil && ok
}
