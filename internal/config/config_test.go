package config

import (
	"github.com/outboxrelay/outboxrelay/internal/cpusched"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/kafka"
	"github.com/outboxrelay/outboxrelay/sinks/nats"
	"github.com/outboxrelay/outboxrelay/sinks/rabbitmq"
	"github.com/outboxrelay/outboxrelay/sinks/redis"
)

func env(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := kv[k]
		return v, ok
	}
}

func writeTemp(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const minimal = `
postgres:
  url: postgres://relay@127.0.0.1/shop
sink:
  kafka:
    brokers: [127.0.0.1:9092]
`

func TestLoadMinimal(t *testing.T) {
	cfg, err := Load(writeTemp(t, "c.yaml", minimal), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if SinkAs[*rabbitmq.Config](cfg.Sink).Auth != "plain" || cfg.HTTP.Listen != "127.0.0.1:9187" {
		t.Errorf("defaults not applied: %+v", cfg)
	}
}

// TestSecretFiles: every secret can come from a file, read at load time
// without its trailing newline; the environment names the file too, and
// wins over the configuration file.
func TestSecretFiles(t *testing.T) {
	pgURL := writeTemp(t, "pgurl", "postgres://relay:from-file@127.0.0.1/shop\n")
	password := writeTemp(t, "password", "kafka-pass\r\n")
	token := writeTemp(t, "token", "http-token")
	amqpURL := writeTemp(t, "amqp", "amqp://u:p@127.0.0.1/\n\n")
	yml := `
postgres:
  url_file: ` + pgURL + `
sink:
  kafka:
    brokers: [127.0.0.1:9092]
    sasl:
      mechanism: SCRAM-SHA-256
      username: relay
      password_file: ` + password + `
  rabbitmq:
    url_file: ` + amqpURL + `
http:
  token_file: ` + token + `
`
	cfg, err := Load(writeTemp(t, "c.yaml", yml), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	for got, want := range map[string]string{
		cfg.Postgres.URL: "postgres://relay:from-file@127.0.0.1/shop",
		SinkAs[*kafka.Config](cfg.Sink).SASL.Password: "kafka-pass",
		cfg.HTTP.Token:                         "http-token",
		SinkAs[*rabbitmq.Config](cfg.Sink).URL: "amqp://u:p@127.0.0.1/",
	} {
		if got != want {
			t.Errorf("read %q, want %q", got, want)
		}
	}

	// The environment's value wins over the file's _file, and the
	// environment's _file over the file's value.
	cfg, err = Load(writeTemp(t, "c.yaml", yml), env(map[string]string{"OUTBOXRELAY_POSTGRES_URL": "postgres://relay:from-env@127.0.0.1/shop"}))
	if err != nil || cfg.Postgres.URL != "postgres://relay:from-env@127.0.0.1/shop" {
		t.Errorf("env URL over url_file: %q, %v", cfg.Postgres.URL, err)
	}
	cfg, err = Load(writeTemp(t, "c.yaml", minimal), env(map[string]string{"OUTBOXRELAY_POSTGRES_URL_FILE": pgURL}))
	if err != nil || cfg.Postgres.URL != "postgres://relay:from-file@127.0.0.1/shop" {
		t.Errorf("env url_file over url: %q, %v", cfg.Postgres.URL, err)
	}
	cfg, err = Load("", env(map[string]string{
		"OUTBOXRELAY_POSTGRES_URL_FILE": pgURL, "OUTBOXRELAY_SINK_KAFKA_BROKERS": "k:9092",
		"OUTBOXRELAY_SINK_KAFKA_SASL_MECHANISM": "PLAIN", "OUTBOXRELAY_SINK_KAFKA_SASL_USERNAME": "u",
		"OUTBOXRELAY_SINK_KAFKA_SASL_PASSWORD_FILE": password, "OUTBOXRELAY_HTTP_TOKEN_FILE": token,
	}))
	if err != nil || SinkAs[*kafka.Config](cfg.Sink).SASL.Password != "kafka-pass" || cfg.HTTP.Token != "http-token" {
		t.Errorf("secrets from env files: %+v, %v", SinkAs[*kafka.Config](cfg.Sink).SASL, err)
	}

	for name, tc := range map[string]struct {
		yml  string
		env  map[string]string
		want string
	}{
		"both in the file": {"postgres:\n  url: postgres://x@h/db\n  url_file: " + pgURL + "\n", nil, "postgres.url and postgres.url_file are both set"},
		"both in the env":  {"", map[string]string{"OUTBOXRELAY_POSTGRES_URL": "x", "OUTBOXRELAY_POSTGRES_URL_FILE": pgURL}, "both set"},
		"missing file":     {"postgres:\n  url_file: /nonexistent/url\n", nil, "postgres.url_file: stat /nonexistent/url"},
		"empty file":       {"postgres:\n  url_file: " + writeTemp(t, "empty", "\n") + "\n", nil, "is empty"},
		"not a file":       {"postgres:\n  url_file: " + t.TempDir() + "\n", nil, "not a regular file"},
	} {
		_, err := Load(writeTemp(t, "c.yaml", tc.yml), env(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "from-file") {
			t.Errorf("%s: the error shows the secret: %v", name, err)
		}
	}
}

// TestEverySecretHasAFile: each secret key has its _file sibling, so no
// secret ever has to be written into the configuration file.
func TestEverySecretHasAFile(t *testing.T) {
	n := 0
	cfg := Default()
	walkSecrets(reflect.ValueOf(&cfg).Elem(), "", func(key, kind string, _, file reflect.Value) {
		n++
		if !file.IsValid() {
			t.Errorf("%s has no %s_file", key, key)
		}
		if kind != "url" && kind != "text" {
			t.Errorf("%s: secret kind %q", key, kind)
		}
	})
	if n != 19 {
		t.Errorf("%d secrets, want 19 (postgres.url, sink.kafka.sasl.password, sink.kafka.schema_registry.url and password, sink.rabbitmq.url, sink.nats.url, sink.redis.url, sink.sns, sink.sqs and sink.kinesis secret_access_key and session_token, sink.webhook.url, secret, password and bearer_token, http.token, http.action_token)", n)
	}
	keys := map[string]string{}
	for _, k := range Keys() {
		keys[k.Path] = k.Env
	}
	for path, env := range map[string]string{
		"postgres.url_file":             "OUTBOXRELAY_POSTGRES_URL_FILE",
		"sink.kafka.sasl.password_file": "OUTBOXRELAY_SINK_KAFKA_SASL_PASSWORD_FILE",
		"sink.kafka.tls.ca_file":        "OUTBOXRELAY_SINK_KAFKA_TLS_CA_FILE",
		"sink.rabbitmq.tls.server_name": "OUTBOXRELAY_SINK_RABBITMQ_TLS_SERVER_NAME",
		"sink.rabbitmq.auth":            "OUTBOXRELAY_SINK_RABBITMQ_AUTH",
		"http.token_file":               "OUTBOXRELAY_HTTP_TOKEN_FILE",
	} {
		if keys[path] != env {
			t.Errorf("key %s: env %q, want %q", path, keys[path], env)
		}
	}
}

// TestRedacted: the printed configuration hides every secret and keeps
// everything else, URLs included, readable.
func TestRedacted(t *testing.T) {
	const secret = "S3cr3t-Canary"
	cfg := Default()
	cfg.Postgres.URL = "postgres://relay:" + secret + "@db:5432/shop?sslmode=verify-full&sslrootcert=/etc/ca.pem&sslpassword=" + secret
	SinkAs[*kafka.Config](cfg.Sink).SASL.Password = secret
	SinkAs[*rabbitmq.Config](cfg.Sink).URL = "amqps://relay:" + secret + "@mq:5671/vhost"
	SinkAs[*nats.Config](cfg.Sink).URL = "nats://relay:" + secret + "@n1:4222,nats://relay:" + secret + "@n2:4222"
	SinkAs[*redis.Config](cfg.Sink).URL = "redis://:" + secret + "@redis:6379/0"
	cfg.HTTP.Token = secret
	out, err := cfg.RedactedYAML()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), secret) {
		t.Fatalf("secret in the printed configuration:\n%s", out)
	}
	for _, want := range []string{
		"url: postgres://relay:xxxxx@db:5432/shop?sslmode=verify-full&sslrootcert=/etc/ca.pem&sslpassword=xxxxx",
		"url: amqps://relay:xxxxx@mq:5671/vhost",
		"url: redis://:xxxxx@redis:6379/0",
		"password: xxxxx",
		"token: xxxxx",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("printed configuration lacks %q:\n%s", want, out)
		}
	}
	if cfg.HTTP.Token != secret {
		t.Error("Redacted changed its receiver")
	}
	for in, want := range map[string]string{
		"host=db user=relay password=" + secret + " dbname=shop": "host=db user=relay password=xxxxx dbname=shop",
		"postgres://relay@db/shop":                               "postgres://relay@db/shop",
		"amqp://guest:guest@127.0.0.1:5672/":                     "amqp://guest:xxxxx@127.0.0.1:5672/",
	} {
		if got := redact.URL(in); got != want {
			t.Errorf("redact.URL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestValidateSecurity(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		yml  string
		want string
	}{
		"tls settings without enabled": {"sink:\n  kafka:\n    tls:\n      ca_file: /x\n", "sink.kafka.tls.enabled is false"},
		"missing ca":                   {"sink:\n  kafka:\n    tls:\n      enabled: true\n      ca_file: " + dir + "/none.pem\n", "sink.kafka.tls.ca_file"},
		"not pem":                      {"sink:\n  kafka:\n    tls:\n      enabled: true\n      ca_file: " + writeTemp(t, "ca.pem", "nope") + "\n", "holds no PEM certificate"},
		"cert without key":             {"sink:\n  kafka:\n    tls:\n      enabled: true\n      cert_file: /x\n", "must be set together"},
		"unknown mechanism":            {"sink:\n  kafka:\n    sasl:\n      mechanism: GSSAPI\n", `mechanism "GSSAPI" is not one of`},
		"no password":                  {"sink:\n  kafka:\n    sasl:\n      mechanism: PLAIN\n      username: u\n", "sink.kafka.sasl.password (or password_file) is required"},
		"password without mechanism":   {"sink:\n  kafka:\n    sasl:\n      username: u\n      password: p\n", "no mechanism"},
		"rabbitmq tls on amqp":         {"sink:\n  type: rabbitmq\n  rabbitmq:\n    url: amqp://u:p@h/\n    tls:\n      server_name: mq\n", "not amqps://"},
		"external without cert":        {"sink:\n  type: rabbitmq\n  rabbitmq:\n    url: amqps://h/\n    auth: external\n", "auth external authenticates with the client certificate"},
		"unknown auth":                 {"sink:\n  type: rabbitmq\n  rabbitmq:\n    url: amqps://h/\n    auth: token\n", `auth "token" is not one of`},
		"token with space":             {"http:\n  token: a b\n", "http.token must be printable"},
	} {
		yml := "postgres:\n  url: postgres://relay@127.0.0.1/shop\n" + tc.yml
		if !strings.Contains(tc.yml, "brokers") && !strings.Contains(tc.yml, "type: rabbitmq") {
			yml = strings.Replace(yml, "sink:\n  kafka:\n", "sink:\n  kafka:\n    brokers: [k:9092]\n", 1)
			if !strings.Contains(yml, "brokers") {
				yml += "sink:\n  kafka:\n    brokers: [k:9092]\n"
			}
		}
		_, err := Load(writeTemp(t, "c.yaml", yml), env(nil))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, tc.want)
		}
	}
}

// FuzzLoad: no configuration file, however malformed, makes the loader
// (or printing the result) panic or hang.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(minimal))
	f.Add([]byte("postgres: {url: 'x', tables: [a.b, c]}\nsink: {type: rabbitmq, rabbitmq: {url: 'amqps://u:p@h/', auth: external}}"))
	f.Add([]byte("sink:\n  kafka:\n    tls: {enabled: true, ca_file: /dev/zero}\n    sasl: {mechanism: PLAIN, password_file: /dev/stdin}\n"))
	f.Add([]byte("http: [1, 2]\nlog: {level: 3}\n"))
	f.Add([]byte("a: &a [*a, *a]\n"))
	f.Add([]byte("postgres:\n  status_interval: 99999999999h\n  columns: {id: ''}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := load(data, "fuzz.yaml", nil)
		if err != nil {
			_ = err.Error()
			return
		}
		if _, err := cfg.RedactedYAML(); err != nil {
			t.Fatalf("a loaded configuration does not print: %v", err)
		}
	})
}

