package rules

import (
	"cmp"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	celast "cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"
)

// The forms routing rules mostly take (comparisons of the envelope's
// strings, header and column lookups, top-level payload fields, string
// concatenation) also compile to Go functions, which decide a row without
// CEL's interpreter (BenchmarkExpression prices both on one expression);
// ten routes and a transform run a dozen expressions per row.
//
// A Go function answers only when CEL's answer is certain: ok false (an
// absent key, a payload field of an unexpected type, a number out of
// range, anything that could be a CEL error or needs CEL's conversions)
// makes the caller evaluate the whole expression in CEL, which gives the
// value or the error it always did. An expression with a form not below
// has no Go function at all. TestNativeAgreesWithCEL and FuzzNative hold
// the two to the same answers.
type (
	boolFn func(*activation) (v, ok bool)
	strFn  func(*activation) (string, bool)
	intFn  func(*activation) (int64, bool)
	// floatFn is a double literal.
	floatFn func(*activation) (float64, bool)
	// dynFn gives a payload value as encoding/json decodes it: nil, bool,
	// float64, string, []any or map[string]any.
	dynFn func(*activation) (any, bool)
)

// native is an expression compiled to one of the function types above, or
// nothing.
type native struct {
	b boolFn
	s strFn
	i intFn
	f floatFn
	d dynFn
}

var stringVars = map[string]func(*Row) string{
	"message_id":     func(r *Row) string { return r.MessageID },
	"aggregate_type": func(r *Row) string { return r.AggregateType },
	"aggregate_id":   func(r *Row) string { return r.AggregateID },
	"event_type":     func(r *Row) string { return r.EventType },
	"table":          func(r *Row) string { return r.Table },
}

// stringMaps are the variables of type map(string, string).
var stringMaps = map[string]func(*activation) map[string]string{
	"headers": func(a *activation) map[string]string { return a.r.Headers },
	"row":     (*activation).columns,
}

// compileNative compiles e, or gives the zero native when some part of it
// has no Go form.
func compileNative(e celast.Expr) native {
	switch e.Kind() {
	case celast.LiteralKind:
		switch v := e.AsLiteral().(type) {
		case types.Bool:
			b := bool(v)
			return native{b: func(*activation) (bool, bool) { return b, true }}
		case types.String:
			s := string(v)
			return native{s: func(*activation) (string, bool) { return s, true }}
		case types.Int:
			i := int64(v)
			return native{i: func(*activation) (int64, bool) { return i, true }}
		case types.Double:
			f := float64(v)
			return native{f: func(*activation) (float64, bool) { return f, true }}
		}
	case celast.IdentKind:
		name := e.AsIdent()
		if get, ok := stringVars[name]; ok {
			return native{s: func(a *activation) (string, bool) { return get(a.r), true }}
		}
		switch name {
		case "schema_version":
			return native{i: func(a *activation) (int64, bool) { return int64(a.r.SchemaVersion), true }}
		case "payload":
			return native{d: func(a *activation) (any, bool) {
				v, err := a.payloadValue()
				return v, err == nil
			}}
		}
	case celast.SelectKind:
		return compileSelect(e.AsSelect())
	case celast.CallKind:
		return compileCall(e.AsCall())
	}
	return native{}
}

// mapOperand is the string map variable e names, if it names one.
func mapOperand(e celast.Expr) func(*activation) map[string]string {
	if e.Kind() != celast.IdentKind {
		return nil
	}
	return stringMaps[e.AsIdent()]
}

func compileSelect(sel celast.SelectExpr) native {
	field := sel.FieldName()
	if m := mapOperand(sel.Operand()); m != nil {
		if sel.IsTestOnly() {
			return native{b: func(a *activation) (bool, bool) {
				_, ok := m(a)[field]
				return ok, true
			}}
		}
		return native{s: func(a *activation) (string, bool) {
			v, ok := m(a)[field]
			return v, ok
		}}
	}
	if op := sel.Operand(); op.Kind() == celast.IdentKind && op.AsIdent() == "payload" {
		// A top-level field, read without the payload's map.
		if sel.IsTestOnly() {
			return native{b: func(a *activation) (bool, bool) {
				if _, ok := a.payloadField(field); ok {
					return true, true
				}
				// Absent from an object, or no object (a CEL error).
				return false, a.payloadIsObject()
			}}
		}
		return native{d: func(a *activation) (any, bool) { return a.payloadField(field) }}
	}
	obj := compileNative(sel.Operand()).d
	if obj == nil {
		return native{}
	}
	// A field of a nested object; anything but an object is CEL's error.
	object := holds[map[string]any](obj)
	if sel.IsTestOnly() {
		return native{b: func(a *activation) (bool, bool) {
			m, ok := object(a)
			_, has := m[field]
			return has, ok
		}}
	}
	return native{d: func(a *activation) (any, bool) {
		m, ok := object(a)
		f, has := m[field]
		return f, ok && has
	}}
}

// asString is n as a string function: a string, or a payload value that
// holds a string.
func (n native) asString() strFn {
	if n.s != nil {
		return n.s
	}
	if n.d != nil {
		return holds[string](n.d)
	}
	return nil
}

