// Package config is the outboxrelay configuration file: YAML, with every key
// also settable as OUTBOXRELAY_<SECTION>_<KEY> in the environment, defaults,
// and validation that names the key to fix.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/secretfile"

	"go.yaml.in/yaml/v3"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/cpusched"
	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/internal/rules"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/route"
)

// Config is the whole configuration file.
//
// A field tagged secret:"url" or secret:"text" holds a password (or a URL
// that may carry one). Each has a sibling key with the suffix _file that
// names a file to read it from, and Redacted hides it.
type Config struct {
	Postgres Postgres `yaml:"postgres"`
	Sink     Sink     `yaml:"sink"`
	// Sinks, when set, are several named sinks fed from the one slot,
	// replacing Sink (see SinkList).
	Sinks    Sinks          `yaml:"sinks,omitempty"`
	Envelope relay.Envelope `yaml:"envelope"`
	Relay    Relay          `yaml:"relay"`
	HTTP     HTTP           `yaml:"http"`
	Log      Log            `yaml:"log"`
	Process  Process        `yaml:"process"`
	// Rules are the routing rules: the keys routes, unmatched and
	// transform (see package rules).
	rules.Config `yaml:",inline"`
	// Pipelines, when set, are the pipelines the process runs, the
	// sections above their defaults; when empty the sections above are
	// the one pipeline, named default (see Units).
	Pipelines []Pipeline `yaml:"pipelines,omitempty"`
}

// Postgres is the source database: the replication side's settings
// (cdc.Config), how rows become messages (relay.Outbox) and the relay's
// own work on the database.
type Postgres struct {
	cdc.Config   `yaml:",inline"`
	relay.Outbox `yaml:",inline"`
	// CoverageInterval is how often the relay checks that its publication
	// still covers the outbox tables (default 1s).
	CoverageInterval time.Duration `yaml:"coverage_interval"`
	// HeartbeatInterval is how often the relay writes a heartbeat message so
	// that an idle outbox does not pin WAL; 0 disables it.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// Retention deletes outbox rows older than this (by columns.created_at),
	// in small batches; 0 keeps every row. Delivery never depends on the
	// rows: the relay publishes from the WAL its slot retains.
	Retention time.Duration `yaml:"retention"`
	// Backfill says which rows a relay's first start (no position recorded
	// for its slot) publishes from the tables before it streams:
	// BackfillAuto, BackfillAll or BackfillNone.
	Backfill string `yaml:"backfill"`
}

// The values of postgres.backfill.
const (
	// BackfillAuto publishes the rows of the tables migrate created, when
	// no relay has relayed them yet; a table migrate found starts from now.
	BackfillAuto = "auto"
	// BackfillAll publishes every row the tables hold.
	BackfillAll = "all"
	// BackfillNone publishes nothing from the tables: the relay starts from
	// the slot's creation.
	BackfillNone = "none"
)

// Sink chooses and configures the broker. Its keys are type and one
// section per registered sink (see package sinks), named for the sink and
// holding that sink package's own settings: sink.kafka is a kafka.Config.
type Sink struct {
	// Type is the name of the sink to run.
	Type string `yaml:"type"`
	// settings holds every registered sink's section by name, so that each
	// can be set in the file or the environment whichever sink runs.
	settings map[string]sinks.Settings
}

// Settings returns the section of the sink that runs (sink.type), or nil
// when no sink is registered under that name.
func (s Sink) Settings() sinks.Settings { return s.settings[s.Type] }

// Section returns the settings of the sink registered as name, or nil.
func (s Sink) Section(name string) sinks.Settings { return s.settings[name] }

// SinkAs returns the section of s whose type is T (for example
// *kafka.Config), or the zero T when no registered sink has that type.
func SinkAs[T sinks.Settings](s Sink) T {
	for _, v := range s.settings {
		if t, ok := v.(T); ok {
			return t
		}
	}
	var zero T
	return zero
}

func defaultSink(typ string) Sink {
	s := Sink{Type: typ, settings: map[string]sinks.Settings{}}
	for _, t := range sinks.Types() {
		s.settings[t.Name] = t.Defaults()
	}
	return s
}

