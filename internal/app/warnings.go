package app

import (
	"fmt"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outboxrelay/internal/config"
)

// Warnings lists settings that work but leave something exposed. Run logs
// them at start and `run --check-config` prints them.
func Warnings(cfg config.Config) []string {
	var ws []string
	if pc, err := pgconn.ParseConfig(cfg.Postgres.URL); err == nil && !loopback(pc.Host) {
		if t := pc.TLSConfig; t == nil || t.InsecureSkipVerify && t.VerifyPeerCertificate == nil {
			ws = append(ws, "postgres.url does not verify the server's certificate; use sslmode=verify-full with sslrootcert=<CA file>")
		}
	}
	if host, _, err := net.SplitHostPort(cfg.HTTP.Listen); err == nil && cfg.HTTP.Token == "" && !loopback(host) {
		ws = append(ws, fmt.Sprintf("http.listen %s is reachable from other hosts and http.token is not set: /status and /metrics are open", cfg.HTTP.Listen))
	}
	if set := cfg.Sink.Settings(); set != nil {
		ws = append(ws, set.Warnings()...)
	}
	return ws
}

// loopback reports whether host (a name, an address or a unix socket
// directory) stays on this machine.
func loopback(host string) bool {
	if host == "localhost" || strings.HasPrefix(host, "/") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
