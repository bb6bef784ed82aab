package config

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/sinks/kinesis"
	"github.com/outboxrelay/outboxrelay/sinks/sns"
	"github.com/outboxrelay/outboxrelay/sinks/sqs"
)

// TestAWSSinkSettings: the sqs, sns and kinesis sections take the same
// connection keys, static credentials with a session token read from
// files or the environment, with the same defaults and checks, and the
// printed configuration shows neither secret.
func TestAWSSinkSettings(t *testing.T) {
	keyFile := writeTemp(t, "key", "s3cret-canary\n")
	tokenFile := writeTemp(t, "token", "t0ken-canary\n")
	dest := map[string]string{
		"sqs":     "queue_url: https://sqs.eu-west-1.amazonaws.com/1/orders.fifo",
		"sns":     "topic_arn: arn:aws:sns:eu-west-1:1:orders.fifo",
		"kinesis": "stream: orders",
	}
	// conn is the section's connection settings, as one string.
	conn := func(cfg Config, typ string) string {
		f := func(region, endpoint, secret, token string, timeout time.Duration) string {
			return strings.Join([]string{region, endpoint, secret, token, timeout.String()}, " ")
		}
		switch typ {
		case "sqs":
			c := SinkAs[*sqs.Config](cfg.Sink)
			return f(c.Region, c.Endpoint, c.SecretAccessKey, c.SessionToken, c.Timeout)
		case "sns":
			c := SinkAs[*sns.Config](cfg.Sink)
			return f(c.Region, c.Endpoint, c.SecretAccessKey, c.SessionToken, c.Timeout)
		}
		c := SinkAs[*kinesis.Config](cfg.Sink)
		return f(c.Region, c.Endpoint, c.SecretAccessKey, c.SessionToken, c.Timeout)
	}
	const want = "eu-west-1 https://vpce.example.com s3cret-canary t0ken-canary 10s"
	for typ, d := range dest {
		section := "postgres:\n  url: postgres://relay@127.0.0.1/shop\nsink:\n  type: " + typ + "\n  " + typ + ":\n    " + d +
			"\n    region: eu-west-1\n    endpoint: https://vpce.example.com\n    access_key_id: AKIAEXAMPLE\n"
		for name, tc := range map[string]struct {
			yml string
			env map[string]string
		}{
			"files":       {section + "    secret_access_key_file: " + keyFile + "\n    session_token_file: " + tokenFile + "\n", nil},
			"environment": {section, map[string]string{"OUTBOXRELAY_SINK_" + strings.ToUpper(typ) + "_SECRET_ACCESS_KEY": "s3cret-canary", "OUTBOXRELAY_SINK_" + strings.ToUpper(typ) + "_SESSION_TOKEN_FILE": tokenFile}},
		} {
			cfg, err := Load(writeTemp(t, "c.yaml", tc.yml), env(tc.env))
			if err != nil {
				t.Errorf("%s, %s: %v", typ, name, err)
				continue
			}
			if got := conn(cfg, typ); got != want {
				t.Errorf("%s, %s: region, endpoint, secret, token and timeout %q, want %q", typ, name, got, want)
			}
			out, err := cfg.RedactedYAML()
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(out), "canary") {
				t.Errorf("%s, %s: the printed configuration shows a secret:\n%s", typ, name, out)
			}
		}
		_, err := Load(writeTemp(t, "c.yaml", "postgres:\n  url: postgres://relay@127.0.0.1/shop\nsink:\n  type: "+typ+"\n  "+typ+":\n    "+d+
			"\n    access_key_id: AKIAEXAMPLE\n    endpoint: ftp://x\n    timeout: -1s\n"), env(nil))
		for _, want := range []string{
			"sink." + typ + ".access_key_id is set without sink." + typ + ".secret_access_key; set it, or sink." + typ + ".secret_access_key_file",
			"sink." + typ + ".endpoint \"ftp://x\" is not an http:// or https:// URL",
			"sink." + typ + ".timeout is -1s; set it above 0",
		} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v; want %q", typ, err, want)
			}
		}
	}
}
