package webhook

import (
	"strings"
	"testing"
)

// The vectors were computed with Python's hmac module, not with this code:
// the first is the example of the Standard Webhooks specification.
func TestSignVectors(t *testing.T) {
	for _, c := range []struct {
		secret, id string
		ts         int64
		body, want string
	}{
		{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, `{"test": 2432232314}`,
			"v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="},
		{"whsec_c2VjcmV0LWtleS1mb3Itb3V0Ym94cmVsYXk=", "0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a", 1764662400, `{"a":1}`,
			"v1,QEgvl6lO+35EUTefdUR0dX1d/Bv7bUETn8YQnDVzUNg="},
		// Rotation: both secrets, in the configured order, space-separated.
		{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw \n whsec_c2VjcmV0LWtleS1mb3Itb3V0Ym94cmVsYXk=", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, `{"test": 2432232314}`,
			"v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= v1,"},
	} {
		sg, err := parseSecrets(c.secret)
		if err != nil {
			t.Fatalf("parseSecrets: %v", err)
		}
		got := sg.sign(c.id, c.ts, []byte(c.body))
		if !strings.HasPrefix(got, c.want) || (!strings.HasSuffix(c.want, ",") && got != c.want) {
			t.Errorf("sign(%q) = %q, want %q", c.id, got, c.want)
		}
		if n := len(strings.Fields(got)); n != len(sg.keys) {
			t.Errorf("%d signatures for %d secrets: %q", n, len(sg.keys), got)
		}
	}
}

func TestSecretErrors(t *testing.T) {
	for _, c := range []struct{ secret, want string }{
		{"", "sink.webhook.secret is empty; set it, or sink.webhook.secret_file"},
		{"  \n", "sink.webhook.secret is empty"},
		{"c2VjcmV0", "secret 1 does not start with whsec_"},
		{"whsec_c2VjcmV0 whsec_***", "secret 2 is not whsec_ followed by standard base64"},
		{"whsec_", "secret 1 is not whsec_ followed by standard base64"},
	} {
		_, err := parseSecrets(c.secret)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseSecrets(%q) = %v, want an error with %q", c.secret, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "c2VjcmV0") {
			t.Errorf("error shows the secret: %v", err)
		}
	}
}