// clone copies every section, so that a copy of a Config can be changed
// (Redacted does) without changing the original.
func (s Sink) clone() Sink {
	c := Sink{Type: s.Type, settings: make(map[string]sinks.Settings, len(s.settings))}
	for name, v := range s.settings {
		p := reflect.New(reflect.TypeOf(v).Elem())
		p.Elem().Set(reflect.ValueOf(v).Elem())
		c.settings[name] = p.Interface().(sinks.Settings)
	}
	return c
}

// UnmarshalYAML decodes type and the sections of registered sinks; any
// other key, here or inside a section, is an error naming it.
func (s *Sink) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: sink must be a mapping of type and sink sections", n.Line)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Value == "type" {
			if err := v.Decode(&s.Type); err != nil {
				return err
			}
			continue
		}
		set, ok := s.settings[k.Value]
		if !ok {
			return fmt.Errorf("line %d: sink.%s is not a configuration key; sink sections are %s", k.Line, k.Value, strings.Join(sinks.Names(), ", "))
		}
		if err := checkKeys(v, reflect.TypeOf(set).Elem(), "sink."+k.Value); err != nil {
			return err
		}
		if err := v.Decode(set); err != nil {
			return err
		}
	}
	return nil
}

// checkKeys fails on a key of the mapping n that no field of t (a struct)
// has, as the decoder's KnownFields does for the rest of the file: a
// custom unmarshaler's node.Decode does not check.
func checkKeys(n *yaml.Node, t reflect.Type, path string) error {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		return nil // the decoder reports the type mismatch
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		f, ok := fieldByKey(t, k.Value)
		if !ok {
			return fmt.Errorf("line %d: %s.%s is not a configuration key", k.Line, path, k.Value)
		}
		if isSection(f.Type) {
			if err := checkKeys(v, f.Type, path+"."+k.Value); err != nil {
				return err
			}
		}
	}
	return nil
}

func fieldByKey(t reflect.Type, key string) (reflect.StructField, bool) {
	for _, f := range keyFields(t) {
		if yamlName(f.StructField) == key {
			return f.StructField, true
		}
	}
	return reflect.StructField{}, false
}

// keyField is a field of a section that is a key, or a section of keys.
type keyField struct {
	reflect.StructField              // Index is the path from the section
	owner               reflect.Type // the struct that declares it
}

// keyFields returns the fields of the section type t that are keys, in
// file order: its exported fields with a yaml name, and in place of an
// embedded struct tagged yaml:",inline" (cdc.Config in postgres, say) the
// keys of that struct.
func keyFields(t reflect.Type) []keyField {
	var out []keyField
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		if slices.Contains(strings.Split(f.Tag.Get("yaml"), ",")[1:], "inline") {
			for _, g := range keyFields(f.Type) {
				g.Index = append([]int{i}, g.Index...)
				out = append(out, g)
			}
			continue
		}
		if name := yamlName(f); name != "" && name != "-" {
			out = append(out, keyField{StructField: f, owner: t})
		}
	}
	return out
}

// MarshalYAML writes type, then every section in the order of Keys.
func (s Sink) MarshalYAML() (any, error) {
	n := &yaml.Node{Kind: yaml.MappingNode}
	add := func(key string, v any) error {
		var val yaml.Node
		if err := val.Encode(v); err != nil {
			return err
		}
		n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, &val)
		return nil
	}
	if err := add("type", s.Type); err != nil {
		return nil, err
	}
	for _, t := range sinks.Types() {
		if v, ok := s.settings[t.Name]; ok {
			if err := add(t.Name, v); err != nil {
				return nil, err
			}
		}
	}
	return n, nil
}

// Relay tunes the pipeline: the relay's own settings (relay.Config) and
// what the program around it does.
type Relay struct {
	relay.Config `yaml:",inline"`
	// DrainTimeout bounds the wait for acknowledgements at shutdown
	// (cdc.Config.DrainTimeout).
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// DeadLetters stores undeliverable messages in outboxrelay.dead_letters;
	// when false such a message stops the relay instead.
	DeadLetters bool `yaml:"dead_letters"`
	// Schemas validates payloads against JSON Schemas.
	Schemas Schemas `yaml:"schemas"`
}

