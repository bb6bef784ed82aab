package webhook

import (
	"context"
	"errors"
	"net/url"
	"strings"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/verify"
)

var (
	_ sinks.Settings      = (*Config)(nil)
	_ sinks.Verifiable    = (*Config)(nil)
	_ sinks.FormatChecker = (*Config)(nil)
)

// The configuration file's sink.webhook section is a Config.
func init() {
	sinks.Register(sinks.Type{
		Name: "webhook",
		Defaults: func() sinks.Settings {
			return &Config{
				Timeout: DefaultTimeout, MaxConnsPerHost: DefaultMaxConnsPerHost,
				MaxInFlight: DefaultMaxInFlight, MaxRetryAfter: DefaultMaxRetryAfter,
				Batch: Batch{Linger: DefaultBatchLinger},
			}
		},
		Docs: map[string]string{
			"url":                      "receiver URL template, `https://` or `http://`; `{aggregate_type}`, `{event_type}`, `{table}` only in the path and query, values percent-encoded",
			"url_file":                 "file holding `sink.webhook.url`",
			"secret":                   "Standard Webhooks signing secret `whsec_<base64>`; several separated by spaces while rotating (required)",
			"secret_file":              "file holding `sink.webhook.secret`",
			"username":                 "basic auth user",
			"password":                 "basic auth password",
			"password_file":            "file holding `sink.webhook.password`",
			"bearer_token":             "token sent as `Authorization: Bearer`",
			"bearer_token_file":        "file holding `sink.webhook.bearer_token`",
			"timeout":                  "bound of one request; a request that times out is sent again",
			"max_conns_per_host":       "requests in flight (and connections) at once",
			"max_inflight":             "messages in flight (published, not yet acknowledged) before Publish waits",
			"max_pending":              "deprecated: the old name of `max_inflight`",
			"max_retry_after":          "cap of the pause a `Retry-After` answer imposes",
			"follow_redirects":         "follow 307 and 308 answers to the same scheme and host; otherwise a 3xx is dead-lettered",
			"batch.max_messages":       "batch mode: most messages in one POST, a JSON array of their envelopes (one of each aggregate); 1 sends each alone",
			"batch.linger":             "batch mode: the longest a batch waits for more messages, only while another request is in flight",
			"tls.enabled":              "use the TLS settings below (an `https://` URL uses TLS without them)",
			"tls.ca_file":              "CA bundle that signs the receiver's certificate",
			"tls.cert_file":            "client certificate (mutual TLS)",
			"tls.key_file":             "client key (mutual TLS)",
			"tls.server_name":          "name to verify in the receiver's certificate",
			"tls.insecure_skip_verify": "skip certificate verification (tests only)",
		},
	})
}

// Open creates the sink and checks that the receiver answers.
func (c *Config) Open(ctx context.Context, log *zap.Logger) (relay.Sink, error) {
	s, err := New(*c, log)
	return sinks.Open(ctx, "webhook", s, err, func(err error) error { return err }) // Connect's error names what to check
}

// Warnings names the settings that send secrets or messages unencrypted or
// unverified, and the deprecated keys set.
func (c *Config) Warnings() []string {
	var ws []string
	if strings.HasPrefix(c.URL, "http://") && (c.Password != "" || c.BearerToken != "") {
		ws = append(ws, "sink.webhook.url is http:// and sends its credentials unencrypted; use https://")
	}
	if c.TLSFiles.InsecureSkipVerify {
		ws = append(ws, "sink.webhook.tls.insecure_skip_verify accepts any receiver certificate; use sink.webhook.tls.ca_file instead")
	}
	if c.MaxPending != 0 {
		ws = append(ws, maxPending.Warning())
	}
	return ws
}

// StaticDestinations returns the one destination of a URL without
// placeholders, as metrics label it (see destination), and nothing
// otherwise.
func (c *Config) StaticDestinations() []string {
	ep, err := parseURL(c.URL)
	if err != nil {
		return nil
	}
	raw, ok := ep.tmpl.Constant()
	if !ok {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil
	}
	return []string{destination(u)}
}

// VerifyReader refuses: a webhook receiver cannot be read back.
func (c *Config) VerifyReader(sinks.VerifyOptions) (verify.Reader, func(*relay.Message) (string, error), error) {
	return nil, nil, errors.New("a webhook receiver cannot be read back, so verify cannot see what reached it; " +
		"compare the receiver's own record of the webhook-id headers it accepted with the outbox, or use a sink whose broker verify reads")
}
