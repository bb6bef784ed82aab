package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

// testCA is a certificate authority made for one test; nothing it makes is
// committed.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
	pool *x509.CertPool
}

func newTestCA(t *testing.T, cn string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(2 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pool: pool}
}

// issue returns a PEM certificate and key for the common name cn (a
// client's user name), valid as server for hosts (IP addresses or names).
func (ca *testCA) issue(t *testing.T, cn string, hosts ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(2 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
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

func (ca *testCA) tlsCert(t *testing.T, cn string, hosts ...string) tls.Certificate {
	t.Helper()
	c, k := ca.issue(t, cn, hosts...)
	cert, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func writeFileT(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// oneLine checks a failed command's output: exit 2, and a single line
// that is not a JSON log line, starting "outboxrelay:", that contains every
// want; no line, logs included, shows one of the secrets.
func oneLine(t *testing.T, what, out string, code int, secrets []string, want ...string) {
	t.Helper()
	if code != 2 {
		t.Errorf("%s: exit %d, want 2\n%s", what, code, out)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasPrefix(l, "{") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "outboxrelay: ") {
		t.Errorf("%s: want one line starting outboxrelay:, got\n%s", what, out)
		return
	}
	t.Logf("%s: %s", what, lines[0])
	for _, w := range want {
		if !strings.Contains(lines[0], w) {
			t.Errorf("%s: the line lacks %q: %s", what, w, lines[0])
		}
	}
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("%s: the output shows the secret %q: %s", what, s, out)
		}
	}
}

// tlsPostgres is a PostgreSQL server with ssl=on whose pg_hba.conf admits
// certuser only over TLS with a client certificate, and pwuser only over
// TLS with a SCRAM password.
type tlsPostgres struct {
	srv        *pgserver.Server
	ca         *testCA
	caFile     string // the CA that signed the server's certificate
	clientCert string // certuser's
	clientKey  string
}

func startTLSPostgres(t *testing.T) *tlsPostgres {
	t.Helper()
	ca := newTestCA(t, "outboxrelay test CA")
	// The server's files must be readable by the OS user PostgreSQL runs
	// as, and the key by it alone.
	dir, err := os.MkdirTemp("", "outboxrelay-pgtls-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM := ca.issue(t, "localhost", "127.0.0.1", "localhost")
	serverCert := writeFileT(t, dir, "server.crt", certPEM)
	serverKey := writeFileT(t, dir, "server.key", keyPEM)
	rootCert := writeFileT(t, dir, "root.crt", ca.pem)
	for _, f := range []string{serverCert, rootCert} {
		if err := os.Chmod(f, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs a postgres OS user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(serverKey, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	srv := pgservertest.Start(t, pgserver.Options{
		Settings: map[string]string{
			"ssl": "on", "ssl_cert_file": serverCert, "ssl_key_file": serverKey, "ssl_ca_file": rootCert,
		},
		HBA: []string{
			"hostssl   all certuser 127.0.0.1/32 cert",
			"hostnossl all certuser 127.0.0.1/32 reject",
			"hostssl   all pwuser   127.0.0.1/32 scram-sha-256",
			"hostnossl all pwuser   127.0.0.1/32 reject",
		},
	})
	clientDir := t.TempDir()
	cc, ck := ca.issue(t, "certuser")
	return &tlsPostgres{
		srv: srv, ca: ca,
		caFile:     writeFileT(t, clientDir, "ca.pem", ca.pem),
		clientCert: writeFileT(t, clientDir, "certuser.crt", cc),
		clientKey:  writeFileT(t, clientDir, "certuser.key", ck),
	}
}

// url returns a URL for user on database db with the query parameters.
func (p *tlsPostgres) url(userinfo *url.Userinfo, db string, query url.Values) string {
	u := url.URL{Scheme: "postgres", User: userinfo, Host: "127.0.0.1:" + strconv.Itoa(p.srv.Port()), Path: "/" + db, RawQuery: query.Encode()}
	return u.String()
}

// roleSQL is what `outboxrelay migrate --print-role --role role` prints.
func roleSQL(t *testing.T, e *env, role string) string {
	t.Helper()
	out, code := e.cli("migrate", "--print-role", "--role", role)
	if code != 0 {
		t.Fatalf("migrate --print-role exit %d: %s", code, out)
	}
	return out
}

// TestPostgresTLSVerifyFull: with sslmode=verify-full, sslrootcert and a
// client certificate in postgres.url, both the regular and the replication
// connection use TLS and the certificate (pg_hba admits the role no other
// way), and the relay streams. An untrusted server certificate, or a wrong
// password, is one clear line and exit 2.
func TestPostgresTLSVerifyFull(t *testing.T) {
	p := startTLSPostgres(t)
	ctx := t.Context()
	ownerURL, err := p.srv.CreateDatabase(ctx, "tls_shop")
	if err != nil {
		t.Fatal(err)
	}
	owner := connectT(t, ownerURL)
	e := &env{t: t, db: owner}
	if out, code := e.cli("migrate", "--database-url", ownerURL); code != 0 {
		t.Fatalf("migrate exit %d: %s", code, out)
	}
	if _, err := owner.Exec(ctx, roleSQL(t, e, "certuser"), pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("role SQL: %v", err)
	}
	if _, err := owner.Exec(ctx, "CREATE ROLE pwuser LOGIN REPLICATION PASSWORD 'right-Pa55word'"); err != nil {
		t.Fatal(err)
	}
	e.kafka, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.kafka.Close)
	e.brokers = e.kafka.ListenAddrs()[0]

	e.dbURL = p.url(url.User("certuser"), "tls_shop", url.Values{
		"sslmode": {"verify-full"}, "sslrootcert": {p.caFile}, "sslcert": {p.clientCert}, "sslkey": {p.clientKey},
	})
	c := e.consume("outbox.order")
	relay := e.start()
	relay.waitLog(`"streaming"`, 30*time.Second)
	var id string
	if err := owner.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', '1', 'order.created', '{}') RETURNING id::text`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	c.waitIDs([]string{id}, 30*time.Second)

	// Every session of certuser is TLS with its certificate: the
	// walsender (replication) and the regular backends alike.
	rows, err := owner.Query(ctx, `SELECT a.backend_type, s.ssl, coalesce(s.client_dn, '')
		FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.usename = 'certuser'`)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for rows.Next() {
		var kind, dn string
		var ssl bool
		if err := rows.Scan(&kind, &ssl, &dn); err != nil {
			t.Fatal(err)
		}
		if !ssl || !strings.Contains(dn, "CN=certuser") {
			t.Errorf("%s session of certuser: ssl=%v client_dn=%q", kind, ssl, dn)
		}
		kinds[kind] = true
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if !kinds["walsender"] || !kinds["client backend"] {
		t.Errorf("certuser sessions %v, want a walsender and a client backend", kinds)
	}
	relay.stop()

	// A server certificate the CA file does not vouch for.
	other := writeFileT(t, t.TempDir(), "other-ca.pem", newTestCA(t, "some other CA").pem)
	e.dbURL = p.url(url.User("certuser"), "tls_shop", url.Values{
		"sslmode": {"verify-full"}, "sslrootcert": {other}, "sslcert": {p.clientCert}, "sslkey": {p.clientKey},
	})
	out, code := e.cli("run", "--config", e.config())
	oneLine(t, "untrusted server certificate", out, code, nil, "cannot connect to PostgreSQL", "check sslrootcert")

	// A wrong password over TLS.
	const wrong = "wrong-Pa55word-canary"
	e.dbURL = p.url(url.UserPassword("pwuser", wrong), "tls_shop", url.Values{"sslmode": {"verify-full"}, "sslrootcert": {p.caFile}})
	out, code = e.cli("run", "--config", e.config())
	oneLine(t, "wrong password", out, code, []string{wrong}, "cannot connect to PostgreSQL", "password authentication failed")
	out, code = e.cli("status", "--database-url", e.dbURL)
	oneLine(t, "status with a wrong password", out, code, []string{wrong}, "password authentication failed")
}

// TestRoleLeastPrivilege runs the relay end to end as the role `migrate
// --print-role` describes: no superuser, no ownership. It records its
// checkpoint, dead-letters a poison message, sends heartbeats, and its
// role can run status and dlq list. Taking a grant away makes the relay
// refuse to start with one line that names the GRANT.
func TestRoleLeastPrivilege(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	ownerURL := e.dbURL
	role := fmt.Sprintf("relay_%d_%d", os.Getpid(), dbCounter.Add(1))
	if _, err := e.db.Exec(ctx, roleSQL(t, e, role), pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("role SQL: %v", err)
	}
	var super, replication, emit bool
	if err := e.db.QueryRow(ctx, `SELECT rolsuper, rolreplication,
		(SELECT bool_or(has_function_privilege($1, p.oid, 'EXECUTE')) FROM pg_proc p WHERE p.proname = 'pg_logical_emit_message')
		FROM pg_roles WHERE rolname = $1`, role).Scan(&super, &replication, &emit); err != nil {
		t.Fatal(err)
	}
	if super || !replication {
		t.Fatalf("role %s: superuser %v, replication %v", role, super, replication)
	}
	if !emit {
		t.Errorf("PUBLIC may not execute pg_logical_emit_message here; heartbeats need a GRANT EXECUTE")
	}
	// pgserver trusts loopback, so the password is not checked here.
	u, _ := url.Parse(ownerURL)
	u.User = url.UserPassword(role, "CHANGE-ME")
	e.dbURL = u.String()

	c := e.consume("outbox.order")
	p := e.start("OUTBOXRELAY_POSTGRES_HEARTBEAT_INTERVAL=200ms", "OUTBOXRELAY_RELAY_MAX_ATTEMPTS=1")
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := e.insert("outbox", "order", "1", 3)
	var poison string
	if err := e.db.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('no good', '7', 'order.created', '{}') RETURNING id::text`).Scan(&poison); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, e.insert("outbox", "order", "1", 3)...)
	c.waitIDs(ids, 30*time.Second)
	waitFor(t, 20*time.Second, "the checkpoint and the dead letter", func() bool {
		var ok bool
		err := e.db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM outboxrelay.checkpoint WHERE slot = 'outboxrelay' AND confirmed_lsn IS NOT NULL)
			AND EXISTS (SELECT FROM outboxrelay.dead_letters WHERE message_id = $1)`, poison).Scan(&ok)
		return err == nil && ok
	})
	time.Sleep(time.Second) // heartbeats
	p.stop()
	for _, line := range strings.Split(p.out.String(), "\n") {
		if strings.Contains(line, "permission denied") || strings.Contains(line, "42501") {
			t.Errorf("the relay's role lacks a privilege: %s", line)
		}
	}
	if out, code := e.cli("dlq", "list", "--database-url", e.dbURL); code != 0 || !strings.Contains(out, poison) {
		t.Errorf("dlq list as %s: exit %d\n%s", role, code, out)
	}
	if out, code := e.cli("status", "--database-url", e.dbURL, "--json"); code != 0 || strings.Contains(out, "warnings") {
		t.Errorf("status as %s: exit %d\n%s", role, code, out)
	}

	// Without the grants to write its checkpoint and dead letters, the
	// relay refuses to start and names them.
	e.exec(fmt.Sprintf("REVOKE UPDATE ON outboxrelay.checkpoint FROM %s", role))
	e.exec(fmt.Sprintf("REVOKE INSERT ON outboxrelay.dead_letters FROM %s", role))
	out, code := e.cli("run", "--config", e.config())
	oneLine(t, "missing grants", out, code, nil,
		fmt.Sprintf("GRANT UPDATE ON outboxrelay.checkpoint TO %s; GRANT INSERT ON outboxrelay.dead_letters TO %s", role, role))
	// With dead letters off, the second grant is not needed.
	out, _ = e.cliEnv([]string{"OUTBOXRELAY_RELAY_DEAD_LETTERS=false"}, "run", "--config", e.config())
	if strings.Contains(out, "dead_letters") {
		t.Errorf("dead letters off, yet their grant is asked for: %s", out)
	}
}

// TestKafkaTLSSASL relays through a broker that takes only TLS and
// SCRAM-SHA-512 (kfake over TCP), the password read from a file named in
// the environment. A wrong password is one clear line, exit 2, without it.
func TestKafkaTLSSASL(t *testing.T) {
	const password = "kafka-Pa55word-canary"
	e := newEnv(t)
	ca := newTestCA(t, "outboxrelay test CA")
	var err error
	e.kafka, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{ca.tlsCert(t, "kfake", "127.0.0.1")}, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "relay", password))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.kafka.Close)
	e.brokers = e.kafka.ListenAddrs()[0]
	dir := t.TempDir()
	kafkaEnv := []string{
		"OUTBOXRELAY_SINK_KAFKA_TLS_ENABLED=true",
		"OUTBOXRELAY_SINK_KAFKA_TLS_CA_FILE=" + writeFileT(t, dir, "ca.pem", ca.pem),
		"OUTBOXRELAY_SINK_KAFKA_SASL_MECHANISM=SCRAM-SHA-512",
		"OUTBOXRELAY_SINK_KAFKA_SASL_USERNAME=relay",
		"OUTBOXRELAY_SINK_KAFKA_SASL_PASSWORD_FILE=" + writeFileT(t, dir, "password", []byte(password+"\n")),
	}
	c := e.consumeWith([]kgo.Opt{
		kgo.DialTLSConfig(&tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}),
		kgo.SASL(scram.Auth{User: "relay", Pass: password}.AsSha512Mechanism()),
	}, "outbox.order")
	p := e.start(kafkaEnv...)
	p.waitLog(`"streaming"`, 30*time.Second)
	c.waitIDs(e.insert("outbox", "order", "1", 5), 30*time.Second)
	p.stop()
	if strings.Contains(p.out.String(), password) {
		t.Errorf("the relay logged the Kafka password")
	}

	wrongEnv := append(append([]string(nil), kafkaEnv...),
		"OUTBOXRELAY_SINK_KAFKA_SASL_PASSWORD_FILE="+writeFileT(t, dir, "wrong", []byte("wrong-"+password)))
	out, code := e.cliEnv(wrongEnv, "run", "--config", e.config())
	oneLine(t, "wrong Kafka password", out, code, []string{password}, "cannot reach Kafka", "authentication failed")

	untrusted := append(append([]string(nil), kafkaEnv...),
		"OUTBOXRELAY_SINK_KAFKA_TLS_CA_FILE="+writeFileT(t, dir, "other.pem", newTestCA(t, "other").pem))
	out, code = e.cliEnv(untrusted, "run", "--config", e.config())
	oneLine(t, "untrusted broker certificate", out, code, []string{password}, "cannot reach Kafka", "check sink.kafka.tls.ca_file")
}

