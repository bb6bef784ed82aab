package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/outbox/schema"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

// Value formats of Config.ValueFormat.
const (
	// ValueJSON is the relay's body as it is: the envelope, the CloudEvent
	// or the payload of the configured envelope.format.
	ValueJSON = "json"
	// ValueConfluentJSONSchema is the payload after the Confluent wire
	// header, its JSON Schema registered in the schema registry.
	ValueConfluentJSONSchema = "confluent-json-schema"
	// ValueConfluentAvro is the payload encoded as Avro binary after the
	// Confluent wire header, its Avro schema registered.
	ValueConfluentAvro = "confluent-avro"
)

// Subject name strategies of SchemaRegistry.SubjectStrategy.
const (
	// SubjectTopic names the subject <topic>-value (Confluent's
	// TopicNameStrategy).
	SubjectTopic = "topic"
	// SubjectRecord names the subject for the record: the Avro schema's full
	// name, or the JSON Schema's title, else the event type (Confluent's
	// RecordNameStrategy).
	SubjectRecord = "record"
)

// Content types of the Confluent value formats, in the content-type header:
// the value is not plain JSON or Avro but starts with the wire header.
const (
	ContentTypeConfluentJSONSchema = "application/vnd.confluent.jsonschema+json"
	ContentTypeConfluentAvro       = "application/vnd.confluent.avro"
)

// registryHold is how long a failed registration or lookup is answered
// from the cache before the registry is asked again, so that a registry
// that is down or refuses a schema is not asked once per record.
const registryHold = 5 * time.Second

// SchemaRegistry is the Confluent-compatible Schema Registry of a Confluent
// value format (sink.kafka.schema_registry).
type SchemaRegistry struct {
	// URL is the registry's base URL, http:// or https://. It may carry
	// user:password@ for basic authentication; its password never appears
	// in logs or errors.
	URL string `yaml:"url" secret:"url"`
	// URLFile names a file holding URL; the configuration loader reads it.
	URLFile string `yaml:"url_file"`
	// Username and Password authenticate with HTTP basic authentication
	// (an API key and secret on Confluent Cloud).
	Username     string `yaml:"username"`
	Password     string `yaml:"password" secret:"text"`
	PasswordFile string `yaml:"password_file"`
	// TLSFiles configures TLS for an https:// URL; without it the system's
	// roots verify the registry.
	TLSFiles sinks.TLS `yaml:"tls"`
	// SubjectStrategy is topic (default) or record.
	SubjectStrategy string `yaml:"subject_strategy"`
}

// registryWarnings names registry settings that work but expose the
// password or accept any registry.
func (c Config) registryWarnings() []string {
	if !confluent(c.ValueFormat) {
		return nil
	}
	var ws []string
	r := c.SchemaRegistry
	if u, err := url.Parse(r.URL); err == nil && u.Scheme == "http" && (r.Password != "" || u.User != nil) {
		ws = append(ws, "sink.kafka.schema_registry.url is http:// and sends the registry password unencrypted; use https://")
	}
	if r.TLSFiles.Enabled && r.TLSFiles.InsecureSkipVerify {
		ws = append(ws, "sink.kafka.schema_registry.tls.insecure_skip_verify accepts any registry certificate; use sink.kafka.schema_registry.tls.ca_file instead")
	}
	return ws
}

// confluent returns whether format is one of the Confluent value formats.
func confluent(format string) bool {
	return format == ValueConfluentJSONSchema || format == ValueConfluentAvro
}

