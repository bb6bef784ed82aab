// Package schema holds the JSON Schemas of outbox payloads, one per event
// type and schema version, validates payloads against them and checks that
// each version evolves compatibly from the one before.
//
// A schema folder has one subfolder per event type and one file per
// version in it:
//
//	schemas/
//	  order.created/
//	    v1.json
//	    v2.json
//	  _shared/         folders starting with _ or . are not event types:
//	    money.json     they hold definitions the others $ref
//
// The relay (relay.schemas.dir) and the outbox library (outbox.Schemas)
// load the same folder with Load, so a service refuses an invalid event
// before it is written and the relay dead-letters one that was written
// anyway. Check compares consecutive versions for `outboxrelay schema
// check`.
//
// Schemas are compiled with github.com/santhosh-tekuri/jsonschema/v6
// (draft 2020-12 unless a schema's $schema says otherwise).
package schema

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// ErrNoSchema is wrapped by the error Validate returns for an event type
// and version the folder has no schema for.
var ErrNoSchema = errors.New("no schema")

// Key names one schema: an event type and a schema version.
type Key struct {
	EventType string
	Version   int
}

// String is "order.created v2".
func (k Key) String() string { return k.EventType + " v" + strconv.Itoa(k.Version) }

// Set is the compiled schemas of one folder. It is immutable and safe for
// concurrent use.
type Set struct {
	dir          string
	schemas      map[Key]*compiled
	allowMissing bool
}

type compiled struct {
	file string // relative to the folder, for errors
	sch  *jsonschema.Schema
	fast *fastNode // nil: every payload goes to sch
}

// Option configures Load.
type Option func(*Set)

// AllowMissing makes Validate accept the payload of an event type and
// version that has no schema, instead of returning an ErrNoSchema error.
func AllowMissing() Option { return func(s *Set) { s.allowMissing = true } }

// versionFile is the name of a schema file: v1.json, v2.json, ...
var versionFile = regexp.MustCompile(`^v([1-9][0-9]{0,8})\.json$`)

// Load compiles every schema in dir. It fails, naming the file and the fix,
// when a schema file is misnamed, is not JSON or is not a valid JSON Schema.
func Load(dir string, opts ...Option) (*Set, error) {
	files, err := list(dir)
	if err != nil {
		return nil, err
	}
	s := &Set{dir: dir, schemas: make(map[Key]*compiled, len(files))}
	for _, o := range opts {
		o(s)
	}
	c := jsonschema.NewCompiler()
	for _, f := range files {
		sch, err := c.Compile(f.path)
		if err != nil {
			return nil, fmt.Errorf("schema %s: %s", f.rel, oneLine(err.Error()))
		}
		text, err := os.ReadFile(f.path)
		if err != nil {
			return nil, fmt.Errorf("read schema: %w", err)
		}
		doc, err := fastDoc(text)
		if err != nil {
			return nil, fmt.Errorf("schema %s: %w", f.rel, err) // compiled, so unreachable in practice
		}
		s.schemas[f.key] = &compiled{file: f.rel, sch: sch, fast: compileFast(doc, f.path)}
	}
	return s, nil
}

// file is one schema file found in a folder.
type file struct {
	key  Key
	path string // absolute
	rel  string // relative to the folder, slash-separated
}

// list finds the schema files of dir, sorted by event type and version.
func list(dir string) ([]file, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("schema folder %s: %w", dir, err)
	}
	types, err := os.ReadDir(abs)
	if err != nil {
		return nil, fmt.Errorf("read schema folder: %w", err)
	}
	var files []file
	for _, t := range types {
		if !t.IsDir() || strings.HasPrefix(t.Name(), "_") || strings.HasPrefix(t.Name(), ".") {
			continue
		}
		entries, err := os.ReadDir(filepath.Join(abs, t.Name()))
		if err != nil {
			return nil, fmt.Errorf("read schema folder: %w", err)
		}
		for _, e := range entries {
			if e.IsDir() || !strings.EqualFold(filepath.Ext(e.Name()), ".json") {
				continue
			}
			rel := t.Name() + "/" + e.Name()
			m := versionFile.FindStringSubmatch(e.Name())
			if m == nil {
				return nil, fmt.Errorf("schema file %s is not named v<version>.json; rename it (v1.json, v2.json, ...) or move shared definitions to a folder starting with _", rel)
			}
			n, _ := strconv.Atoi(m[1])
			files = append(files, file{key: Key{t.Name(), n}, path: filepath.Join(abs, t.Name(), e.Name()), rel: rel})
		}
	}
	slices.SortFunc(files, func(a, b file) int {
		if c := strings.Compare(a.key.EventType, b.key.EventType); c != 0 {
			return c
		}
		return a.key.Version - b.key.Version
	})
	return files, nil
}

// Keys returns the event types and versions that have a schema, sorted.
func (s *Set) Keys() []Key {
	keys := make([]Key, 0, len(s.schemas))
	for k := range s.schemas {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b Key) int {
		if c := strings.Compare(a.EventType, b.EventType); c != 0 {
			return c
		}
		return a.Version - b.Version
	})
	return keys
}