// Schemas points the relay at a folder of JSON Schemas, one per event type
// and schema version (see package schema).
type Schemas struct {
	// Dir is the folder; empty validates nothing.
	Dir string `yaml:"dir"`
	// Missing is what happens to a payload whose event type and version
	// have no schema: SchemasAllow publishes it, SchemasDeadLetter
	// dead-letters it.
	Missing string `yaml:"missing"`
}

// The values of relay.schemas.missing.
const (
	SchemasAllow      = "allow"
	SchemasDeadLetter = "deadletter"
)

// HTTP is the health, status and metrics endpoint.
type HTTP struct {
	Listen string `yaml:"listen"`
	// Token, when set, is the bearer token /status and /metrics require;
	// /healthz and /readyz stay open for probes.
	Token     string `yaml:"token" secret:"text"`
	TokenFile string `yaml:"token_file"`
	// ActionToken, when set, is the bearer token the management API's
	// actions (pause, resume) require; without it they are off. Reads
	// of the API take Token, as /status does.
	ActionToken     string `yaml:"action_token" secret:"text"`
	ActionTokenFile string `yaml:"action_token_file"`
}

// Log configures logging.
type Log struct {
	Level string `yaml:"level"`
}

// Process holds settings of the whole process, shared by its pipelines.
type Process struct {
	// CPUScheduling is the scheduling policy of the relay's threads: see
	// package cpusched.
	CPUScheduling cpusched.Policy `yaml:"cpu_scheduling"`
}

// Default returns the configuration used for keys that are not set: the
// defaults of the packages whose settings the sections embed, and the
// program's own.
func Default() Config {
	pg, rc := cdc.Config{}.WithDefaults(), relay.Config{}.WithDefaults()
	return Config{
		Postgres: Postgres{
			Config: pg, Outbox: rc.Outbox,
			HeartbeatInterval: 10 * time.Second, CoverageInterval: time.Second, Backfill: BackfillAuto,
		},
		Sink:     defaultSink("kafka"),
		Envelope: rc.Envelope,
		Relay:    Relay{Config: rc, DrainTimeout: pg.DrainTimeout, DeadLetters: true, Schemas: Schemas{Missing: SchemasAllow}},
		HTTP:     HTTP{Listen: "127.0.0.1:9187"},
		Log:      Log{Level: "info"},
		Process:  Process{CPUScheduling: cpusched.Batch},
	}
}

// EnvPrefix starts the name of every environment variable the relay reads.
const EnvPrefix = "OUTBOXRELAY_"

// Load reads the YAML file at path (none when path is ""), then applies
// environment overrides from lookup (os.LookupEnv in the binary), then reads
// the secrets that *_file keys name, then validates. Unknown keys are errors.
func Load(path string, lookup func(string) (string, bool)) (Config, error) {
	var data []byte
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return Default(), fmt.Errorf("read config: %w", err)
		}
	}
	return load(data, path, lookup)
}

// load reports every problem it finds, in the file, the environment and
// the values, joined (Problems splits them), not only the first.
func load(data []byte, name string, lookup func(string) (string, bool)) (Config, error) {
	cfg := Default()
	var errs []error
	decoded, checked := true, true
	if len(data) > 0 {
		docErr := checkDocument(data)
		checked = docErr == nil
		for _, e := range Problems(docErr) {
			errs = append(errs, fmt.Errorf("config %s: %w", name, e))
		}
		// A file with bad keys is still decoded, leniently, so that the
		// environment and the values are checked in the same run.
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(docErr == nil)
		if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) { // an empty file is fine
			decoded = false
			if docErr == nil {
				errs = append(errs, fmt.Errorf("config %s: %w", name, err))
			}
		}
	}
	fromEnv := map[string]bool{}
	if lookup != nil {
		errs = append(errs, Problems(applyEnv(reflect.ValueOf(&cfg).Elem(), "", EnvPrefix[:len(EnvPrefix)-1], lookup, fromEnv))...)
	}
	// Before the top level's secret files are read: a pipeline that sets
	// a secret of its own must not inherit the top level's file too.
	errs = append(errs, Problems(cfg.resolvePipelines(fromEnv, checked))...)
	errs = append(errs, Problems(cfg.readSecretFiles(fromEnv))...)
	if decoded {
		// Values of a file the decoder could not read are partly defaults:
		// checking them would report problems the file does not have.
		errs = append(errs, Problems(cfg.Validate())...)
	}
	return cfg, errors.Join(errs...)
}

