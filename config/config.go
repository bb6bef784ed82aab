// Package config is the outboxrelay configuration file: YAML, with every key
// also settable as OUTBOXRELAY_<SECTION>_<KEY> in the environment, defaults,
// and validation that names the key to fix.
package config

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/relay"
)

// Config is the whole configuration file.
//
// A field tagged secret:"url" or secret:"text" holds a password (or a URL
// that may carry one). Each has a sibling key with the suffix _file that
// names a file to read it from, and Redacted hides it.
type Config struct {
	Postgres Postgres `yaml:"postgres"`
	Sink     Sink     `yaml:"sink"`
	Envelope Envelope `yaml:"envelope"`
	Relay    Relay    `yaml:"relay"`
	HTTP     HTTP     `yaml:"http"`
	Log      Log      `yaml:"log"`
}

// Postgres is the source database.
type Postgres struct {
	// URL of the database; the relay adds replication=database itself.
	// Every libpq TLS parameter (sslmode, sslrootcert, sslcert, sslkey,
	// sslpassword) is honoured, on the regular and the replication
	// connection alike.
	URL string `yaml:"url" secret:"url"`
	// URLFile names a file holding URL (a mounted secret).
	URLFile     string   `yaml:"url_file"`
	Slot        string   `yaml:"slot"`
	Publication string   `yaml:"publication"`
	Tables      []string `yaml:"tables"`
	// IgnoreTables are tables the publication also sends whose inserts the
	// relay must not publish; each skipped insert is counted in
	// outboxrelay_skipped_inserts_total. Any other table in the stream that
	// is not in Tables stops the relay.
	IgnoreTables []string      `yaml:"ignore_tables"`
	Columns      relay.Columns `yaml:"columns"`
	// CoverageInterval is how often the relay checks that its publication
	// still covers the outbox tables (default 1s).
	CoverageInterval time.Duration `yaml:"coverage_interval"`
	// MessagePrefix is the prefix of table-less outbox messages.
	MessagePrefix string `yaml:"message_prefix"`
	// StatusInterval is how often the confirmed position is sent to PostgreSQL.
	StatusInterval time.Duration `yaml:"status_interval"`
	// HeartbeatInterval is how often the relay writes a heartbeat message so
	// that an idle outbox does not pin WAL; 0 disables it.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// Retention deletes outbox rows older than this (by columns.created_at),
	// in small batches; 0 keeps every row. Delivery never depends on the
	// rows: the relay publishes from the WAL its slot retains.
	Retention time.Duration `yaml:"retention"`
}

// Envelope chooses the message format.
type Envelope struct {
	// Format is "envelope" (outboxrelay's envelope, version 1),
	// "cloudevents" (CloudEvents 1.0, structured content mode) or
	// "cloudevents-binary" (binary content mode).
	Format string `yaml:"format"`
	// Source is the CloudEvents source attribute (a URI reference).
	Source string `yaml:"source"`
}

// Sink chooses and configures the broker.
type Sink struct {
	Type     string   `yaml:"type"`
	Kafka    Kafka    `yaml:"kafka"`
	RabbitMQ RabbitMQ `yaml:"rabbitmq"`
	NATS     NATS     `yaml:"nats"`
	Redis    Redis    `yaml:"redis"`
}

// NATS configures sinks/nats (JetStream).
type NATS struct {
	URL     string `yaml:"url" secret:"url"`
	URLFile string `yaml:"url_file"`
	Subject string `yaml:"subject"`
	Stream  string `yaml:"stream"`
	// CreateStream creates Stream, on the template's subject prefix, when it is missing.
	CreateStream    bool          `yaml:"create_stream"`
	DuplicateWindow time.Duration `yaml:"duplicate_window"`
	MaxPending      int           `yaml:"max_pending"`
	AckTimeout      time.Duration `yaml:"ack_timeout"`
	CredentialsFile string        `yaml:"credentials_file"`
}

// Redis configures sinks/redis (Redis Streams).
type Redis struct {
	URL     string `yaml:"url" secret:"url"`
	URLFile string `yaml:"url_file"`
	Stream  string `yaml:"stream"`
	// MaxLen trims each stream to about this many entries (MAXLEN ~); 0 never trims.
	MaxLen     int64 `yaml:"max_len"`
	BatchSize  int   `yaml:"batch_size"`
	MaxPending int   `yaml:"max_pending"`
}

// Kafka configures sinks/kafka.
type Kafka struct {
	Brokers []string      `yaml:"brokers"`
	Topic   string        `yaml:"topic"`
	Linger  time.Duration `yaml:"linger"`
	TLS     TLS           `yaml:"tls"`
	SASL    SASL          `yaml:"sasl"`
}