// validateValues reports the problems of the value format settings.
func (c Config) validateValues() []error {
	switch c.ValueFormat {
	case ValueJSON:
		return nil
	case ValueConfluentJSONSchema, ValueConfluentAvro:
	default:
		return []error{fmt.Errorf("sink.kafka.value_format %q is not one of json, confluent-json-schema, confluent-avro", c.ValueFormat)}
	}
	var errs []error
	if c.SchemasDir == "" {
		errs = append(errs, fmt.Errorf("sink.kafka.schemas_dir is empty; value_format %s needs the schema folder (usually the one of relay.schemas.dir)", c.ValueFormat))
	}
	r := c.SchemaRegistry
	u, err := url.Parse(r.URL)
	switch {
	case r.URL == "":
		errs = append(errs, fmt.Errorf("sink.kafka.schema_registry.url is empty; value_format %s needs the schema registry's URL", c.ValueFormat))
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		errs = append(errs, fmt.Errorf("sink.kafka.schema_registry.url %q is not an http:// or https:// URL", redact.URL(r.URL)))
	default:
		if u.User != nil && r.Username != "" {
			errs = append(errs, errors.New("sink.kafka.schema_registry.url carries a user and sink.kafka.schema_registry.username is set; keep one"))
		}
		if r.TLSFiles.Enabled && u.Scheme != "https" {
			errs = append(errs, errors.New("sink.kafka.schema_registry.tls.enabled needs an https:// sink.kafka.schema_registry.url"))
		}
	}
	if (r.Username == "") != (r.Password == "") {
		errs = append(errs, errors.New("sink.kafka.schema_registry.username and password go together; set both or neither"))
	}
	if r.TLSFiles.Configured() && !r.TLSFiles.Enabled {
		errs = append(errs, errors.New("sink.kafka.schema_registry.tls has settings but sink.kafka.schema_registry.tls.enabled is false; set it to true"))
	}
	if r.TLSFiles.Enabled {
		if _, err := r.TLSFiles.ClientConfig("sink.kafka.schema_registry.tls"); err != nil {
			errs = append(errs, err)
		}
	}
	switch r.SubjectStrategy {
	case SubjectTopic, SubjectRecord:
	default:
		errs = append(errs, fmt.Errorf("sink.kafka.schema_registry.subject_strategy %q is not one of topic, record", r.SubjectStrategy))
	}
	return errs
}

// values encodes record values in a Confluent value format. It is safe for
// concurrent use.
type values struct {
	format   string
	strategy string
	dir      string
	url      string // redacted, for errors
	client   *sr.Client
	schemas  map[schema.Key]*valueSchema

	mu  sync.RWMutex
	ids map[subjectKey]registered
	// regMu makes one registration at a time, so that records published
	// together for a new schema ask the registry once.
	regMu sync.Mutex
	now   func() time.Time
}

// valueSchema is one schema file as it is registered.
type valueSchema struct {
	file   string // relative to the folder
	text   string
	record string      // the subject of SubjectRecord
	avro   avro.Schema // confluent-avro only
}

type subjectKey struct {
	subject string
	key     schema.Key
}

// registered is the registry's answer for a subject and schema: the id, or
// the error, which is asked again after until.
type registered struct {
	id    int
	err   error
	until time.Time
}

// newValues loads the schemas of c's value format. It does not contact the
// registry. It returns nil for ValueJSON.
func newValues(c Config) (*values, error) {
	if !confluent(c.ValueFormat) {
		return nil, nil
	}
	ext := "json"
	if c.ValueFormat == ValueConfluentAvro {
		ext = "avsc"
	}
	files, err := schema.Files(c.SchemasDir, ext)
	if err != nil {
		return nil, fmt.Errorf("sink.kafka.schemas_dir: %w", err)
	}
	v := &values{
		format: c.ValueFormat, strategy: c.SchemaRegistry.SubjectStrategy, dir: c.SchemasDir,
		schemas: make(map[schema.Key]*valueSchema, len(files)), ids: map[subjectKey]registered{}, now: time.Now,
	}
	for k, f := range files {
		vs := &valueSchema{file: f.Name, text: string(f.Text)}
		if ext == "avsc" {
			s, err := avro.ParseWithCache(vs.text, "", &avro.SchemaCache{})
			if err != nil {
				return nil, fmt.Errorf("avro schema %s: %v; fix the file", f.Name, err)
			}
			vs.avro = s
			vs.record = avroTypeName(s)
		} else {
			title, err := jsonSchemaTitle(f.Text)
			if err != nil {
				return nil, fmt.Errorf("schema %s: %w", f.Name, err)
			}
			vs.record = title
			if vs.record == "" {
				vs.record = k.EventType
			}
		}
		v.schemas[k] = vs
	}

	r := c.SchemaRegistry
	u, _ := url.Parse(r.URL) // Validate has checked it
	v.url = redact.URL(r.URL)
	opts := []sr.ClientOpt{sr.UserAgent("outboxrelay"), sr.HTTPClient(&http.Client{Timeout: 10 * time.Second})}
	if u.User != nil {
		pass, _ := u.User.Password()
		opts = append(opts, sr.BasicAuth(u.User.Username(), pass))
		u.User = nil
	}
	opts = append(opts, sr.URLs(u.String()))
	if r.Username != "" {
		opts = append(opts, sr.BasicAuth(r.Username, r.Password))
	}
	if r.TLSFiles.Enabled {
		tc, err := r.TLSFiles.ClientConfig("sink.kafka.schema_registry.tls")
		if err != nil {
			return nil, err
		}
		opts = append(opts, sr.DialTLSConfig(tc))
	}
	if v.client, err = sr.NewClient(opts...); err != nil {
		return nil, fmt.Errorf("sink.kafka.schema_registry: %w", err)
	}
	return v, nil
}