// TestRedactedNATSToken: a NATS URL may carry a token as its user name;
// the printed configuration hides it like a password.
func TestRedactedNATSToken(t *testing.T) {
	const token = "S3cr3t-Token"
	cfg := Default()
	SinkAs[*nats.Config](cfg.Sink).URL = "nats://" + token + "@n1:4222,nats://n2:4222"
	out, err := cfg.RedactedYAML()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), token) || !strings.Contains(string(out), "nats://xxxxx@n1:4222,nats://n2:4222") {
		t.Errorf("NATS token not hidden in the printed configuration:\n%s", out)
	}
}

// TestConfluentNeedsBinaryCloudEvents: a Confluent value format with an
// envelope format that puts the whole envelope in the value is refused at
// load time, naming both settings, instead of stalling the relay.
func TestConfluentNeedsBinaryCloudEvents(t *testing.T) {
	dir := t.TempDir()
	base := `
postgres:
  url: postgres://localhost/app
  tables: [public.outbox]
sink:
  type: kafka
  kafka:
    brokers: [localhost:9092]
    value_format: confluent-json-schema
    schemas_dir: ` + dir + `
    schema_registry:
      url: http://localhost:8081
`
	_, err := Load(writeTemp(t, "c.yaml", base), env(nil))
	if err == nil || !strings.Contains(err.Error(), "sink.kafka.value_format confluent-json-schema needs envelope.format: cloudevents-binary") {
		t.Fatalf("envelope format: got %v, want the value_format/envelope.format error", err)
	}
	ok := base + `
envelope:
  format: cloudevents-binary
  source: /orders
`
	if _, err := Load(writeTemp(t, "c.yaml", ok), env(nil)); err != nil {
		t.Fatalf("cloudevents-binary: %v", err)
	}
}