// SASL authenticates the Kafka client.
type SASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty disables SASL.
	Mechanism    string `yaml:"mechanism"`
	Username     string `yaml:"username"`
	Password     string `yaml:"password" secret:"text"`
	PasswordFile string `yaml:"password_file"`
}

// SASL mechanisms sink.kafka.sasl.mechanism accepts.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// TLS configures a client's TLS connections to a broker. Files are PEM.
type TLS struct {
	// Enabled turns TLS on (Kafka). For RabbitMQ an amqps:// URL does.
	Enabled bool `yaml:"enabled"`
	// CAFile holds the certificates that may sign the server's; empty
	// trusts the system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the client certificate and its key, for
	// servers that authenticate clients by certificate.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name the server's certificate must carry; empty
	// means the host the client dials.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any server certificate. For tests only:
	// it gives up the protection TLS is there for.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// configured reports whether any setting beyond Enabled is set.
func (t TLS) configured() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify
}

// clientConfig builds the client's tls.Config from t, reading its files.
// Errors name the key under prefix (sink.kafka.tls) to fix.
func (t TLS) clientConfig(prefix string) (*tls.Config, error) {
	c := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // the operator's explicit choice, documented as unsafe
	}
	if t.CAFile != "" {
		pem, err := readFile(t.CAFile, maxPEMFile)
		if err != nil {
			return nil, fmt.Errorf("%s.ca_file: %w", prefix, err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s.ca_file %s holds no PEM certificate", prefix, t.CAFile)
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		certPEM, err := readFile(t.CertFile, maxPEMFile)
		if err != nil {
			return nil, fmt.Errorf("%s.cert_file: %w", prefix, err)
		}
		keyPEM, err := readFile(t.KeyFile, maxPEMFile)
		if err != nil {
			return nil, fmt.Errorf("%s.key_file: %w", prefix, err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("%s.cert_file and key_file: %w", prefix, err)
		}
		c.Certificates = []tls.Certificate{cert}
	case t.CertFile != "" || t.KeyFile != "":
		return nil, fmt.Errorf("%s.cert_file and %s.key_file must be set together", prefix, prefix)
	}
	return c, nil
}

// TLSConfig returns the TLS settings of the Kafka connections, or nil when
// sink.kafka.tls.enabled is false.
func (k Kafka) TLSConfig() (*tls.Config, error) {
	if !k.TLS.Enabled {
		return nil, nil
	}
	return k.TLS.clientConfig("sink.kafka.tls")
}

// RabbitMQ configures sinks/rabbitmq.
type RabbitMQ struct {
	URL          string `yaml:"url" secret:"url"`
	URLFile      string `yaml:"url_file"`
	Exchange     string `yaml:"exchange"`
	RoutingKey   string `yaml:"routing_key"`
	Declare      bool   `yaml:"declare"`
	ExchangeType string `yaml:"exchange_type"`
	Durable      bool   `yaml:"durable"`
	// TLS applies to amqps:// URLs.
	TLS TLS `yaml:"tls"`
	// Auth is "plain" (the URL's user and password) or "external" (the
	// client certificate, SASL EXTERNAL; needs amqps:// and
	// tls.cert_file/key_file, and the broker's rabbitmq_auth_mechanism_ssl
	// plugin).
	Auth string `yaml:"auth"`
}

// TLSConfig returns the TLS settings of an amqps:// connection, or nil
// when none are configured (amqps:// then verifies the server against the
// system's roots and the URL's host).
func (r RabbitMQ) TLSConfig() (*tls.Config, error) {
	if !r.TLS.configured() {
		return nil, nil
	}
	return r.TLS.clientConfig("sink.rabbitmq.tls")
}

// Relay tunes the pipeline.
type Relay struct {
	MaxInFlight      int           `yaml:"max_inflight"`
	MaxInFlightBytes int64         `yaml:"max_inflight_bytes"`
	MaxAttempts      int           `yaml:"max_attempts"`
	DrainTimeout     time.Duration `yaml:"drain_timeout"`
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
}

// Log configures logging.
type Log struct {
	Level string `yaml:"level"`
}

// Default returns the configuration used for keys that are not set.
func Default() Config {
	return Config{
		Postgres: Postgres{
			Slot: "outboxrelay", Publication: "outboxrelay", Tables: []string{"public.outbox"},
			Columns: relay.DefaultColumns(), MessagePrefix: "outboxrelay",
			StatusInterval: time.Second, HeartbeatInterval: 10 * time.Second, CoverageInterval: time.Second,
		},
		Sink: Sink{
			Type:  "kafka",
			Kafka: Kafka{Topic: "outbox.{aggregate_type}"},
			RabbitMQ: RabbitMQ{
				Exchange: "outbox", RoutingKey: "{aggregate_type}.{event_type}",
				ExchangeType: "topic", Durable: true, Auth: "plain",
			},
			NATS: NATS{
				URL: "nats://127.0.0.1:4222", Subject: "outbox.{aggregate_type}.{event_type}", Stream: "OUTBOX",
				DuplicateWindow: 2 * time.Minute, MaxPending: 4000, AckTimeout: 10 * time.Second,
			},
			Redis: Redis{URL: "redis://127.0.0.1:6379/0", Stream: "outbox:{aggregate_type}", BatchSize: 256, MaxPending: 10000},
		},
		Envelope: Envelope{Format: "envelope", Source: "outboxrelay"},
		Relay:    Relay{MaxInFlight: 10000, MaxInFlightBytes: 64 << 20, MaxAttempts: 5, DrainTimeout: 30 * time.Second, DeadLetters: true, Schemas: Schemas{Missing: SchemasAllow}},
		HTTP:     HTTP{Listen: "127.0.0.1:9187"},
		Log:      Log{Level: "info"},
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

func load(data []byte, name string, lookup func(string) (string, bool)) (Config, error) {
	cfg := Default()
	if len(data) > 0 {
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) { // an empty file is fine
			return cfg, fmt.Errorf("config %s: %w", name, err)
		}
	}
	fromEnv := map[string]bool{}
	if lookup != nil {
		if err := applyEnv(reflect.ValueOf(&cfg).Elem(), "", EnvPrefix[:len(EnvPrefix)-1], lookup, fromEnv); err != nil {
			return cfg, err
		}
	}
	if err := cfg.readSecretFiles(fromEnv); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// Redacted is what a hidden secret is shown as.
const Redacted = "xxxxx"

// maxSecretFile bounds a secret file: a URL or a password, never a stream.
const maxSecretFile = 64 << 10

// ReadSecretFile reads a secret (a password, token or URL) from a file,
// such as a mounted Kubernetes or Docker secret, without its trailing
// newline. The file must be a regular file of at most 64 KiB and not empty.
// Errors name the file, never its content.
func ReadSecretFile(path string) (string, error) {
	b, err := readFile(path, maxSecretFile)
	if err != nil {
		return "", err
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

// maxPEMFile bounds a certificate, key or CA bundle file.
const maxPEMFile = 1 << 20

// readFile reads a regular file of at most limit bytes, so that a
// configuration naming a device or a pipe fails instead of hanging.
func readFile(path string, limit int64) ([]byte, error) {
	// Stat before opening: opening a FIFO would block.
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return b, nil
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
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := yamlName(f)
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)) {
			walkSecrets(v.Field(i), joinPath(path, name), fn)
			continue
		}
		kind := f.Tag.Get("secret")
		if kind == "" {
			continue
		}
		var file reflect.Value
		for j := 0; j < t.NumField(); j++ {
			if yamlName(t.Field(j)) == name+"_file" {
				file = v.Field(j)
			}
		}
		fn(joinPath(path, name), kind, v.Field(i), file)
	}
}

func yamlName(f reflect.StructField) string {
	return strings.Split(f.Tag.Get("yaml"), ",")[0]
}

// Redacted returns a copy of c with every secret hidden: passwords and
// tokens become xxxxx, URLs keep everything but their passwords.
func (c Config) Redacted() Config {
	walkSecrets(reflect.ValueOf(&c).Elem(), "", func(_, kind string, val, _ reflect.Value) {
		switch {
		case val.String() == "":
		case kind == "url":
			val.SetString(RedactURL(val.String()))
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

// RedactURL hides the passwords of a connection URL (its userinfo
// password, and query parameters such as password and sslpassword) or of a
// key=value DSN, keeping the rest readable.
func RedactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Opaque != "" {
		return cdc.RedactURL(s)
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Redacted)
		}
	}
	// Query parameters are redacted in place, so that the rest of the
	// query reads as written.
	params := strings.Split(u.RawQuery, "&")
	for i, p := range params {
		k, _, ok := strings.Cut(p, "=")
		if key, err := url.QueryUnescape(k); ok && (err != nil || strings.Contains(strings.ToLower(key), "password")) {
			params[i] = k + "=" + Redacted
		}
	}
	u.RawQuery = strings.Join(params, "&")
	// A list of URLs (NATS takes one) parses as one: hide the passwords of
	// the others too.
	return userinfoPassword.ReplaceAllString(u.String(), "${1}"+Redacted+"@")
}

var userinfoPassword = regexp.MustCompile(`(://[^:/@\s]*:)[^@\s/]*@`)

// Key is one configuration key.
type Key struct {
	Path    string // postgres.url
	Env     string // OUTBOXRELAY_POSTGRES_URL
	Default string
}

// Keys lists every configuration key with its environment name and default,
// in file order. The README's reference is checked against it.
func Keys() []Key {
	var keys []Key
	var walk func(v reflect.Value, path, env string)
	walk = func(v reflect.Value, path, env string) {
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := strings.Split(f.Tag.Get("yaml"), ",")[0]
			p, e := joinPath(path, name), env+"_"+strings.ToUpper(name)
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)) {
				walk(v.Field(i), p, e)
				continue
			}
			keys = append(keys, Key{Path: p, Env: e, Default: format(v.Field(i))})
		}
	}
	walk(reflect.ValueOf(Default()), "", EnvPrefix[:len(EnvPrefix)-1])
	return keys
}

func joinPath(a, b string) string {
	if a == "" {
		return b
	}
	return a + "." + b
}

func format(v reflect.Value) string {
	switch x := v.Interface().(type) {
	case []string:
		return strings.Join(x, ",")
	case time.Duration:
		return x.String()
	default:
		return fmt.Sprint(x)
	}
}

// applyEnv sets the fields of v found in the environment and records their
// keys in set.
func applyEnv(v reflect.Value, path, env string, lookup func(string) (string, bool), set map[string]bool) error {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := yamlName(f)
		p, e := joinPath(path, name), env+"_"+strings.ToUpper(name)
		fv := v.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)) {
			if err := applyEnv(fv, p, e, lookup, set); err != nil {
				return err
			}
			continue
		}
		s, ok := lookup(e)
		if !ok {
			continue
		}
		if err := setValue(fv, s); err != nil {
			return fmt.Errorf("environment %s: %w", e, err)
		}
		set[p] = true
	}
	return nil
}

