package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// secretPrefix starts every Standard Webhooks secret.
const secretPrefix = "whsec_"

// signer signs requests with one or more keys. It is immutable and safe
// for concurrent use.
type signer struct {
	keys [][]byte
}

// parseSecrets parses the white-space separated whsec_ secrets of s.
// Errors name sink.webhook.secret and never show a secret.
func parseSecrets(s string) (signer, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return signer{}, errors.New("sink.webhook.secret is empty; set it, or sink.webhook.secret_file, to the receiver's whsec_ signing secret")
	}
	var sg signer
	for i, f := range fields {
		b64, ok := strings.CutPrefix(f, secretPrefix)
		if !ok {
			return signer{}, fmt.Errorf("sink.webhook.secret: secret %d does not start with %s; write each secret as whsec_ followed by its base64 key", i+1, secretPrefix)
		}
		key, err := base64.StdEncoding.DecodeString(b64)
		if err != nil || len(key) == 0 {
			return signer{}, fmt.Errorf("sink.webhook.secret: secret %d is not whsec_ followed by standard base64; copy it from the receiver unchanged", i+1)
		}
		sg.keys = append(sg.keys, key)
	}
	return sg, nil
}

// sign returns the webhook-signature header value for id, the Unix
// timestamp ts and body: "v1,<base64 HMAC-SHA256(key, id.ts.body)>" for each
// key, separated by spaces.
func (sg signer) sign(id string, ts int64, body []byte) string {
	var b strings.Builder
	t := strconv.FormatInt(ts, 10)
	for i, key := range sg.keys {
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id))
		mac.Write([]byte{'.'})
		mac.Write([]byte(t))
		mac.Write([]byte{'.'})
		mac.Write(body)
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("v1,")
		b.WriteString(base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	}
	return b.String()
}
