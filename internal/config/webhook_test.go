package config

import (
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/sinks/webhook"
)

const webhookYAML = `
postgres:
  url: postgres://relay@127.0.0.1/shop
sink:
  type: webhook
  webhook:
    url: https://hooks.example.com/outbox/{aggregate_type}
`

// TestWebhookSecrets: the signing secret and the credentials come from
// the file, a _file or the environment; a missing secret is one error at
// load, and none is ever printed.
func TestWebhookSecrets(t *testing.T) {
	const newSecret, oldSecret = "whsec_bmV3LXNlY3JldA==", "whsec_b2xkLXNlY3JldA=="
	secretFile := writeTemp(t, "whsec", newSecret+" "+oldSecret+"\n")
	tokenFile := writeTemp(t, "token", "t0ken-canary\n")
	for name, tc := range map[string]struct {
		yml    string
		env    map[string]string
		secret string
	}{
		"in the file":      {webhookYAML + "    secret: " + newSecret + "\n", nil, newSecret},
		"secret_file":      {webhookYAML + "    secret_file: " + secretFile + "\n    bearer_token_file: " + tokenFile + "\n", nil, newSecret + " " + oldSecret},
		"environment":      {webhookYAML, map[string]string{"OUTBOXRELAY_SINK_WEBHOOK_SECRET": oldSecret}, oldSecret},
		"environment file": {webhookYAML, map[string]string{"OUTBOXRELAY_SINK_WEBHOOK_SECRET_FILE": secretFile}, newSecret + " " + oldSecret},
	} {
		cfg, err := Load(writeTemp(t, "c.yaml", tc.yml), env(tc.env))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		wc := SinkAs[*webhook.Config](cfg.Sink)
		if wc.Secret != tc.secret {
			t.Errorf("%s: secret %q, want %q", name, wc.Secret, tc.secret)
		}
		out, err := cfg.RedactedYAML()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"bmV3", "b2xk", "t0ken-canary"} {
			if strings.Contains(string(out), s) {
				t.Errorf("%s: the printed configuration shows a secret:\n%s", name, out)
			}
		}
	}
	_, err := Load(writeTemp(t, "c.yaml", webhookYAML), env(nil))
	if err == nil || !strings.Contains(err.Error(), "sink.webhook.secret is empty; set it, or sink.webhook.secret_file") {
		t.Errorf("no secret: %v, want one error naming sink.webhook.secret", err)
	}
	_, err = Load(writeTemp(t, "c.yaml", webhookYAML+"    secret: whsec_bmV3 hunter2\n"), env(nil))
	if err == nil || !strings.Contains(err.Error(), "secret 2 does not start with whsec_") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a malformed secret: %v, want an error naming it by position only", err)
	}
}

// TestWebhookSecretFileMissing: a secret_file that cannot be read is one
// error, not that and an empty secret besides.
func TestWebhookSecretFileMissing(t *testing.T) {
	_, err := Load(writeTemp(t, "c.yaml", webhookYAML+"    secret_file: /nonexistent/whsec\n"), env(nil))
	if err == nil || len(Problems(err)) != 1 || !strings.Contains(err.Error(), "sink.webhook.secret_file: stat /nonexistent/whsec") {
		t.Errorf("secret_file missing: %v, want exactly one error naming sink.webhook.secret_file", err)
	}
}