// Problems splits an error of Load or Validate into its problems, one
// sentence each, in the order found; nil for nil.
func Problems(err error) []error {
	if err == nil {
		return nil
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, Problems(e)...)
	}
	return out
}

// Redacted is what a hidden secret is shown as.
const Redacted = redact.Mask

// maxSecretFile bounds a secret file: a URL or a password, never a stream.
const maxSecretFile = 64 << 10

// ReadSecretFile reads a secret (a password, token or URL) from a file,
// such as a mounted Kubernetes or Docker secret, without its trailing
// newline. The file must be a regular file of at most 64 KiB and not empty.
// Errors name the file, never its content.
func ReadSecretFile(path string) (string, error) {
	b, err := secretfile.Read(path, maxSecretFile)
	if err != nil {
		return "", err
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

// readSecretFiles sets every secret whose _file key is set from that file.
// When a secret and its file are both set, the one set in the environment
// wins, as the environment wins over the file everywhere; both set in the
// same place is an error.
func (c *Config) readSecretFiles(fromEnv map[string]bool) error {
	var errs []error
	walkSecrets(reflect.ValueOf(c).Elem(), "", func(key, _ string, val, file reflect.Value) {
		fileKey := key + "_file"
		if file.String() == "" {
			return
		}
		if val.String() != "" {
			switch {
			case fromEnv[key] && !fromEnv[fileKey]:
				return // the environment's value wins over the file's _file
			case fromEnv[fileKey] && !fromEnv[key]:
			default:
				errs = append(errs, fmt.Errorf("%s and %s are both set; keep one", key, fileKey))
				return
			}
		}
		s, err := ReadSecretFile(file.String())
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", fileKey, err))
			return
		}
		val.SetString(s)
	})
	return errors.Join(errs...)
}

// walkSecrets calls fn for every field of v (a struct) tagged secret, with
// its key, its kind (url or text), its value and its _file sibling.
func walkSecrets(v reflect.Value, path string, fn func(key, kind string, val, file reflect.Value)) {
	fs := fields(v)
	for _, f := range fs {
		if f.section {
			walkSecrets(f.v, joinPath(path, f.name), fn)
			continue
		}
		if f.v.Type() == sinksType {
			for i := 0; i < f.v.Len(); i++ {
				ns := f.v.Index(i)
				walkSecrets(ns.Field(1), joinPath(path, f.name+"."+ns.Field(0).String()), fn)
			}
			continue
		}
		kind := f.tag.Get("secret")
		if kind == "" {
			continue
		}
		var file reflect.Value
		for _, g := range fs {
			if g.name == f.name+"_file" {
				file = g.v
			}
		}
		fn(joinPath(path, f.name), kind, f.v, file)
	}
}

// field is one key of a section of the file.
type field struct {
	name    string
	tag     reflect.StructTag
	v       reflect.Value
	section bool         // a struct of keys, not a value
	owner   reflect.Type // the struct that declares it (nil for a sink's section)
}

// fields returns the keys of the section v (a struct) in file order: its
// exported fields with a yaml name, and for Sink its type and the
// registered sinks' sections.
func fields(v reflect.Value) []field {
	if s, ok := v.Addr().Interface().(*Sink); v.CanAddr() && ok {
		fs := []field{{name: "type", tag: `yaml:"type"`, v: v.FieldByName("Type")}}
		for _, t := range sinks.Types() {
			if set, ok := s.settings[t.Name]; ok {
				fs = append(fs, field{name: t.Name, v: reflect.ValueOf(set).Elem(), section: true})
			}
		}
		return fs
	}
	var fs []field
	for _, f := range keyFields(v.Type()) {
		fs = append(fs, field{name: yamlName(f.StructField), tag: f.Tag, v: v.FieldByIndex(f.Index), section: isSection(f.Type), owner: f.owner})
	}
	return fs
}

// isSection reports whether a field of type t holds keys rather than a value.
func isSection(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && t != reflect.TypeOf(time.Duration(0))
}

func yamlName(f reflect.StructField) string {
	return strings.Split(f.Tag.Get("yaml"), ",")[0]
}

// Redacted returns a copy of c with every secret hidden: passwords and
// tokens become xxxxx, URLs keep everything but their passwords.
func (c Config) Redacted() Config {
	c.Sink = c.Sink.clone()
	c.Sinks = c.Sinks.clone()
	c.redactPipelines()
	walkSecrets(reflect.ValueOf(&c).Elem(), "", func(_, kind string, val, _ reflect.Value) {
		switch {
		case val.String() == "":
		case kind == "url":
			val.SetString(redact.URL(val.String()))
		default:
			val.SetString(Redacted)
		}
	})
	return c
}

// RedactedYAML is the effective configuration as YAML, secrets hidden.
func (c Config) RedactedYAML() ([]byte, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(c.Redacted()); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Key is one configuration key.
type Key struct {
	Path    string // postgres.url
	Env     string // OUTBOXRELAY_POSTGRES_URL
	Default string
	// Doc describes the key: from the Docs of the package struct that
	// declares it (relay.Config, cdc.Config), from the sink's registration,
	// or from this package's descriptions.
	Doc string
	// docs and docKey are where Doc came from when a package struct's
	// Docs described it: that struct and the key's path in it.
	docs   reflect.Type
	docKey string
}

// documented is a package's settings struct that describes its keys, by
// their path in the section that holds or embeds it (see relay.Config.Docs).
type documented interface{ Docs() map[string]string }

var documentedType = reflect.TypeOf((*documented)(nil)).Elem()

// docsOf returns t when it is another package's settings struct that
// describes its keys, and nil otherwise. A section of this package only
// seems to describe its keys when it embeds such a struct.
func docsOf(t reflect.Type) reflect.Type {
	if t == nil || t.PkgPath() == reflect.TypeOf(Config{}).PkgPath() || !t.Implements(documentedType) {
		return nil
	}
	return t
}

// Keys lists every configuration key with its environment name, default
// and description, in file order. docs/configuration.md's reference is checked
// against it.
func Keys() []Key {
	var keys []Key
	// docs is the struct whose Docs describe the keys under path, and
	// prefix their path in it.
	var walk func(v reflect.Value, path, env string, docs reflect.Type, prefix string)
	walk = func(v reflect.Value, path, env string, docs reflect.Type, prefix string) {
		for _, f := range fields(v) {
			p, e := joinPath(path, f.name), env+"_"+strings.ToUpper(f.name)
			d, pre := docs, prefix
			if od := docsOf(f.owner); od != nil && od != docs {
				d, pre = od, ""
			}
			if f.section {
				if sd := docsOf(f.v.Type()); sd != nil {
					walk(f.v, p, e, sd, "")
				} else {
					walk(f.v, p, e, d, pre+f.name+".")
				}
				continue
			}
			k := Key{Path: p, Env: e, Default: format(f.v), Doc: descriptions[p]}
			if d != nil {
				k.docs, k.docKey = d, pre+f.name
				k.Doc = reflect.Zero(d).Interface().(documented).Docs()[k.docKey]
			} else if k.Doc == "" {
				k.Doc = sinkDoc(p)
			}
			keys = append(keys, k)
		}
	}
	cfg := Default()
	walk(reflect.ValueOf(&cfg).Elem(), "", EnvPrefix[:len(EnvPrefix)-1], nil, "")
	return keys
}

func joinPath(a, b string) string {
	if a == "" {
		return b
	}
	return a + "." + b
}

func format(v reflect.Value) string {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return ""
		}
		v = v.Elem()
	}
	switch x := v.Interface().(type) {
	case []string:
		return strings.Join(x, ",")
	case []Pipeline, Sinks:
		return ""
	case time.Duration:
		return x.String()
	default:
		return fmt.Sprint(x)
	}
}