// asBool is n as a bool function: a bool, or a payload value that holds
// one.
func (n native) asBool() boolFn {
	if n.b != nil {
		return n.b
	}
	if n.d != nil {
		return holds[bool](n.d)
	}
	return nil
}

func compileCall(call celast.CallExpr) native {
	args := call.Args()
	if call.IsMemberFunction() {
		if len(args) != 1 {
			return native{}
		}
		return compileMember(call.FunctionName(), compileNative(call.Target()).asString(), args[0])
	}
	switch fn := call.FunctionName(); fn {
	case operators.LogicalAnd, operators.LogicalOr:
		l, r := compileNative(args[0]).asBool(), compileNative(args[1]).asBool()
		if l == nil || r == nil {
			return native{}
		}
		// CEL's && and || are commutative over errors (false && error is
		// false): a left side that decides the result decides it here; any
		// other unknown goes back to CEL.
		stop := fn == operators.LogicalOr
		return native{b: func(a *activation) (bool, bool) {
			if v, ok := l(a); ok && v == stop {
				return stop, true
			} else if !ok {
				return false, false
			}
			return r(a)
		}}
	case operators.LogicalNot:
		x := compileNative(args[0]).asBool()
		if x == nil {
			return native{}
		}
		return native{b: func(a *activation) (bool, bool) {
			v, ok := x(a)
			return !v, ok
		}}
	case operators.Conditional:
		return compileConditional(args)
	case operators.Equals, operators.NotEquals:
		eq := compileEquals(compileNative(args[0]), compileNative(args[1]))
		if eq == nil {
			return native{}
		}
		if fn == operators.NotEquals {
			return native{b: func(a *activation) (bool, bool) {
				v, ok := eq(a)
				return !v, ok
			}}
		}
		return native{b: eq}
	case operators.Less, operators.LessEquals, operators.Greater, operators.GreaterEquals:
		return native{b: compileOrder(fn, compileNative(args[0]), compileNative(args[1]))}
	case operators.Add:
		l, r := compileNative(args[0]).s, compileNative(args[1]).s
		if l == nil || r == nil {
			return native{}
		}
		return native{s: func(a *activation) (string, bool) {
			x, ok := l(a)
			if !ok {
				return "", false
			}
			y, ok := r(a)
			return x + y, ok
		}}
	case operators.Index:
		m := mapOperand(args[0])
		key := compileNative(args[1]).s
		if m == nil || key == nil {
			return native{}
		}
		return native{s: func(a *activation) (string, bool) {
			k, ok := key(a)
			if !ok {
				return "", false
			}
			v, ok := m(a)[k]
			return v, ok
		}}
	case operators.In:
		return native{b: compileIn(args)}
	case overloads.TypeConvertString:
		x := compileNative(args[0])
		switch {
		case x.s != nil:
			return native{s: x.s}
		case x.i != nil:
			return native{s: func(a *activation) (string, bool) {
				v, ok := x.i(a)
				return strconv.FormatInt(v, 10), ok
			}}
		}
	case overloads.TypeConvertInt:
		x := compileNative(args[0])
		switch {
		case x.i != nil:
			return native{i: x.i}
		case x.d != nil:
			return native{i: func(a *activation) (int64, bool) {
				v, ok := x.d(a)
				f, isNumber := v.(float64)
				// CEL truncates a double toward zero, as Go does, and fails
				// on one outside int's range; what is near that edge goes to
				// CEL.
				if !ok || !isNumber || math.IsNaN(f) || math.Abs(f) >= 1<<62 {
					return 0, false
				}
				return int64(f), true
			}}
		}
	}
	return native{}
}

func compileMember(fn string, target strFn, arg celast.Expr) native {
	if target == nil {
		return native{}
	}
	var test func(s, x string) bool
	switch fn {
	case overloads.StartsWith:
		test = strings.HasPrefix
	case overloads.EndsWith:
		test = strings.HasSuffix
	case overloads.Contains:
		test = strings.Contains
	case overloads.Matches:
		if arg.Kind() != celast.LiteralKind {
			return native{}
		}
		pattern, ok := arg.AsLiteral().(types.String)
		if !ok {
			return native{}
		}
		re, err := regexp.Compile(string(pattern))
		if err != nil {
			return native{} // CEL reports the pattern's error
		}
		return native{b: func(a *activation) (bool, bool) {
			s, ok := target(a)
			return ok && re.MatchString(s), ok
		}}
	default:
		return native{}
	}
	x := compileNative(arg).s
	if x == nil {
		return native{}
	}
	return native{b: func(a *activation) (bool, bool) {
		s, ok := target(a)
		if !ok {
			return false, false
		}
		y, ok := x(a)
		return ok && test(s, y), ok
	}}
}