// tlsProxy terminates TLS, requiring a client certificate signed by its
// CA, and forwards the bytes to backend. It records the verified client
// certificates' common names.
type tlsProxy struct {
	addr string
	mu   sync.Mutex
	cns  []string
}

func startTLSProxy(t *testing.T, cert tls.Certificate, clientCAs *x509.CertPool, backend string) *tlsProxy {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{cert}, ClientCAs: clientCAs,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	})
	if err != nil {
		t.Fatal(err)
	}
	p := &tlsProxy{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				tc := c.(*tls.Conn)
				_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
				if err := tc.Handshake(); err != nil {
					return
				}
				_ = tc.SetDeadline(time.Time{})
				p.mu.Lock()
				p.cns = append(p.cns, tc.ConnectionState().PeerCertificates[0].Subject.CommonName)
				p.mu.Unlock()
				b, err := net.Dial("tcp", backend)
				if err != nil {
					return
				}
				defer b.Close()
				mu.Lock()
				open = append(open, c, b)
				mu.Unlock()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(b, tc); done <- struct{}{} }()
				go func() { _, _ = io.Copy(tc, b); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return p
}

func (p *tlsProxy) clients() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.cns...)
}

// TestRabbitMQTLS relays over amqps:// with a client certificate and a
// server name (tls.server_name) to the shared RabbitMQ, through a TLS
// terminating proxy on loopback: the broker itself is not reconfigured,
// so that the tests sharing it are not disturbed. The proxy verifies the
// relay's certificate; the relay verifies the proxy's against its CA file.
// auth: external offers SASL EXTERNAL, which this broker (without
// rabbitmq_auth_mechanism_ssl) refuses: one clear line.
func TestRabbitMQTLS(t *testing.T) {
	e := newEnv(t)
	q, qEnv := rabbitEnv(t, "order.#")
	ca := newTestCA(t, "outboxrelay test CA")
	proxy := startTLSProxy(t, ca.tlsCert(t, "rabbit", "rabbit.test"), ca.pool, "127.0.0.1:5672")
	dir := t.TempDir()
	cc, ck := ca.issue(t, "outboxrelay")
	tlsEnv := append(qEnv,
		"OUTBOXRELAY_SINK_RABBITMQ_URL=amqps://guest:guest@"+proxy.addr+"/",
		"OUTBOXRELAY_SINK_RABBITMQ_TLS_CA_FILE="+writeFileT(t, dir, "ca.pem", ca.pem),
		"OUTBOXRELAY_SINK_RABBITMQ_TLS_CERT_FILE="+writeFileT(t, dir, "client.crt", cc),
		"OUTBOXRELAY_SINK_RABBITMQ_TLS_KEY_FILE="+writeFileT(t, dir, "client.key", ck),
		"OUTBOXRELAY_SINK_RABBITMQ_TLS_SERVER_NAME=rabbit.test",
	)
	p := e.start(tlsEnv...)
	p.waitLog(`"streaming"`, 30*time.Second)
	q.waitIDs(e.insert("outbox", "order", "1", 5), 30*time.Second)
	p.stop()
	if cns := proxy.clients(); len(cns) == 0 || cns[0] != "outboxrelay" {
		t.Errorf("client certificates seen by the TLS endpoint: %v", cns)
	}

	noServerName := append(append([]string(nil), tlsEnv...), "OUTBOXRELAY_SINK_RABBITMQ_TLS_SERVER_NAME=")
	out, code := e.cliEnv(noServerName, "run", "--config", e.config())
	oneLine(t, "certificate for another name", out, code, []string{"guest:guest"}, "cannot reach RabbitMQ", "check sink.rabbitmq.tls.ca_file and server_name")

	var noCert []string
	for _, kv := range tlsEnv {
		if !strings.HasPrefix(kv, "OUTBOXRELAY_SINK_RABBITMQ_TLS_CERT_FILE=") && !strings.HasPrefix(kv, "OUTBOXRELAY_SINK_RABBITMQ_TLS_KEY_FILE=") {
			noCert = append(noCert, kv)
		}
	}
	out, code = e.cliEnv(noCert, "run", "--config", e.config())
	oneLine(t, "no client certificate", out, code, []string{"guest:guest"}, "cannot reach RabbitMQ")

	external := append(append([]string(nil), tlsEnv...), "OUTBOXRELAY_SINK_RABBITMQ_AUTH=external")
	out, code = e.cliEnv(external, "run", "--config", e.config())
	oneLine(t, "auth external", out, code, nil, "cannot reach RabbitMQ", "rabbitmq_auth_mechanism_ssl")
}

