package webhook

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// TestMutualTLS: a receiver that requires a client certificate takes the
// one of sink.webhook.tls, verified against the CA of tls.ca_file, and a
// sink without it cannot connect.
func TestMutualTLS(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	dir := t.TempDir()
	caCert, caKey := newCert(t, nil, nil, "outboxrelay test client CA")
	clientCert, clientKey := newCert(t, caCert, caKey, "relay")
	pool := x509.NewCertPool()
	pool.AddCert(caCert)

	var mu sync.Mutex
	var gotCN string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			mu.Lock()
			gotCN = r.TLS.PeerCertificates[0].Subject.CommonName
			mu.Unlock()
		}
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	srv.StartTLS()
	defer srv.Close()

	serverCA := writePEM(t, dir, "server-ca.pem", "CERTIFICATE", srv.Certificate().Raw)
	files := sinks.TLS{
		CAFile:   serverCA,
		CertFile: writePEM(t, dir, "client.pem", "CERTIFICATE", clientCert.Raw),
		KeyFile:  writePEM(t, dir, "client-key.pem", "PRIVATE KEY", marshalKey(t, clientKey)),
	}
	s := newSink(t, Config{URL: srv.URL + "/hooks", TLSFiles: files})
	if err := s.Connect(t.Context()); err != nil {
		t.Fatalf("Connect with the client certificate: %v", err)
	}
	sinktest.RunSink(t, s)
	if err := publishOne(t, s, message("m1")); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if gotCN != "relay" {
		t.Errorf("client certificate CN %q, want relay", gotCN)
	}
	mu.Unlock()

	noCert := newSink(t, Config{URL: srv.URL + "/hooks", TLSFiles: sinks.TLS{CAFile: serverCA}})
	defer noCert.Close()
	if err := noCert.Connect(t.Context()); err == nil {
		t.Error("Connect without a client certificate succeeded")
	}
	untrusted := newSink(t, Config{URL: srv.URL + "/hooks"})
	defer untrusted.Close()
	err := untrusted.Connect(t.Context())
	if err == nil || !strings.Contains(err.Error(), "sink.webhook.tls.ca_file") {
		t.Errorf("Connect to a receiver of an unknown CA: %v, want an error naming sink.webhook.tls.ca_file", err)
	}
}

func newCert(t *testing.T, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, cn string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	signer := key
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		parent = tmpl
	} else {
		signer = parentKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

func marshalKey(t *testing.T, k *ecdsa.PrivateKey) []byte {
	b, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
