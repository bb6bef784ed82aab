package redact

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	const secret = "S3cr3t-Canary"
	for in, want := range map[string]string{
		// PostgreSQL, with the password in the query too.
		"postgres://relay:" + secret + "@db:5432/shop?sslmode=verify-full&sslrootcert=/etc/ca.pem&sslpassword=" + secret: "postgres://relay:xxxxx@db:5432/shop?sslmode=verify-full&sslrootcert=/etc/ca.pem&sslpassword=xxxxx",
		"postgres://db/shop?password=" + secret + "&sslmode=disable":                                                     "postgres://db/shop?password=xxxxx&sslmode=disable",
		"postgres://relay@db/shop":                               "postgres://relay@db/shop",
		"host=db user=relay password=" + secret + " dbname=shop": "host=db user=relay password=xxxxx dbname=shop",
		"host=db password='" + secret + " x' dbname=shop":        "host=db password=xxxxx dbname=shop",
		// RabbitMQ.
		"amqp://guest:guest@127.0.0.1:5672/":      "amqp://guest:xxxxx@127.0.0.1:5672/",
		"amqps://u:p%40ss@host/vhost?heartbeat=5": "amqps://u:xxxxx@host/vhost?heartbeat=5",
		"amqp://user@host/":                       "amqp://user@host/",
		"amqp://host/":                            "amqp://host/",
		"amqp://u:pa%zzss@host:5672/":             "amqp://u:xxxxx@host:5672/", // net/url refuses the escape
		"u:secret@host:5672":                      "u:xxxxx@host:5672",         // no scheme
		// Redis.
		"redis://:" + secret + "@redis:6379/0": "redis://:xxxxx@redis:6379/0",
		// NATS: lists, and tokens in the user part.
		"nats://u:pw@h:4222":                                      "nats://u:xxxxx@h:4222",
		"nats://token@h:4222":                                     "nats://xxxxx@h:4222",
		"nats://h:4222,nats://u:pw@g:4222":                        "nats://h:4222,nats://u:xxxxx@g:4222",
		"nats://relay:" + secret + "@n1:4222, nats://tok@n2:4222": "nats://relay:xxxxx@n1:4222, nats://xxxxx@n2:4222",
		"nats://127.0.0.1:4222":                                   "nats://127.0.0.1:4222",
		"nats://tok%zz@h:4222":                                    "nats://xxxxx@h:4222",
		"":                                                        "",
	} {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestText(t *testing.T) {
	for in, want := range map[string]string{
		`cannot parse "postgres://relay:pw@db/shop": invalid port`: `cannot parse "postgres://relay:xxxxx@db/shop": invalid port`,
		`failed to connect to host=db user=relay password=pw`:      `failed to connect to host=db user=relay password=xxxxx`,
		`dial amqp://u:pa/ss@host failed`:                          `dial amqp://u:xxxxx@host failed`,
		"postgres://relay:pw@db/shop":                              "postgres://relay:xxxxx@db/shop",
		"nothing secret here":                                      "nothing secret here",
	} {
		if got := Text(in); got != want {
			t.Errorf("Text(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestError(t *testing.T) {
	raw := "amqp://user:p%40ssw0rd@host:5672/"
	base := errors.New("dial " + raw + " failed for p@ssw0rd and p%40ssw0rd")
	err := Error(fmt.Errorf("connect: %w", base), raw)
	if s := err.Error(); strings.Contains(s, "ssw0rd") || !strings.Contains(s, "user:xxxxx@host:5672") {
		t.Errorf("password left in, or URL lost from, %q", s)
	}
	if !errors.Is(err, base) {
		t.Error("redacted error does not unwrap to the original")
	}
	if clean := errors.New("no secret here"); Error(clean, raw) != clean {
		t.Error("clean error was rewrapped")
	}
	if Error(nil, raw) != nil {
		t.Error("Error(nil) is not nil")
	}
	for rawURL, msg := range map[string]string{
		"nats://u:pw@h":                  "auth failed for u:pw",
		"nats://h,nats://s3cretTok@g":    "authorization violation for s3cretTok",
		"redis://:hunter2@127.0.0.1:1/0": "WRONGPASS hunter2",
	} {
		got := Error(errors.New(msg), rawURL).Error()
		for _, secret := range []string{"pw", "s3cretTok", "hunter2"} {
			if strings.Contains(got, secret) {
				t.Errorf("Error(%q, %q) = %q, still shows %s", msg, rawURL, got, secret)
			}
		}
	}
	// A user name that is not a token stays readable.
	if got := Error(errors.New("access refused for user guest"), "amqp://guest@h/").Error(); got != "access refused for user guest" {
		t.Errorf("user name of an amqp URL redacted: %q", got)
	}
}
