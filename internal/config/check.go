package config

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/outboxrelay/outboxrelay/sinks"
)

// checkDocument walks the YAML document against the configuration's keys
// before it is decoded, so that a key or value the decoder would reject is
// reported by its YAML path and line ("line 3: postgres.status_interval:
// "5x" is not a duration such as 10s or 1m30s"), never by the Go type it
// would have been decoded into.
func checkDocument(data []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return err // a syntax error: yaml names the line, and no type
	}
	if len(doc.Content) == 0 {
		return nil
	}
	return checkValue(doc.Content[0], reflect.TypeOf(Config{}), "")
}

var (
	sinkType     = reflect.TypeOf(Sink{})
	durationType = reflect.TypeOf(time.Duration(0))
)

func checkValue(n *yaml.Node, t reflect.Type, path string) error {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil // leaves the default
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == sinkType:
		return checkSink(n, path)
	case t == sinksType:
		return checkSinks(n, path)
	case isSection(t):
		return checkSection(n, t, path, keysOf(t))
	case t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Uint8:
		if n.Kind != yaml.SequenceNode {
			return valueError(n, path, "must be a list such as [a, b], not %s", describe(n))
		}
		var errs []error
		for i, item := range n.Content {
			errs = append(errs, checkValue(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)))
		}
		return errors.Join(errs...)
	case t.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			return valueError(n, path, "must be a mapping of keys to values, not %s", describe(n))
		}
		var errs []error
		for i := 0; i+1 < len(n.Content); i += 2 {
			errs = append(errs, checkValue(n.Content[i+1], t.Elem(), joinPath(path, n.Content[i].Value)))
		}
		return errors.Join(errs...)
	}
	if n.Kind != yaml.ScalarNode {
		return valueError(n, path, "must be %s, not %s", want(t), describe(n))
	}
	if err := n.Decode(reflect.New(t).Interface()); err != nil {
		return valueError(n, path, "%q is not %s", n.Value, want(t))
	}
	return nil
}

// checkSection checks the mapping n of a section whose keys are keys.
func checkSection(n *yaml.Node, t reflect.Type, path string, keys []string) error {
	if n.Kind != yaml.MappingNode {
		what := "the configuration"
		if path != "" {
			what = path
		}
		return fmt.Errorf("line %d: %s must be a mapping of keys (%s), not %s", n.Line, what, strings.Join(keys, ", "), describe(n))
	}
	var errs []error
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Tag == "!!merge" { // <<: *defaults merges a mapping (or a list of them) into this one
			errs = append(errs, checkMerge(v, t, path, keys))
			continue
		}
		f, ok := fieldByKey(t, k.Value)
		if !ok {
			errs = append(errs, unknownKey(k, path, keys))
			continue
		}
		errs = append(errs, checkValue(v, f.Type, joinPath(path, k.Value)))
	}
	return errors.Join(errs...)
}

func checkMerge(v *yaml.Node, t reflect.Type, path string, keys []string) error {
	if v.Kind == yaml.AliasNode {
		v = v.Alias
	}
	if v.Kind == yaml.SequenceNode {
		var errs []error
		for _, m := range v.Content {
			errs = append(errs, checkMerge(m, t, path, keys))
		}
		return errors.Join(errs...)
	}
	return checkSection(v, t, path, keys)
}

// checkSink checks sink: its type and the section of each registered sink.
func checkSink(n *yaml.Node, path string) error {
	keys := append([]string{"type"}, sinks.Names()...)
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: %s must be a mapping of keys (%s), not %s", n.Line, path, strings.Join(keys, ", "), describe(n))
	}
	defaults := defaultSink("")
	var errs []error
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Value == "type" {
			errs = append(errs, checkValue(v, reflect.TypeOf(""), joinPath(path, "type")))
			continue
		}
		set, ok := defaults.settings[k.Value]
		if !ok {
			errs = append(errs, unknownKey(k, path, keys))
			continue
		}
		t := reflect.TypeOf(set).Elem()
		errs = append(errs, checkSection(v, t, joinPath(path, k.Value), keysOf(t)))
	}
	return errors.Join(errs...)
}

func valueError(n *yaml.Node, path, format string, args ...any) error {
	return fmt.Errorf("line %d: %s %s", n.Line, path, fmt.Sprintf(format, args...))
}

func unknownKey(k *yaml.Node, path string, keys []string) error {
	key := joinPath(path, k.Value)
	if near := nearest(k.Value, keys); near != "" {
		return fmt.Errorf("line %d: %s is not a configuration key; did you mean %s?", k.Line, key, joinPath(path, near))
	}
	where := "the top level"
	if path != "" {
		where = path
	}
	return fmt.Errorf("line %d: %s is not a configuration key; the keys of %s are %s", k.Line, key, where, strings.Join(keys, ", "))
}

// keysOf lists the YAML keys of the section type t, in field order.
func keysOf(t reflect.Type) []string {
	var keys []string
	for _, f := range keyFields(t) {
		keys = append(keys, yamlName(f.StructField))
	}
	return keys
}

// want says in words what a value of type t looks like.
func want(t reflect.Type) string {
	if t == durationType {
		return "a duration such as 10s or 1m30s"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number, 0 or more"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	}
	return "a single value"
}

// describe names the kind of YAML value n is, for an error.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return fmt.Sprintf("the value %q", n.Value)
}

// nearest returns the key within two edits of s, if exactly one is
// closest: the likely typo ("slott" for "slot").
func nearest(s string, keys []string) string {
	best, bestDist, ties := "", 3, 0
	sorted := append([]string(nil), keys...)
	sort.Strings(sorted)
	for _, k := range sorted {
		switch d := editDistance(s, k); {
		case d < bestDist:
			best, bestDist, ties = k, d, 0
		case d == bestDist:
			ties++
		}
	}
	if ties > 0 {
		return ""
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