// TestSectionsReachTheirPackages: the keys of the sections that embed
// relay.Config and cdc.Config, and those of other sections that belong to
// the relay or the stream, reach RelayConfig and CDC, from the file and
// from the environment alike.
func TestSectionsReachTheirPackages(t *testing.T) {
	body := `postgres:
  url: postgres://relay@127.0.0.1/shop
  columns:
    id: event_id
  message_prefix: billing
  status_interval: 2s
sink:
  kafka:
    brokers: [127.0.0.1:9092]
envelope:
  format: cloudevents
  source: /shop
relay:
  max_attempts: 9
  dead_letter_order: pass
  drain_timeout: 4s
`
	cfg, err := Load(writeTemp(t, "relay.yaml", body), env(map[string]string{
		"OUTBOXRELAY_RELAY_MAX_INFLIGHT": "123", "OUTBOXRELAY_POSTGRES_TABLES": "app.events,outbox",
	}))
	if err != nil {
		t.Fatal(err)
	}
	rc := cfg.RelayConfig()
	if rc.Columns.ID != "event_id" || rc.Columns.Payload != "payload" || rc.MessagePrefix != "billing" {
		t.Errorf("relay outbox: %+v", rc.Outbox)
	}
	if rc.Format != relay.FormatCloudEvents || rc.CloudEventsSource != "/shop" {
		t.Errorf("relay envelope: %+v", rc.Envelope)
	}
	if rc.MaxAttempts != 9 || rc.MaxInFlight != 123 || rc.MaxInFlightBytes != 64<<20 || rc.DeadLetterOrder != relay.DeadLetterPass {
		t.Errorf("relay section: %+v", rc)
	}
	if !reflect.DeepEqual(rc.Tables, []string{"app.events", "public.outbox"}) || rc.MessagingSystem != "kafka" {
		t.Errorf("relay tables %q, messaging system %q", rc.Tables, rc.MessagingSystem)
	}
	cc := cfg.CDC()
	if cc.StatusInterval != 2*time.Second || cc.DrainTimeout != 4*time.Second || cc.Slot != "outboxrelay" ||
		!reflect.DeepEqual(cc.Tables, []string{"app.events", "outbox"}) || cc.URL != "postgres://relay@127.0.0.1/shop" {
		t.Errorf("cdc: %+v", cc)
	}
	// The file's defaults are the packages' own.
	def := Default()
	if want := (relay.Config{}).WithDefaults(); def.Relay.MaxInFlight != want.MaxInFlight || def.Envelope != want.Envelope || !reflect.DeepEqual(def.Postgres.Outbox, want.Outbox) {
		t.Errorf("defaults: relay %+v, envelope %+v, outbox %+v; want those of relay.Config{}.WithDefaults()", def.Relay.Config, def.Envelope, def.Postgres.Outbox)
	}
	if want := (cdc.Config{}).WithDefaults(); def.Postgres.StatusInterval != want.StatusInterval || def.Relay.DrainTimeout != want.DrainTimeout {
		t.Errorf("defaults: status interval %s, drain timeout %s; want those of cdc.Config{}.WithDefaults()", def.Postgres.StatusInterval, def.Relay.DrainTimeout)
	}
}