// applyEnv sets the fields of v found in the environment and records their
// keys in set.
func applyEnv(v reflect.Value, path, env string, lookup func(string) (string, bool), set map[string]bool) error {
	var errs []error
	for _, f := range fields(v) {
		p, e := joinPath(path, f.name), env+"_"+strings.ToUpper(f.name)
		if f.section {
			errs = append(errs, applyEnv(f.v, p, e, lookup, set))
			continue
		}
		s, ok := lookup(e)
		if !ok {
			continue
		}
		if err := setValue(f.v, s); err != nil {
			errs = append(errs, fmt.Errorf("environment %s: %w", e, err))
			continue
		}
		set[p] = true
	}
	return errors.Join(errs...)
}

// UnknownEnv returns a warning for every variable of environ (KEY=value
// pairs, as os.Environ returns them) that starts with OUTBOXRELAY_ but
// names no configuration key, naming the closest key when one is within a
// few edits: a mistyped variable is otherwise silently ignored.
func UnknownEnv(environ []string) []string {
	known := map[string]bool{}
	var names []string
	for _, k := range Keys() {
		known[k.Env] = true
		names = append(names, k.Env)
	}
	var warnings []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix) || known[name] {
			continue
		}
		near, d := closest(name, names)
		if d <= max(3, len(name)/8) {
			warnings = append(warnings, fmt.Sprintf("environment %s is not a configuration key and is ignored; did you mean %s?", name, near))
			continue
		}
		warnings = append(warnings, fmt.Sprintf("environment %s is not a configuration key and is ignored; no key is close (docs/configuration.md lists them)", name))
	}
	return warnings
}

