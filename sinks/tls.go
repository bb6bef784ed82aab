package sinks

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/outboxrelay/outboxrelay/internal/secretfile"
)

// TLS is the file form of a client's TLS settings (sink.<name>.tls), for
// sinks whose broker connections can use TLS. Files are PEM.
type TLS struct {
	// Enabled turns TLS on (Kafka). For RabbitMQ an amqps:// URL does.
	Enabled bool `yaml:"enabled"`
	// CAFile holds the certificates that may sign the server's; empty
	// trusts the system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the client certificate and its key, for
	// servers that authenticate clients by certificate.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name the server's certificate must carry; empty
	// means the host the client dials.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any server certificate. For tests only:
	// it gives up the protection TLS is there for.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// Configured reports whether any setting beyond Enabled is set.
func (t TLS) Configured() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify
}

// ClientConfig builds the client's tls.Config, reading its files. Errors
// name the key under prefix (sink.kafka.tls) to fix.
func (t TLS) ClientConfig(prefix string) (*tls.Config, error) {
	c := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, // the operator's explicit choice, documented as unsafe
	}
	if t.CAFile != "" {
		pem, err := secretfile.Read(t.CAFile, maxPEMFile)
		if err != nil {
			return nil, fmt.Errorf("%s.ca_file: %w", prefix, err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s.ca_file %s holds no PEM certificate", prefix, t.CAFile)
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		certPEM, err := secretfile.Read(t.CertFile, maxPEMFile)
		if err != nil {
			return nil, fmt.Errorf("%s.cert_file: %w", prefix, err)
		}
		keyPEM, err := secretfile.Read(t.KeyFile, maxPEMFile)
		if err != nil {
			return nil, fmt.Errorf("%s.key_file: %w", prefix, err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("%s.cert_file and key_file: %w", prefix, err)
		}
		c.Certificates = []tls.Certificate{cert}
	case t.CertFile != "" || t.KeyFile != "":
		return nil, fmt.Errorf("%s.cert_file and %s.key_file must be set together", prefix, prefix)
	}
	return c, nil
}

// maxPEMFile bounds a certificate, key or CA bundle file.
const maxPEMFile = 1 << 20

// CertError returns the failed server certificate check inside err, or nil,
// so that a sink can say which TLS settings to check.
func CertError(err error) error {
	var verr *tls.CertificateVerificationError
	if errors.As(err, &verr) {
		return verr
	}
	var hostErr x509.HostnameError
	if errors.As(err, &hostErr) {
		return hostErr
	}
	var authErr x509.UnknownAuthorityError
	if errors.As(err, &authErr) {
		return authErr
	}
	return nil
}
