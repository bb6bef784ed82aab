package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/kafka"
)

// testCA is a throwaway certificate authority; nothing it makes is committed.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, cn string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a PEM certificate and key for cn, valid for the IP
// addresses and DNS names in hosts.
func (ca *testCA) issue(t *testing.T, cn string, hosts ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	k, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: k})
}

func writeTestFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestKafkaTLSAndSASL opens the Kafka sink against a kfake broker that
// requires TLS and SASL, with every mechanism, and checks that a wrong
// password or an untrusted certificate is one clear error without the
// password.
func TestKafkaTLSAndSASL(t *testing.T) {
	const password = "kafka-Pa55word-canary"
	ca := newTestCA(t, "outboxrelay test CA")
	certPEM, keyPEM := ca.issue(t, "kfake", "127.0.0.1")
	serverCert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(),
		kfake.Superuser(kafka.SASLPlain, "plain-user", password),
		kfake.Superuser(kafka.SASLScramSHA256, "scram256-user", password),
		kfake.Superuser(kafka.SASLScramSHA512, "scram512-user", password),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	dir := t.TempDir()
	caFile := writeTestFile(t, dir, "ca.pem", ca.pem)
	otherCA := writeTestFile(t, dir, "other-ca.pem", newTestCA(t, "another CA").pem)

	open := func(mech, user, pass, caPath string) error {
		cfg := config.Default()
		cfg.Postgres.URL = "postgres://relay@127.0.0.1/shop"
		k := config.SinkAs[*kafka.Config](cfg.Sink)
		k.Brokers = cluster.ListenAddrs()
		k.TLSFiles = sinks.TLS{Enabled: true, CAFile: caPath}
		k.SASL = kafka.SASL{Mechanism: mech, Username: user, Password: pass}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s, err := openSink(ctx, cfg, zap.NewNop())
		if err == nil {
			_ = s.Close()
		}
		return err
	}
	for _, tc := range []struct{ mech, user string }{
		{kafka.SASLPlain, "plain-user"},
		{kafka.SASLScramSHA256, "scram256-user"},
		{kafka.SASLScramSHA512, "scram512-user"},
	} {
		if err := open(tc.mech, tc.user, password, caFile); err != nil {
			t.Errorf("%s over TLS: %v", tc.mech, err)
		}
	}

	err = open(kafka.SASLScramSHA256, "scram256-user", "wrong-"+password, caFile)
	// kfake closes the connection instead of answering SASL_AUTHENTICATION_FAILED.
	if err == nil || !strings.Contains(err.Error(), "cannot reach Kafka") || !strings.Contains(err.Error(), "authentication failed") {
		t.Errorf("wrong password: %v, want cannot reach Kafka ... authentication failed", err)
	}
	if err != nil && strings.Contains(err.Error(), password) {
		t.Errorf("the error shows the password: %v", err)
	}
	err = open(kafka.SASLScramSHA256, "scram256-user", password, otherCA)
	if err == nil || !strings.Contains(err.Error(), "did not verify (tls: failed to verify certificate: x509: certificate signed by unknown authority); check sink.kafka.tls.ca_file") {
		t.Errorf("untrusted broker certificate: %v, want a TLS verification error naming sink.kafka.tls.ca_file", err)
	}
}

// TestPrintRole: the role SQL grants what the relay uses and no more.
func TestPrintRole(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := runMain([]string{"migrate", "--print-role", "--role", "relay", "--table", "app.events", "--publication", "pub"}, &out, &errOut); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	sql := out.String()
	for _, want := range []string{
		`CREATE ROLE "relay" WITH LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD 'CHANGE-ME';`,
		`GRANT USAGE ON SCHEMA "app" TO "relay";`,
		`GRANT SELECT ON "app"."events" TO "relay";`,
		`GRANT SELECT, INSERT, UPDATE ON outboxrelay.checkpoint TO "relay";`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON outboxrelay.dead_letters TO "relay";`,
		`GRANT USAGE ON SEQUENCE outboxrelay.dead_letters_id_seq TO "relay";`,
		`GRANT SELECT ON outboxrelay.status TO "relay";`,
		`-- GRANT DELETE ON "app"."events" TO "relay";`,
		`The publication "pub"`,
	} {
		if !strings.Contains(sql, want) {
			t.Errorf("--print-role lacks %s\n%s", want, sql)
		}
	}
	for _, line := range strings.Split(sql, "\n") {
		if strings.HasPrefix(line, "--") {
			continue
		}
		for _, never := range []string{" SUPERUSER", "ALL PRIVILEGES", "CREATE ON", "OWNER TO", "pg_read_all"} {
			if strings.Contains(line, never) {
				t.Errorf("--print-role grants too much: %s", line)
			}
		}
	}
	if code := runMain([]string{"migrate", "--print-role", "--role", ""}, &out, &errOut); code != exitUsage {
		t.Errorf("empty --role: exit %d, want %d", code, exitUsage)
	}
}

// TestCheckConfigHidesSecrets: --check-config prints the effective
// configuration, secrets from the file, the environment and *_file keys
// all hidden.
func TestCheckConfigHidesSecrets(t *testing.T) {
	const secret = "Check-Config-Canary"
	dir := t.TempDir()
	pw := writeTestFile(t, dir, "pw", []byte(secret+"\n"))
	cfgPath := writeTestFile(t, dir, "c.yaml", []byte(`
postgres:
  url: postgres://relay:`+secret+`@db.internal:5432/shop?sslmode=verify-full&sslrootcert=/etc/ca.pem
sink:
  type: kafka
  kafka:
    brokers: [k1:9093]
    tls: {enabled: true}
    sasl: {mechanism: SCRAM-SHA-512, username: relay, password_file: `+pw+`}
http:
  listen: 0.0.0.0:9187
`))
	t.Setenv("OUTBOXRELAY_HTTP_TOKEN", secret)
	t.Setenv("OUTBOXRELAY_SINK_RABBITMQ_URL", "amqps://relay:"+secret+"@mq/")
	var out, errOut bytes.Buffer
	if code := runMain([]string{"run", "--check-config", "--config", cfgPath}, &out, &errOut); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if strings.Contains(out.String()+errOut.String(), secret) {
		t.Fatalf("--check-config shows a secret:\n%s", out.String())
	}
	for _, want := range []string{
		"# configuration ok: kafka sink",
		"url: postgres://relay:xxxxx@db.internal:5432/shop?sslmode=verify-full&sslrootcert=/etc/ca.pem",
		"password: xxxxx",
		"password_file: " + pw,
		"token: xxxxx",
		"url: amqps://relay:xxxxx@mq/",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--check-config lacks %q:\n%s", want, out.String())
		}
	}

	// A bad configuration is one line on stderr, without the secret either.
	t.Setenv("OUTBOXRELAY_SINK_KAFKA_SASL_MECHANISM", "SCRAM")
	out.Reset()
	errOut.Reset()
	if code := runMain([]string{"run", "--check-config", "--config", cfgPath}, &out, &errOut); code != exitUsage {
		t.Fatalf("bad mechanism: exit %d, want %d", code, exitUsage)
	}
	if strings.Count(strings.TrimSpace(errOut.String()), "\n") != 0 || strings.Contains(errOut.String(), secret) {
		t.Errorf("bad configuration: want one line without the secret, got %q", errOut.String())
	}
}