func compileConditional(args []celast.Expr) native {
	c := compileNative(args[0]).asBool()
	t, f := compileNative(args[1]), compileNative(args[2])
	if c == nil {
		return native{}
	}
	switch {
	case t.b != nil && f.b != nil:
		return native{b: choose(c, t.b, f.b)}
	case t.s != nil || f.s != nil:
		// A payload value in the other branch answers only when it holds a
		// string: the two may differ in type, which only CEL's values carry.
		if ts, fs := t.asString(), f.asString(); ts != nil && fs != nil {
			return native{s: choose(c, ts, fs)}
		}
	}
	return native{}
}

// choose compiles c ? t : f, which evaluates only the branch c picks.
func choose[T any](c boolFn, t, f func(*activation) (T, bool)) func(*activation) (T, bool) {
	return func(a *activation) (T, bool) {
		then, ok := c(a)
		switch {
		case !ok:
			var zero T
			return zero, false
		case then:
			return t(a)
		}
		return f(a)
	}
}

// compileEquals compiles l == r for two strings, two ints, two bools, or a
// payload value against a literal-like value of a known type; a payload
// value of any other type goes to CEL (its heterogeneous equality).
func compileEquals(l, r native) boolFn {
	switch {
	case l.s != nil && r.s != nil:
		return equal(l.s, r.s)
	case l.i != nil && r.i != nil:
		return equal(l.i, r.i)
	case l.b != nil && r.b != nil:
		return equal(l.b, r.b)
	case l.d != nil && r.d == nil:
		return dynEquals(l.d, r)
	case r.d != nil && l.d == nil:
		return dynEquals(r.d, l)
	}
	return nil
}

// dynEquals compiles d == x for a payload value d: answered when d holds
// x's type (a string against a string, a bool against a bool).
func dynEquals(d dynFn, x native) boolFn {
	switch {
	case x.s != nil:
		return equal(holds[string](d), x.s)
	case x.f != nil:
		return equal(holds[float64](d), x.f)
	case x.b != nil:
		return equal(holds[bool](d), x.b)
	}
	return nil
}

// equal compiles l == r, l evaluated first.
func equal[T comparable](l, r func(*activation) (T, bool)) boolFn {
	return func(a *activation) (bool, bool) {
		x, ok := l(a)
		if !ok {
			return false, false
		}
		y, ok := r(a)
		return x == y, ok
	}
}

// holds is the payload value d as a T: answered when it holds one.
func holds[T any](d dynFn) func(*activation) (T, bool) {
	return func(a *activation) (T, bool) {
		v, ok := d(a)
		t, isT := v.(T)
		return t, ok && isT
	}
}

// compileOrder compiles <, <=, > and >= of two strings, two ints, or a
// payload number against a double literal.
func compileOrder(fn string, l, r native) boolFn {
	var c func(*activation) (int, bool)
	switch {
	case l.s != nil && r.s != nil:
		c = compare(l.s, r.s)
	case l.i != nil && r.i != nil:
		c = compare(l.i, r.i)
	default:
		ld, lok := doubleOperand(l)
		rd, rok := doubleOperand(r)
		if !lok || !rok || (l.d == nil && r.d == nil) {
			return nil
		}
		c = compare(ld, rd)
	}
	var want func(int) bool
	switch fn {
	case operators.Less:
		want = func(c int) bool { return c < 0 }
	case operators.LessEquals:
		want = func(c int) bool { return c <= 0 }
	case operators.Greater:
		want = func(c int) bool { return c > 0 }
	default:
		want = func(c int) bool { return c >= 0 }
	}
	return func(a *activation) (bool, bool) {
		v, ok := c(a)
		return ok && want(v), ok
	}
}

// compare compiles the order of l and r, l evaluated first; a NaN is left
// to CEL.
func compare[T cmp.Ordered](l, r func(*activation) (T, bool)) func(*activation) (int, bool) {
	return func(a *activation) (int, bool) {
		x, ok := l(a)
		if !ok {
			return 0, false
		}
		y, ok := r(a)
		if !ok || x != x || y != y {
			return 0, false
		}
		return cmp.Compare(x, y), true
	}
}

// doubleOperand is a double literal, or a payload value that must hold a
// number.
func doubleOperand(n native) (floatFn, bool) {
	if n.f != nil {
		return n.f, true
	}
	if n.d == nil {
		return nil, false
	}
	return holds[float64](n.d), true
}

// compileIn compiles x in [literal strings] and key in headers or row.
func compileIn(args []celast.Expr) boolFn {
	x := compileNative(args[0]).s
	if x == nil {
		return nil
	}
	if m := mapOperand(args[1]); m != nil {
		return func(a *activation) (bool, bool) {
			k, ok := x(a)
			if !ok {
				return false, false
			}
			_, has := m(a)[k]
			return has, true
		}
	}
	if args[1].Kind() != celast.ListKind || len(args[1].AsList().OptionalIndices()) > 0 {
		return nil
	}
	var set []string
	for _, e := range args[1].AsList().Elements() {
		if e.Kind() != celast.LiteralKind {
			return nil
		}
		s, ok := e.AsLiteral().(types.String)
		if !ok {
			return nil
		}
		set = append(set, string(s))
	}
	return func(a *activation) (bool, bool) {
		k, ok := x(a)
		return ok && slices.Contains(set, k), ok
	}
}