// process.cpu_scheduling is batch unless set; inherited comes from the file
// or the environment; anything else is one clear error.
func TestCPUScheduling(t *testing.T) {
	cfg, err := Load(writeTemp(t, "c.yaml", minimal), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Process.CPUScheduling != cpusched.Batch {
		t.Errorf("default process.cpu_scheduling = %q, want batch", cfg.Process.CPUScheduling)
	}
	cfg, err = Load(writeTemp(t, "c.yaml", minimal+"process:\n  cpu_scheduling: inherited\n"), env(nil))
	if err != nil || cfg.Process.CPUScheduling != cpusched.Inherited {
		t.Errorf("from the file: %q, %v; want inherited", cfg.Process.CPUScheduling, err)
	}
	cfg, err = Load(writeTemp(t, "c.yaml", minimal), env(map[string]string{"OUTBOXRELAY_PROCESS_CPU_SCHEDULING": "inherited"}))
	if err != nil || cfg.Process.CPUScheduling != cpusched.Inherited {
		t.Errorf("from the environment: %q, %v; want inherited", cfg.Process.CPUScheduling, err)
	}
	_, err = Load(writeTemp(t, "c.yaml", minimal+"process:\n  cpu_scheduling: fifo\n"), env(nil))
	if err == nil || !strings.Contains(err.Error(), `process.cpu_scheduling "fifo" is not one of batch, inherited`) {
		t.Errorf("cpu_scheduling fifo: %v, want it refused", err)
	}
}