// closest returns the name of names nearest to s by edit distance (the
// first in sorted order on a tie) and that distance.
func closest(s string, names []string) (string, int) {
	sorted := append([]string(nil), names...)
	sort.Strings(sorted)
	best, bestDist := "", -1
	for _, n := range sorted {
		if d := editDistance(s, n); bestDist < 0 || d < bestDist {
			best, bestDist = n, d
		}
	}
	return best, bestDist
}

func setValue(v reflect.Value, s string) error {
	if v.Kind() == reflect.Pointer {
		p := reflect.New(v.Type().Elem())
		if err := setValue(p.Elem(), s); err != nil {
			return err
		}
		v.Set(p)
		return nil
	}
	switch v.Interface().(type) {
	case time.Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%q is not a duration like 10s", s)
		}
		v.SetInt(int64(d))
		return nil
	case []Pipeline:
		return errors.New("pipelines can be set in the file only")
	case Sinks:
		return errors.New("sinks can be set in the file only")
	case []string:
		var list []string
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				list = append(list, p)
			}
		}
		v.Set(reflect.ValueOf(list))
		return nil
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("%q is not true or false", s)
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not an integer", s)
		}
		v.SetInt(n)
	default:
		return fmt.Errorf("unsupported type %s", v.Type())
	}
	return nil
}

// Validate checks every key and reports all problems at once, each naming
// its key. With a pipelines list the top-level postgres, sink, envelope
// and relay sections are only defaults: each pipeline is checked instead,
// its problems prefixed with pipelines[i] (name).
func (c *Config) Validate() error {
	var errs []error
	if len(c.Pipelines) > 0 {
		errs = c.validatePipelines()
	} else {
		errs = c.validatePipeline()
	}
	if t := c.HTTP.Token; t != "" && strings.IndexFunc(t, func(r rune) bool { return r <= ' ' || r >= 0x7f }) >= 0 {
		errs = append(errs, errors.New("http.token must be printable ASCII without spaces"))
	}
	if t := c.HTTP.ActionToken; t != "" && strings.IndexFunc(t, func(r rune) bool { return r <= ' ' || r >= 0x7f }) >= 0 {
		errs = append(errs, errors.New("http.action_token must be printable ASCII without spaces"))
	}
	if t := c.HTTP.ActionToken; t != "" && t == c.HTTP.Token {
		errs = append(errs, errors.New("http.action_token must differ from http.token: whoever may read must not thereby act"))
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log.level %q is not one of debug, info, warn, error", c.Log.Level))
	}
	switch c.Process.CPUScheduling {
	case cpusched.Batch, cpusched.Inherited:
	default:
		errs = append(errs, fmt.Errorf("process.cpu_scheduling %q is not one of batch, inherited", c.Process.CPUScheduling))
	}
	return errors.Join(errs...)
}

