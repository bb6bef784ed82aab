package pubsub

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"time"
)

// Defaults applied by [New] to zero fields of a [Config].
const (
	// DefaultTimeout bounds one publish, retries by the client included,
	// and the probe of Connect.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxInFlight bounds the messages published and not yet
	// answered; Publish blocks beyond it.
	DefaultMaxInFlight = 10_000
)

// Config configures a Pub/Sub [Sink]. The zero value of every field means
// its default; Project and Topic are required.
type Config struct {
	// Project is the Google Cloud project id that holds the topics.
	Project string `yaml:"project"`
	// Topic is the template of the topic id: {aggregate_type},
	// {event_type} and {table} are replaced by the message's values.
	Topic string `yaml:"topic"`
	// CredentialsFile names a service account key file. Empty means the
	// application default credentials (GOOGLE_APPLICATION_CREDENTIALS, the
	// metadata server); with PUBSUB_EMULATOR_HOST set none are used.
	CredentialsFile string `yaml:"credentials_file"`
	// Endpoint overrides the Pub/Sub API address (host:port), for a
	// regional or private endpoint.
	Endpoint string `yaml:"endpoint"`
	// Timeout bounds one publish, default [DefaultTimeout].
	Timeout time.Duration `yaml:"timeout"`
	// MaxInFlight bounds the messages published and not yet answered,
	// default [DefaultMaxInFlight].
	MaxInFlight int `yaml:"max_inflight"`
}

func (c Config) withDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, DefaultMaxInFlight)
	return c
}

// Validate reports every problem with c, each one sentence naming the
// setting to fix.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Project == "" {
		errs = append(errs, errors.New("sink.pubsub.project is empty; set it to the Google Cloud project id that holds the topic"))
	}
	if _, err := parseTopic(c.Topic); err != nil {
		errs = append(errs, fmt.Errorf("sink.pubsub.topic: %w", err))
	}
	if c.CredentialsFile != "" {
		if _, err := os.Stat(c.CredentialsFile); err != nil {
			errs = append(errs, fmt.Errorf("sink.pubsub.credentials_file: %w", err))
		}
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("sink.pubsub.timeout is %v; set it above 0", c.Timeout))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("sink.pubsub.max_inflight is %d; set it to 1 or more", c.MaxInFlight))
	}
	return errors.Join(errs...)
}