func setValue(v reflect.Value, s string) error {
	switch v.Interface().(type) {
	case time.Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%q is not a duration like 10s", s)
		}
		v.SetInt(int64(d))
		return nil
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

// Validate checks every key and reports all problems at once, each naming its key.
func (c *Config) Validate() error {
	var errs []error
	if c.Postgres.URL == "" {
		errs = append(errs, errors.New("postgres.url is required (or OUTBOXRELAY_POSTGRES_URL)"))
	}
	cc := c.CDC()
	if err := cc.Validate(); err != nil && c.Postgres.URL != "" {
		errs = append(errs, err)
	} else if err != nil {
		// Report the other postgres problems without repeating the URL one.
		for _, e := range splitJoined(err) {
			if !strings.HasPrefix(e.Error(), "postgres.url") {
				errs = append(errs, e)
			}
		}
	}
	for name, v := range map[string]string{"id": c.Postgres.Columns.ID, "aggregate_type": c.Postgres.Columns.AggregateType,
		"aggregate_id": c.Postgres.Columns.AggregateID, "event_type": c.Postgres.Columns.EventType, "payload": c.Postgres.Columns.Payload} {
		if v == "" {
			errs = append(errs, fmt.Errorf("postgres.columns.%s must name a column", name))
		}
	}
	if c.Postgres.StatusInterval < 100*time.Millisecond || c.Postgres.StatusInterval > 10*time.Second {
		errs = append(errs, fmt.Errorf("postgres.status_interval %s must be between 100ms and 10s", c.Postgres.StatusInterval))
	}
	if c.Postgres.HeartbeatInterval < 0 {
		errs = append(errs, fmt.Errorf("postgres.heartbeat_interval %s must not be negative", c.Postgres.HeartbeatInterval))
	}
	switch c.Sink.Type {
	case "kafka":
		if len(c.Sink.Kafka.Brokers) == 0 {
			errs = append(errs, errors.New("sink.kafka.brokers needs at least one host:port"))
		}
		errs = append(errs, c.Sink.Kafka.validateSecurity()...)
	case "rabbitmq":
		if c.Sink.RabbitMQ.URL == "" {
			errs = append(errs, errors.New("sink.rabbitmq.url is required (or sink.rabbitmq.url_file)"))
		}
		errs = append(errs, c.Sink.RabbitMQ.validateSecurity()...)
	case "nats":
		if c.Sink.NATS.URL == "" {
			errs = append(errs, errors.New("sink.nats.url is required"))
		}
	case "redis":
		if c.Sink.Redis.URL == "" {
			errs = append(errs, errors.New("sink.redis.url is required"))
		}
	default:
		errs = append(errs, fmt.Errorf("sink.type %q is not one of kafka, rabbitmq, nats, redis", c.Sink.Type))
	}
	switch c.Envelope.Format {
	case "envelope":
	case "cloudevents", "cloudevents-binary":
		if c.Envelope.Source == "" {
			errs = append(errs, errors.New("envelope.source must be a URI reference for CloudEvents"))
		}
	default:
		errs = append(errs, fmt.Errorf("envelope.format %q is not one of envelope, cloudevents, cloudevents-binary", c.Envelope.Format))
	}
	if c.Postgres.Retention < 0 {
		errs = append(errs, fmt.Errorf("postgres.retention %s must not be negative", c.Postgres.Retention))
	}
	if c.Relay.MaxInFlight < 1 {
		errs = append(errs, errors.New("relay.max_inflight must be at least 1"))
	}
	if c.Relay.MaxInFlightBytes < 1<<10 {
		errs = append(errs, errors.New("relay.max_inflight_bytes must be at least 1024"))
	}
	if c.Relay.MaxAttempts < 1 {
		errs = append(errs, errors.New("relay.max_attempts must be at least 1"))
	}
	switch c.Relay.Schemas.Missing {
	case SchemasAllow, SchemasDeadLetter:
	default:
		errs = append(errs, fmt.Errorf("relay.schemas.missing %q is not one of allow, deadletter", c.Relay.Schemas.Missing))
	}
	if t := c.HTTP.Token; t != "" && strings.IndexFunc(t, func(r rune) bool { return r <= ' ' || r >= 0x7f }) >= 0 {
		errs = append(errs, errors.New("http.token must be printable ASCII without spaces"))
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log.level %q is not one of debug, info, warn, error", c.Log.Level))
	}
	return errors.Join(errs...)
}

func (k Kafka) validateSecurity() []error {
	var errs []error
	if k.TLS.configured() && !k.TLS.Enabled {
		errs = append(errs, errors.New("sink.kafka.tls has settings but sink.kafka.tls.enabled is false; set sink.kafka.tls.enabled: true"))
	}
	if _, err := k.TLSConfig(); err != nil {
		errs = append(errs, err)
	}
	s := k.SASL
	switch s.Mechanism {
	case "":
		if s.Username != "" || s.Password != "" {
			errs = append(errs, errors.New("sink.kafka.sasl has a username or password but no mechanism; set sink.kafka.sasl.mechanism to PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"))
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if s.Username == "" {
			errs = append(errs, fmt.Errorf("sink.kafka.sasl.username is required for %s", s.Mechanism))
		}
		if s.Password == "" {
			errs = append(errs, fmt.Errorf("sink.kafka.sasl.password (or password_file) is required for %s", s.Mechanism))
		}
	default:
		errs = append(errs, fmt.Errorf("sink.kafka.sasl.mechanism %q is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512", s.Mechanism))
	}
	return errs
}

func (r RabbitMQ) validateSecurity() []error {
	var errs []error
	amqps := strings.HasPrefix(strings.ToLower(r.URL), "amqps://")
	if (r.TLS.Enabled || r.TLS.configured()) && !amqps && r.URL != "" {
		errs = append(errs, errors.New("sink.rabbitmq.tls is set but sink.rabbitmq.url is not amqps://; use an amqps:// URL"))
	}
	if _, err := r.TLSConfig(); err != nil {
		errs = append(errs, err)
	}
	switch r.Auth {
	case "plain":
	case "external":
		if !amqps || r.TLS.CertFile == "" {
			errs = append(errs, errors.New("sink.rabbitmq.auth external authenticates with the client certificate; use an amqps:// url and set sink.rabbitmq.tls.cert_file and key_file"))
		}
	default:
		errs = append(errs, fmt.Errorf("sink.rabbitmq.auth %q is not one of plain, external", r.Auth))
	}
	return errs
}

func splitJoined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// CDC returns the replication settings.
func (c *Config) CDC() cdc.Config {
	return cdc.Config{
		URL: c.Postgres.URL, Slot: c.Postgres.Slot, Publication: c.Postgres.Publication, Tables: c.Postgres.Tables,
		IgnoreTables:   c.Postgres.IgnoreTables,
		StatusInterval: c.Postgres.StatusInterval, DrainTimeout: c.Relay.DrainTimeout,
	}
}