// TestSecretsNeverLeak sets one known secret as the PostgreSQL password
// (from a file), the Kafka SASL password, the HTTP token and the RabbitMQ
// password, and looks for it in everything the relay prints: the logs of
// a run at debug level through SIGTERM, failing runs, status, status
// --json, --check-config and dlq list.
func TestSecretsNeverLeak(t *testing.T) {
	const secret = "Leak-Canary-7f3a9"
	e := newEnv(t)
	var err error
	e.kafka, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "relay", secret))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.kafka.Close)
	e.brokers = e.kafka.ListenAddrs()[0]
	u, _ := url.Parse(e.dbURL)
	u.User = url.UserPassword("postgres", secret) // trusted: the password is not checked
	secretURL := u.String()
	dir := t.TempDir()
	urlFile := writeFileT(t, dir, "pgurl", []byte(secretURL+"\n"))
	base := []string{
		"OUTBOXRELAY_POSTGRES_URL_FILE=" + urlFile, // wins over the file's url
		"OUTBOXRELAY_SINK_KAFKA_SASL_MECHANISM=SCRAM-SHA-256",
		"OUTBOXRELAY_SINK_KAFKA_SASL_USERNAME=relay",
		"OUTBOXRELAY_SINK_KAFKA_SASL_PASSWORD=" + secret,
		"OUTBOXRELAY_HTTP_TOKEN=" + secret,
		"OUTBOXRELAY_LOG_LEVEL=debug",
		"OUTBOXRELAY_RELAY_MAX_ATTEMPTS=1",
	}
	var outputs []string
	check := func(what, out string) {
		t.Helper()
		if strings.Contains(out, secret) {
			t.Errorf("%s shows the secret:\n%s", what, out)
		}
		outputs = append(outputs, what)
	}

	c := e.consumeWith([]kgo.Opt{kgo.SASL(scram.Auth{User: "relay", Pass: secret}.AsSha256Mechanism())}, "outbox.order")
	p := e.start(base...)
	addr := p.httpAddr()
	p.waitLog(`"streaming"`, 30*time.Second)
	c.waitIDs(e.insert("outbox", "order", "1", 3), 30*time.Second)
	e.exec(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('no good', '1', 'x', '{}')`)
	waitFor(t, 20*time.Second, "a dead letter", func() bool {
		var n int
		return e.db.QueryRow(t.Context(), "SELECT count(*) FROM outboxrelay.dead_letters").Scan(&n) == nil && n > 0
	})
	for _, path := range []string{"/status", "/metrics"} {
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s with the token: %d", path, resp.StatusCode)
		}
		check("GET "+path, string(body))
	}
	p.stop()
	check("relay logs", p.out.String())

	cfgPath := e.config()
	failing := map[string][]string{
		"wrong Kafka password":     {"OUTBOXRELAY_SINK_KAFKA_SASL_PASSWORD=" + secret + "-wrong"},
		"unreachable PostgreSQL":   {"OUTBOXRELAY_POSTGRES_URL_FILE=", "OUTBOXRELAY_POSTGRES_URL=postgres://postgres:" + secret + "@127.0.0.1:1/x"},
		"unparsable PostgreSQL":    {"OUTBOXRELAY_POSTGRES_URL_FILE=", "OUTBOXRELAY_POSTGRES_URL=postgres://postgres:" + secret + "@127.0.0.1:port/x?sslpassword=" + secret},
		"unreachable RabbitMQ":     {"OUTBOXRELAY_SINK_TYPE=rabbitmq", "OUTBOXRELAY_SINK_RABBITMQ_URL=amqp://guest:" + secret + "@127.0.0.1:1/"},
		"invalid RabbitMQ URL":     {"OUTBOXRELAY_SINK_TYPE=rabbitmq", "OUTBOXRELAY_SINK_RABBITMQ_URL=amqp://guest:" + secret + "@127.0.0.1:x/"},
		"bad configuration":        {"OUTBOXRELAY_POSTGRES_SLOT=Not A Slot"},
		"missing password file":    {"OUTBOXRELAY_SINK_KAFKA_SASL_PASSWORD=", "OUTBOXRELAY_SINK_KAFKA_SASL_PASSWORD_FILE=" + dir + "/" + secret},
		"unreachable NATS":         {"OUTBOXRELAY_SINK_TYPE=nats", "OUTBOXRELAY_SINK_NATS_URL=nats://relay:" + secret + "@127.0.0.1:1"},
		"unreachable Redis":        {"OUTBOXRELAY_SINK_TYPE=redis", "OUTBOXRELAY_SINK_REDIS_URL=redis://:" + secret + "@127.0.0.1:1/0"},
		"token with a space":       {"OUTBOXRELAY_HTTP_TOKEN=" + secret + " x"},
		"both url and url_file":    {"OUTBOXRELAY_POSTGRES_URL=" + secretURL},
		"url_file names nothing":   {"OUTBOXRELAY_POSTGRES_URL_FILE=" + dir + "/none"},
		"heartbeat not a duration": {"OUTBOXRELAY_POSTGRES_HEARTBEAT_INTERVAL=" + secret},
	}
	for what, extra := range failing {
		out, code := e.cliEnv(append(append([]string(nil), base...), extra...), "run", "--config", cfgPath)
		if code != 2 {
			t.Errorf("%s: exit %d, want 2\n%s", what, code, out)
		}
		t.Logf("%s: %s", what, tail(strings.TrimSpace(out), 1))
		if what == "missing password file" || what == "heartbeat not a duration" {
			// The file's name and the bad value are the user's input, not a secret.
			continue
		}
		check(what, out)
	}

	out, code := e.cliEnv(base, "run", "--check-config", "--config", cfgPath)
	if code != 0 || !strings.Contains(out, "password: xxxxx") || !strings.Contains(out, "token: xxxxx") || !strings.Contains(out, "postgres:xxxxx@") {
		t.Errorf("--check-config exit %d:\n%s", code, out)
	}
	check("--check-config", out)
	for _, args := range [][]string{
		{"status", "--database-url", secretURL},
		{"status", "--database-url", secretURL, "--json"},
		{"dlq", "list", "--database-url", secretURL},
		{"dlq", "list", "--database-url", secretURL, "--json"},
		{"dlq", "list", "--config", cfgPath},
		{"status", "--database-url", strings.Replace(secretURL, "127.0.0.1", "127.0.0.1:1", 1)},
	} {
		out, _ := e.cliEnv(base, args...)
		check(strings.Join(args, " "), out)
	}
	out, code = e.cliEnv([]string{"OUTBOXRELAY_POSTGRES_URL_FILE=" + urlFile}, "status", "--json")
	if code != 0 {
		t.Errorf("status with OUTBOXRELAY_POSTGRES_URL_FILE: exit %d\n%s", code, out)
	}
	check("status from a URL file", out)
}

// TestHTTPToken: with http.token_file, /status and /metrics need the
// bearer token; /healthz and /readyz stay open for probes.
func TestHTTPToken(t *testing.T) {
	const token = "http-Token-0123456789abcdef"
	e := newEnv(t)
	p := e.start("OUTBOXRELAY_HTTP_TOKEN_FILE=" + writeFileT(t, t.TempDir(), "token", []byte(token+"\n")))
	addr := p.httpAddr()
	p.waitLog(`"streaming"`, 30*time.Second)
	do := func(path, auth string) int {
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitFor(t, 20*time.Second, "readiness", func() bool { return do("/readyz", "") == 200 })
	if code := do("/healthz", ""); code != 200 {
		t.Errorf("/healthz without a token: %d", code)
	}
	for _, path := range []string{"/status", "/metrics"} {
		for _, auth := range []string{"", "Bearer nope", "Basic " + token} {
			if code := do(path, auth); code != http.StatusUnauthorized {
				t.Errorf("%s with %q: %d, want 401", path, auth, code)
			}
		}
		if code := do(path, "Bearer "+token); code != 200 {
			t.Errorf("%s with the token: %d, want 200", path, code)
		}
	}
	p.stop()
	if strings.Contains(p.out.String(), token) {
		t.Error("the relay logged the token")
	}
}
