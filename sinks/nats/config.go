package nats

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/sinks"
)

// Defaults applied by [New] to zero fields of a [Config].
const (
	DefaultURL     = "nats://127.0.0.1:4222"
	DefaultSubject = "outbox.{aggregate_type}.{event_type}"
	DefaultStream  = "OUTBOX"
	// DefaultDuplicateWindow is the duplicate window of a stream the sink
	// creates, and JetStream's own default.
	DefaultDuplicateWindow = 2 * time.Minute
	// DefaultMaxInFlight bounds the messages published but not yet
	// acknowledged; nats.go's own default for async publishing is 4,000.
	DefaultMaxInFlight = 4000
	// DefaultAckTimeout is how long a PubAck may take before the message is
	// published again.
	DefaultAckTimeout  = 10 * time.Second
	DefaultDialTimeout = 5 * time.Second
	// DefaultReconnectWait is the pause between reconnect attempts to the
	// same server; nats.go adds up to a second of jitter.
	DefaultReconnectWait = time.Second
	DefaultClientName    = "outboxrelay"
)

// Config configures a NATS JetStream [Sink]. The zero value of every field
// means its default.
type Config struct {
	// URL is the NATS server URL, or several separated by commas, default
	// [DefaultURL]. Credentials in the URL (nats://user:password@host) never
	// appear in logs or errors.
	URL string `yaml:"url" secret:"url"`

	// URLFile names a file holding URL (a mounted secret); the
	// configuration loader reads it, New ignores it.
	URLFile string `yaml:"url_file"`

	// Subject is the subject template, default [DefaultSubject]. The
	// placeholders {aggregate_type}, {event_type} and {table} are replaced
	// by the message's fields (table as schema.name, "" for a table-less
	// message); any other placeholder is a configuration error.
	//
	// A substituted value never adds subject tokens or wildcards: in it the
	// token separator '.', the wildcards '*' and '>', '%' itself, and
	// whitespace and control characters (bytes up to 0x20, and 0x7F) are
	// percent-encoded as %XX (uppercase hex), so event_type "order.created"
	// renders the default template as "outbox.order.order%2Ecreated", and a
	// consumer can undo the encoding with url.PathUnescape. Other bytes,
	// UTF-8 included, are kept. Literal text of the template is used as is
	// and must form a valid subject; Validate checks it. A rendered subject
	// with an empty token (an empty value between dots) or longer than 1,024
	// bytes is a permanent failure of that message.
	Subject string `yaml:"subject"`

	// Stream is the JetStream stream the subjects must be captured by,
	// default [DefaultStream]. Every message carries Nats-Expected-Stream,
	// so a subject captured by another stream fails permanently instead of
	// landing there.
	Stream string `yaml:"stream"`

	// CreateStream makes Connect create Stream when it does not exist, with
	// file storage, limits retention, DuplicateWindow, and as subjects the
	// literal tokens of Subject before its first placeholder followed by
	// ">" (outbox.> for the default), or Subject with every token that
	// holds a placeholder replaced by "*" when its first token has one.
	// When false, or when the stream exists, Connect only checks that the
	// stream exists and captures the subjects of the template.
	CreateStream bool `yaml:"create_stream"`

	// DuplicateWindow is the duplicate window of a stream CreateStream
	// creates, default [DefaultDuplicateWindow]. Within it JetStream stores
	// a message id once; republications after a crash or a reconnect must
	// come within it to be dropped as duplicates.
	DuplicateWindow time.Duration `yaml:"duplicate_window"`

	// MaxInFlight bounds the messages published but not yet acknowledged,
	// default [DefaultMaxInFlight]; Publish blocks beyond it.
	MaxInFlight int `yaml:"max_inflight"`
	// MaxPending is the deprecated old name of MaxInFlight
	// (sink.nats.max_pending): it is read, with a warning, when MaxInFlight is
	// unset, and will be removed.
	MaxPending int `yaml:"max_pending"`

	// AckTimeout is how long the sink waits for a message's PubAck before
	// publishing it again, default [DefaultAckTimeout].
	AckTimeout time.Duration `yaml:"ack_timeout"`

	// DialTimeout bounds each connection attempt, default [DefaultDialTimeout].
	DialTimeout time.Duration `yaml:"-"`

	// ReconnectWait is the pause between reconnect attempts to one server,
	// default [DefaultReconnectWait]. The sink reconnects forever.
	ReconnectWait time.Duration `yaml:"-"`

	// ClientName is the connection name shown by the server, default
	// [DefaultClientName].
	ClientName string `yaml:"-"`

	// CredentialsFile is a NATS .creds file (JWT and NKey seed) to
	// authenticate with; empty means none.
	CredentialsFile string `yaml:"credentials_file"`

	// TLS, when set, is used for tls:// connections (and required by
	// them when the server asks for client certificates).
	TLS *tls.Config `yaml:"-"`
}