// jsonSchemaTitle returns the schema's title, and an error when the schema
// refers to another file: the registry takes each file alone.
func jsonSchemaTitle(text []byte) (string, error) {
	var doc any
	if err := json.Unmarshal(text, &doc); err != nil {
		return "", fmt.Errorf("not JSON: %w", err)
	}
	var ref string
	var walk func(any)
	walk = func(x any) {
		switch x := x.(type) {
		case map[string]any:
			if s, ok := x["$ref"].(string); ok && ref == "" && (s == "" || s[0] != '#') {
				ref = s
			}
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(doc)
	if ref != "" {
		return "", fmt.Errorf("$ref %q names another file, which value_format confluent-json-schema cannot register; copy the definition into the schema", ref)
	}
	obj, _ := doc.(map[string]any)
	title, _ := obj["title"].(string)
	return title, nil
}

// ping checks that the registry answers; ctx bounds it. A nil v has no
// registry.
func (v *values) ping(ctx context.Context) error {
	if v == nil {
		return nil
	}
	if _, err := v.client.Subjects(ctx); err != nil {
		var re *sr.ResponseError
		if errors.As(err, &re) && (re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden) {
			return &registryDown{fmt.Sprintf("the schema registry at %s refused the relay (HTTP %d: %s); check sink.kafka.schema_registry.username and password", v.url, re.StatusCode, re.Message)}
		}
		// The client's URL carries no password (newValues moved it to
		// basic authentication), so its errors quote none.
		return &registryDown{fmt.Sprintf("cannot reach the schema registry at %s (%v); check sink.kafka.schema_registry.url and that the registry is running", v.url, err)}
	}
	return nil
}

// registryDown is the error of ping, which the command shows as it is.
type registryDown struct{ msg string }

func (e *registryDown) Error() string { return e.msg }

// encode returns the record value of m for topic and its content type. A
// payload that its schema cannot hold, or that has no schema, is a
// relay.Permanent error; a registry that cannot be reached is retryable. A
// nil v returns a nil value: the record holds m.Envelope.
func (v *values) encode(ctx context.Context, topic string, m *relay.Message) ([]byte, string, error) {
	if v == nil {
		return nil, "", nil
	}
	if m.Format != relay.FormatCloudEventsBinary {
		// Not permanent: every message would be dead-lettered. The relay
		// stalls, logging this, until the configuration is fixed.
		return nil, "", fmt.Errorf("sink.kafka.value_format %s needs envelope.format: cloudevents-binary (the value holds the payload; the envelope's attributes travel as ce_ headers), not %s; set envelope.format", v.format, m.Format)
	}
	version := 0
	for _, a := range m.Attributes {
		if a.Key == "schemaversion" {
			version, _ = strconv.Atoi(a.Value)
		}
	}
	k := schema.Key{EventType: m.EventType, Version: version}
	ext, ct := "json", ContentTypeConfluentJSONSchema
	if v.format == ValueConfluentAvro {
		ext, ct = "avsc", ContentTypeConfluentAvro
	}
	vs := v.schemas[k]
	if vs == nil {
		return nil, "", relay.Permanent(fmt.Errorf("value_format %s: no schema for %s: add %s/v%d.%s to %s", v.format, k, k.EventType, k.Version, ext, v.dir))
	}
	if m.ContentType != "" && m.ContentType != "application/json" {
		return nil, "", relay.Permanent(fmt.Errorf("value_format %s: the payload of %s is not JSON (%s); store it in a json or jsonb column", v.format, k, m.ContentType))
	}
	subject := vs.record
	if v.strategy == SubjectTopic {
		subject = topic + "-value"
	}
	id, err := v.id(ctx, subjectKey{subject, k}, vs)
	if err != nil {
		return nil, "", err
	}
	b, err := (&sr.ConfluentHeader{}).AppendEncode(make([]byte, 0, 5+len(m.Envelope)), id, nil)
	if err != nil {
		return nil, "", err
	}
	if vs.avro == nil {
		return append(b, m.Envelope...), ct, nil
	}
	a, err := encodeAvro(vs.avro, m.Envelope)
	if err != nil {
		return nil, "", relay.Permanent(fmt.Errorf("payload does not match Avro schema %s: %w", vs.file, err))
	}
	return append(b, a...), ct, nil
}

// id returns the registry's id of vs under k.subject, from the cache when
// the registry has been asked before.
func (v *values) id(ctx context.Context, k subjectKey, vs *valueSchema) (int, error) {
	if r, ok := v.cached(k); ok {
		return r.id, r.err
	}
	v.regMu.Lock()
	defer v.regMu.Unlock()
	if r, ok := v.cached(k); ok {
		return r.id, r.err
	}
	id, err := v.register(ctx, k.subject, vs)
	if ctx.Err() != nil && err != nil {
		return 0, err // not the registry's answer
	}
	v.mu.Lock()
	v.ids[k] = registered{id: id, err: err, until: v.now().Add(registryHold)}
	v.mu.Unlock()
	return id, err
}

func (v *values) cached(k subjectKey) (registered, bool) {
	v.mu.RLock()
	r, ok := v.ids[k]
	v.mu.RUnlock()
	return r, ok && (r.err == nil || v.now().Before(r.until))
}

// register registers vs under subject, which returns the id of an equal
// schema already registered. A registry that does not let the relay
// register (HTTP 403) is asked to look the schema up instead, for
// registries whose schemas are registered by CI.
func (v *values) register(ctx context.Context, subject string, vs *valueSchema) (int, error) {
	s := sr.Schema{Schema: vs.text, Type: sr.TypeJSON}
	if vs.avro != nil {
		s.Type = sr.TypeAvro
	}
	id, err := v.client.RegisterSchema(ctx, subject, s, -1, -1)
	var re *sr.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusForbidden {
		var ss sr.SubjectSchema
		ss, err = v.client.LookupSchema(ctx, subject, s)
		id = ss.ID
	}
	if err == nil {
		return id, nil
	}
	return 0, v.registryError(subject, vs, err)
}

// registryError is the error of a failed registration: permanent when the
// registry refuses this schema for this subject (incompatible, invalid, not
// registered and not registrable), retryable when the registry as a whole
// cannot be used (down, overloaded, refusing the credentials), so that a
// registry outage stalls the relay instead of dead-lettering.
func (v *values) registryError(subject string, vs *valueSchema, err error) error {
	var re *sr.ResponseError
	if !errors.As(err, &re) {
		return fmt.Errorf("schema registry at %s did not answer for subject %q: %w", v.url, subject, err)
	}
	what := fmt.Sprintf("the schema registry at %s refused %s for subject %q (HTTP %d, error %d: %s)", v.url, vs.file, subject, re.StatusCode, re.ErrorCode, re.Message)
	switch {
	case re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden:
		return fmt.Errorf("%s; check sink.kafka.schema_registry.username and password", what)
	case re.StatusCode == http.StatusNotFound:
		return relay.Permanent(fmt.Errorf("%s; the relay may not register schemas there, so register it, then replay the dead letters", what))
	case re.StatusCode == http.StatusConflict:
		return relay.Permanent(fmt.Errorf("%s; the schema is incompatible with the subject's latest version: publish an evolved version, or use subject_strategy record", what))
	case re.StatusCode >= 400 && re.StatusCode < 500 && re.StatusCode != http.StatusRequestTimeout && re.StatusCode != http.StatusTooManyRequests:
		return relay.Permanent(fmt.Errorf("%s; fix the schema", what))
	}
	return errors.New(what)
}