// Has reports whether there is a schema for eventType at version.
func (s *Set) Has(eventType string, version int) bool {
	_, ok := s.schemas[Key{eventType, version}]
	return ok
}

// Validate checks the JSON text payload against the schema of eventType at
// version. It returns nil when the payload matches, a *ValidationError when
// it does not, and an error wrapping ErrNoSchema when there is no such
// schema (nil with AllowMissing).
func (s *Set) Validate(eventType string, version int, payload []byte) error {
	c, ok := s.schemas[Key{eventType, version}]
	if !ok {
		if s.allowMissing {
			return nil
		}
		return fmt.Errorf("%w for event type %q version %d: add %s/v%d.json to the schema folder", ErrNoSchema, eventType, version, eventType, version)
	}
	if c.fast != nil && c.fast.valid(payload) {
		return nil
	}
	doc, err := decode(payload)
	if err != nil {
		return &ValidationError{Key: Key{eventType, version}, File: c.file, Message: "payload is not JSON: " + err.Error()}
	}
	err = validateDoc(c.sch, doc)
	if err == nil {
		return nil
	}
	if errors.Is(err, errValidatorPanic) {
		return &ValidationError{Key: Key{eventType, version}, File: c.file, Message: "payload cannot be validated: " + err.Error()}
	}
	var verr *jsonschema.ValidationError
	if !errors.As(err, &verr) {
		return fmt.Errorf("validate %s: %w", Key{eventType, version}, err)
	}
	return newValidationError(Key{eventType, version}, c.file, verr)
}

// errValidatorPanic is a panic of the library, made an error.
var errValidatorPanic = errors.New("the validator failed")

// validateDoc is sch.Validate, with a panic turned into an error wrapping
// errValidatorPanic. The library panics on a number that big.Rat does not
// parse, an exponent (less the fraction's digits) beyond ±1000000, when
// a keyword such as minimum has to compare it: a payload must not stop
// the relay.
func validateDoc(sch *jsonschema.Schema, doc any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w (%v); a number with an exponent beyond ±1000000 is the known cause", errValidatorPanic, r)
		}
	}()
	return sch.Validate(doc)
}

// ValidationError says why a payload does not match its schema. Error
// names the failing place in the payload and the rule it breaks.
type ValidationError struct {
	Key Key
	// File is the schema file, relative to the folder.
	File string
	// Pointer is the JSON pointer (RFC 6901) of the failing value in the
	// payload; "" is the whole payload.
	Pointer string
	// Rule is the JSON pointer of the failing keyword in the schema file,
	// such as /properties/total/type.
	Rule string
	// Message says what is wrong, such as "got number, want string".
	Message string
	// More counts the other failures, not described.
	More int
}

// Error is one line: the schema, the payload's JSON pointer, the rule as
// file#pointer, and what is wrong.
func (e *ValidationError) Error() string {
	if e.Rule == "" && e.Pointer == "" {
		return fmt.Sprintf("payload does not match schema %s (%s): %s", e.Key, e.File, e.Message)
	}
	s := fmt.Sprintf("payload does not match schema %s: at %q, rule %s#%s: %s", e.Key, e.Pointer, e.File, e.Rule, e.Message)
	if e.More > 0 {
		s += fmt.Sprintf(" (and %d more)", e.More)
	}
	return s
}

var printer = message.NewPrinter(language.English)

func newValidationError(k Key, file string, verr *jsonschema.ValidationError) *ValidationError {
	var leaves []*jsonschema.ValidationError
	var walk func(*jsonschema.ValidationError)
	walk = func(v *jsonschema.ValidationError) {
		if len(v.Causes) == 0 {
			leaves = append(leaves, v)
			return
		}
		for _, c := range v.Causes {
			walk(c)
		}
	}
	walk(verr)
	leaf := leaves[0]
	_, frag, _ := strings.Cut(leaf.SchemaURL, "#")
	rule := frag
	for _, tok := range leaf.ErrorKind.KeywordPath() {
		rule += "/" + escapeToken(tok)
	}
	ptr := ""
	for _, tok := range leaf.InstanceLocation {
		ptr += "/" + escapeToken(tok)
	}
	// A $ref into another file names that file.
	if u, _, _ := strings.Cut(leaf.SchemaURL, "#"); !strings.HasSuffix(filepath.ToSlash(u), "/"+file) {
		if i := strings.LastIndex(u, "/"); i >= 0 {
			if j := strings.LastIndex(u[:i], "/"); j >= 0 {
				file = u[j+1:]
			}
		}
	}
	return &ValidationError{
		Key: k, File: file, Pointer: ptr, Rule: rule,
		Message: oneLine(leaf.ErrorKind.LocalizedString(printer)), More: len(leaves) - 1,
	}
}

func escapeToken(t string) string {
	return strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1")
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