func (c Config) withDefaults() Config {
	c.URL = cmp.Or(c.URL, DefaultURL)
	c.Subject = cmp.Or(c.Subject, DefaultSubject)
	c.Stream = cmp.Or(c.Stream, DefaultStream)
	c.DuplicateWindow = cmp.Or(c.DuplicateWindow, DefaultDuplicateWindow)
	c.MaxInFlight = cmp.Or(maxPending.Int(c.MaxPending, c.MaxInFlight, DefaultMaxInFlight), DefaultMaxInFlight)
	c.AckTimeout = cmp.Or(c.AckTimeout, DefaultAckTimeout)
	c.DialTimeout = cmp.Or(c.DialTimeout, DefaultDialTimeout)
	c.ReconnectWait = cmp.Or(c.ReconnectWait, DefaultReconnectWait)
	c.ClientName = cmp.Or(c.ClientName, DefaultClientName)
	return c
}

// Validate reports every problem with c, with zero fields standing for their
// defaults. Each problem is one sentence naming the setting to fix.
func (c Config) Validate() error {
	errs := []error{maxPending.CheckInt(c.MaxPending, c.MaxInFlight, DefaultMaxInFlight)}
	c = c.withDefaults()
	for _, u := range strings.Split(c.URL, ",") {
		if err := checkURL(strings.TrimSpace(u)); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := parseTemplate(c.Subject); err != nil {
		errs = append(errs, fmt.Errorf("sink.nats.subject: %w", err))
	}
	if c.Stream == "" || strings.ContainsAny(c.Stream, ".*> \t\r\n/\\") {
		errs = append(errs, fmt.Errorf("sink.nats.stream %q is not a valid stream name; use letters, digits, '-' and '_'", c.Stream))
	}
	if c.DuplicateWindow < 0 {
		errs = append(errs, fmt.Errorf("sink.nats.duplicate_window is %v; set it above 0", c.DuplicateWindow))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("sink.nats.max_inflight is %d; set it to 1 or more", c.MaxInFlight))
	}
	if c.AckTimeout < 0 {
		errs = append(errs, fmt.Errorf("sink.nats.ack_timeout is %v; set it above 0", c.AckTimeout))
	}
	if c.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("sink.nats.dial_timeout is %v; set it above 0", c.DialTimeout))
	}
	if c.ReconnectWait < 0 {
		errs = append(errs, fmt.Errorf("sink.nats.reconnect_wait is %v; set it above 0", c.ReconnectWait))
	}
	return errors.Join(errs...)
}

func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("sink.nats.url %q is not a URL; use nats://host:4222", redact.URL(raw))
	}
	switch u.Scheme {
	case "nats", "tls", "ws", "wss":
	default:
		return fmt.Errorf("sink.nats.url %s has scheme %q; use nats://, tls://, ws:// or wss://", redact.URL(raw), u.Scheme)
	}
	if u.Host == "" {
		return fmt.Errorf("sink.nats.url %s has no host; use nats://host:4222", redact.URL(raw))
	}
	return nil
}

// maxPending is max_inflight's old name.
var maxPending = sinks.Renamed{Sink: "nats", Old: "max_pending", New: "max_inflight"}