// validatePipeline checks the sections one pipeline runs with: postgres,
// sink, envelope and relay.
func (c *Config) validatePipeline() []error {
	var errs []error
	if c.Postgres.URL == "" {
		errs = append(errs, errors.New("postgres.url is required (or OUTBOXRELAY_POSTGRES_URL)"))
	}
	switch c.Postgres.Backfill {
	case BackfillAuto, BackfillAll, BackfillNone:
	default:
		errs = append(errs, fmt.Errorf("postgres.backfill %q is not one of auto, all, none", c.Postgres.Backfill))
	}
	cc := c.CDC()
	if err := cc.Validate(); err != nil && c.Postgres.URL != "" {
		errs = append(errs, err)
	} else if err != nil {
		// Report the other postgres problems without repeating the URL one.
		for _, e := range Problems(err) {
			if !strings.HasPrefix(e.Error(), "postgres.url") {
				errs = append(errs, e)
			}
		}
	}
	if c.Postgres.HeartbeatInterval < 0 {
		errs = append(errs, fmt.Errorf("postgres.heartbeat_interval %s must not be negative", c.Postgres.HeartbeatInterval))
	}
	errs = append(errs, c.validateSinks()...)
	if set := c.Sink.Settings(); len(c.Sinks) > 0 {
		// The sink section is replaced: its defaults need no check.
	} else if set == nil {
		errs = append(errs, fmt.Errorf("sink.type %q is not one of %s", c.Sink.Type, strings.Join(sinks.Names(), ", ")))
	} else {
		if err := set.Validate(); err != nil {
			errs = append(errs, Problems(err)...)
		}
		if fc, ok := set.(sinks.FormatChecker); ok {
			if err := fc.CheckFormat(c.Envelope.Format); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if c.Postgres.Retention < 0 {
		errs = append(errs, fmt.Errorf("postgres.retention %s must not be negative", c.Postgres.Retention))
	}
	rc := c.RelayConfig()
	errs = append(errs, Problems(rc.Validate())...)
	for i, r := range c.Routes {
		if _, err := route.Parse(r.Destination); err != nil {
			errs = append(errs, fmt.Errorf("routes[%d] (%s).destination: %w", i, r.Name, err))
		}
		for name := range r.Headers {
			if envelope.Reserved(name) {
				errs = append(errs, fmt.Errorf("routes[%d] (%s).headers: %q is a header name the relay owns (%s)", i, r.Name, name, envelope.ReservedAs(name)))
			}
		}
	}
	for name := range c.Transform.Headers {
		if envelope.Reserved(name) {
			errs = append(errs, fmt.Errorf("transform.headers: %q is a header name the relay owns (%s)", name, envelope.ReservedAs(name)))
		}
	}
	switch c.Relay.Schemas.Missing {
	case SchemasAllow, SchemasDeadLetter:
	default:
		errs = append(errs, fmt.Errorf("relay.schemas.missing %q is not one of allow, deadletter", c.Relay.Schemas.Missing))
	}
	return errs
}

// CDC returns the replication settings: the postgres section's, with the
// drain timeout of the relay section.
func (c *Config) CDC() cdc.Config {
	cc := c.Postgres.Config
	cc.DrainTimeout = c.Relay.DrainTimeout
	return cc
}

// RelayConfig returns the pipeline's settings: the relay section's, with
// the postgres section's Outbox, the envelope section, the outbox tables
// and the sink's name. Only the database's name, which the server tells,
// is left to set.
func (c *Config) RelayConfig() relay.Config {
	rc := c.Relay.Config
	rc.Outbox, rc.Envelope = c.Postgres.Outbox, c.Envelope
	rc.Tables = QualifiedTables(c.Postgres.Tables)
	rc.MessagingSystem = c.Sink.Type
	rc.Rules = c.Config
	// An idle relay records its position once per heartbeat: each heartbeat
	// gives it one to confirm, and the slot keeps no more WAL than that.
	if c.Postgres.HeartbeatInterval > 0 {
		rc.IdleCheckpointInterval = c.Postgres.HeartbeatInterval
	}
	return rc
}

// QualifiedTables writes each table of tables as schema.name, leaving out
// those that are not valid (Validate reports them).
func QualifiedTables(tables []string) []string {
	out := make([]string, 0, len(tables))
	for _, t := range tables {
		if schema, name, err := cdc.SplitTable(t); err == nil {
			out = append(out, schema+"."+name)
		}
	}
	return out
}
