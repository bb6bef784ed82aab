package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Violation is one incompatible change, or one rule broken by a single
// schema file.
type Violation struct {
	// File is the schema file, relative to the folder, slash-separated.
	File string
	// Pointer is the JSON pointer of the offending keyword in File.
	Pointer string
	Message string
}

// String is "file#pointer: message".
func (v Violation) String() string { return v.File + "#" + v.Pointer + ": " + v.Message }

// Check checks every schema in dir and, between consecutive versions of
// each event type, that v(N+1) is backward compatible with v(N): data
// written under v(N) is valid under v(N+1) and means the same. It reports,
// in file order:
//
//   - a file that is not a valid JSON Schema;
//   - additionalProperties: false anywhere (consumers must tolerate unknown
//     fields, and producers must be able to add them);
//   - a required property that is no longer required, or is gone;
//   - a type narrowed or changed (integer to number widens, number to
//     integer narrows; no type at all allows every type);
//   - an enum value removed, or an enum added where there was none;
//   - a new required property without a default.
//
// Properties and array items are compared recursively, property by
// property; the targets of $ref are not compared. The error is for a
// folder that cannot be read.
func Check(dir string) ([]Violation, error) {
	files, err := list(dir)
	if err != nil {
		return nil, err
	}
	var out []Violation
	c := jsonschema.NewCompiler()
	docs := make([]any, len(files))
	for i, f := range files {
		if _, err := c.Compile(f.path); err != nil {
			out = append(out, compileViolation(f, err))
			continue
		}
		b, err := os.ReadFile(f.path)
		if err != nil {
			return nil, fmt.Errorf("read schema: %w", err)
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		if err := dec.Decode(&docs[i]); err != nil {
			return nil, fmt.Errorf("schema %s: %w", f.rel, err) // compiled, so unreachable in practice
		}
		closed(f.rel, "", docs[i], &out)
		if i > 0 && files[i-1].key.EventType == f.key.EventType && docs[i-1] != nil {
			compare(files[i-1].rel, f.rel, "", docs[i-1], docs[i], &out)
		}
	}
	return out, nil
}

// compileViolation describes why f did not compile, naming the failing
// keyword of a schema that breaks the metaschema.
func compileViolation(f file, err error) Violation {
	var sve *jsonschema.SchemaValidationError
	var verr *jsonschema.ValidationError
	if errors.As(err, &sve) && errors.As(sve.Err, &verr) {
		leaf := newValidationError(Key{}, f.rel, verr)
		return Violation{File: f.rel, Pointer: leaf.Pointer, Message: "not a valid JSON Schema: " + leaf.Message}
	}
	msg := strings.ReplaceAll(oneLine(err.Error()), "file://"+filepath.ToSlash(f.path), f.rel)
	return Violation{File: f.rel, Message: "not a valid JSON Schema: " + msg}
}

// closed reports additionalProperties: false in doc and its subschemas.
func closed(file, ptr string, doc any, out *[]Violation) {
	switch d := doc.(type) {
	case map[string]any:
		if ap, ok := d["additionalProperties"].(bool); ok && !ap {
			*out = append(*out, Violation{File: file, Pointer: ptr + "/additionalProperties",
				Message: "additionalProperties: false refuses the fields a later version adds; remove it, consumers must tolerate unknown fields"})
		}
		for _, k := range sortedKeys(d) {
			if k == "enum" || k == "const" || k == "default" || k == "examples" {
				continue // values, not schemas
			}
			closed(file, ptr+"/"+escapeToken(k), d[k], out)
		}
	case []any:
		for i, e := range d {
			closed(file, fmt.Sprintf("%s/%d", ptr, i), e, out)
		}
	}
}

// compare reports what in the subschema newer at ptr refuses or
// reinterprets data that older, the same place one version before, accepts.
func compare(oldFile, file, ptr string, older, newer any, out *[]Violation) {
	o, ok1 := older.(map[string]any)
	n, ok2 := newer.(map[string]any)
	if !ok1 || !ok2 {
		return
	}
	add := func(p, format string, args ...any) {
		*out = append(*out, Violation{File: file, Pointer: ptr + p, Message: fmt.Sprintf(format, args...)})
	}
	prev := strings.TrimSuffix(filepath.Base(oldFile), ".json")

	if nt := types(n); nt != nil {
		ot := types(o)
		if ot == nil {
			add("/type", "type narrowed: %s allowed any type, now only %s", prev, strings.Join(nt, ", "))
		} else {
			var lost []string
			for _, t := range ot {
				if !slices.Contains(nt, t) && !(t == "integer" && slices.Contains(nt, "number")) {
					lost = append(lost, t)
				}
			}
			if len(lost) > 0 {
				add("/type", "type narrowed or changed: %s allowed %s, now %s", prev, strings.Join(ot, ", "), strings.Join(nt, ", "))
			}
		}
	}

	if ne, ok := n["enum"].([]any); ok {
		oe, had := o["enum"].([]any)
		if !had {
			add("/enum", "enum added: values %s accepted are now refused", prev)
		}
		for _, v := range oe {
			if !slices.ContainsFunc(ne, func(x any) bool { return reflect.DeepEqual(x, v) }) {
				add("/enum", "enum value %s removed", jsonText(v))
			}
		}
	}

	oreq, nreq := stringList(o["required"]), stringList(n["required"])
	nprops, _ := n["properties"].(map[string]any)
	for _, name := range oreq {
		if slices.Contains(nreq, name) {
			continue
		}
		if _, still := nprops[name]; still {
			add("/required", "required property %q is no longer required; consumers rely on it, keep it required", name)
		} else {
			add("/properties", "required property %q removed; keep it, or publish a new event type", name)
		}
	}
	for _, name := range nreq {
		if slices.Contains(oreq, name) {
			continue
		}
		p, _ := nprops[name].(map[string]any)
		if _, hasDefault := p["default"]; !hasDefault {
			add("/required", "new required property %q has no default; give it a default or leave it optional", name)
		}
	}

	oprops, _ := o["properties"].(map[string]any)
	for _, name := range sortedKeys(nprops) {
		if op, ok := oprops[name]; ok {
			compare(oldFile, file, ptr+"/properties/"+escapeToken(name), op, nprops[name], out)
		}
	}
	compare(oldFile, file, ptr+"/items", o["items"], n["items"], out)
}

// types returns the types a schema's "type" allows, or nil for any.
func types(s map[string]any) []string {
	switch t := s["type"].(type) {
	case string:
		return []string{t}
	case []any:
		return stringList(t)
	}
	return nil
}

func stringList(v any) []string {
	a, _ := v.([]any)
	var out []string
	for _, e := range a {
		if s, ok := e.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
