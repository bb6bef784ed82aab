package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sun_path holds 108 bytes including the terminating NUL.
const maxSocketPath = 107

// Name of the file, inside the data directory, that holds the settings
// written before every start; postgresql.conf includes it.
const confFile = "pgserver.conf"

// osUser is the OS account the PostgreSQL commands run as when this process
// is root.
type osUser struct {
	name     string
	uid, gid int
	runuser  string
}

// currentOSUser returns nil when the commands can run as the current user,
// and the postgres account when the current user is root, which initdb and
// postgres refuse to run as.
func currentOSUser() (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		if _, ok := errors.AsType[user.UnknownUserError](err); ok {
			return nil, errors.New("running as root, but there is no postgres OS user to run PostgreSQL as (initdb refuses root); create it with: useradd --system --create-home postgres, or run as a non-root user")
		}
		return nil, fmt.Errorf("look up the postgres OS user: %w", err)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return nil, fmt.Errorf("postgres OS user: uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return nil, fmt.Errorf("postgres OS user: gid %q: %w", u.Gid, err)
	}
	runuser, err := exec.LookPath("runuser")
	if err != nil {
		return nil, errors.New("running as root, but runuser is not installed to run PostgreSQL as the postgres OS user; install it with: apt-get install util-linux")
	}
	return &osUser{name: u.Username, uid: uid, gid: gid, runuser: runuser}, nil
}

// command runs a server binary, as the postgres OS user when needed.
// Cancelling ctx sends SIGTERM, which runuser passes on.
func (s *Server) command(ctx context.Context, bin string, args ...string) *exec.Cmd {
	path := filepath.Join(s.binDir, bin)
	var cmd *exec.Cmd
	if s.osUser != nil {
		cmd = exec.CommandContext(ctx, s.osUser.runuser, append([]string{"-u", s.osUser.name, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	// The postgres user may not be able to enter the caller's directory.
	cmd.Dir = s.workDir
	cmd.Env = serverEnv()
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// serverEnv is this process's environment without the PG* variables, so
// that a developer's PGDATA or PGPORT cannot redirect the commands.
func serverEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PG")
	})
}

// pgCtl runs pg_ctl action on the data directory, waiting for it to finish.
func (s *Server) pgCtl(ctx context.Context, action string, args ...string) (string, error) {
	args = append([]string{action, "-D", s.dataDir, "-w", "-t", strconv.Itoa(int(pgCtlTimeout / time.Second))}, args...)
	out, err := s.command(ctx, "pg_ctl", args...).CombinedOutput()
	if err != nil && ctx.Err() != nil {
		return string(out), fmt.Errorf("pg_ctl %s: %w", action, context.Cause(ctx))
	}
	if err != nil {
		return string(out), fmt.Errorf("pg_ctl %s: %w\n%s\nserver log (last lines):\n%s",
			action, err, bytes.TrimSpace(out), s.LogTail(20))
	}
	return string(out), nil
}

// prepareDirs creates the data directory when the caller named one, and
// hands the directories to the postgres OS user.
func (s *Server) prepareDirs() error {
	if s.dataDir != filepath.Join(s.workDir, "data") {
		if err := os.MkdirAll(s.dataDir, 0o700); err != nil {
			return fmt.Errorf("create data directory: %w", err)
		}
		// PostgreSQL refuses a data directory that others can read.
		if err := os.Chmod(s.dataDir, 0o700); err != nil {
			return fmt.Errorf("data directory: %w", err)
		}
	}
	if s.osUser == nil {
		return nil
	}
	if err := os.Chown(s.workDir, s.osUser.uid, s.osUser.gid); err != nil {
		return fmt.Errorf("hand %s to the postgres OS user: %w", s.workDir, err)
	}
	if !fileExists(filepath.Join(s.dataDir, "PG_VERSION")) && fileExists(s.dataDir) {
		if err := os.Chown(s.dataDir, s.osUser.uid, s.osUser.gid); err != nil {
			return fmt.Errorf("hand %s to the postgres OS user: %w", s.dataDir, err)
		}
	}
	if err := s.ensureSearchable(s.workDir); err != nil {
		return err
	}
	return s.ensureSearchable(s.dataDir)
}

// ensureSearchable makes sure the postgres OS user can reach dir. Parent
// directories inside the system temporary directory (such as the 0700
// directories of testing.T.TempDir) get the others-search bit, which lets
// the user pass through them without listing them; anything else is left
// alone and reported.
func (s *Server) ensureSearchable(dir string) error {
	tmp := filepath.Clean(os.TempDir())
	var parents []string
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		parents = append(parents, p)
		if p == filepath.Dir(p) {
			break
		}
	}
	slices.Reverse(parents)
	for _, p := range parents {
		info, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("data directory parent: %w", err)
		}
		if s.searchable(info) {
			continue
		}
		rel, err := filepath.Rel(tmp, p)
		if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
			return fmt.Errorf("the postgres OS user cannot enter %s; run chmod o+x %s or choose a directory it can reach", p, p)
		}
		if err := os.Chmod(p, info.Mode().Perm()|0o001); err != nil {
			return fmt.Errorf("let the postgres OS user enter %s: %w", p, err)
		}
		s.logf("pgserver: added o+x to %s so the postgres OS user can reach the data directory", p)
	}
	return nil
}

func (s *Server) searchable(info fs.FileInfo) bool {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return true
	}
	perm := info.Mode().Perm()
	switch {
	case int(st.Uid) == s.osUser.uid:
		return perm&0o100 != 0
	case int(st.Gid) == s.osUser.gid:
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

// initdb creates the cluster unless the data directory already holds one,
// and makes postgresql.conf include the file that start writes.
func (s *Server) initdb(ctx context.Context) error {
	if fileExists(filepath.Join(s.dataDir, "PG_VERSION")) {
		s.logf("pgserver: reusing the cluster in %s", s.dataDir)
	} else {
		s.logf("pgserver: initdb %s", s.dataDir)
		out, err := s.command(ctx, "initdb",
			"-D", s.dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C",
			// The cluster is disposable; skipping the final fsync saves seconds.
			"--no-sync",
		).CombinedOutput()
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("initdb: %w", context.Cause(ctx))
		}
		if err != nil {
			return fmt.Errorf("initdb: %w\n%s", err, bytes.TrimSpace(out))
		}
	}
	conf := filepath.Join(s.dataDir, "postgresql.conf")
	b, err := os.ReadFile(conf)
	if err != nil {
		return fmt.Errorf("read postgresql.conf: %w", err)
	}
	include := "include = '" + confFile + "'"
	if bytes.Contains(b, []byte(include)) {
		return nil
	}
	b = append(b, "\n# Settings written by pgserver before each start.\n"+include+"\n"...)
	return s.writeFile(conf, b)
}

// writeHBA trusts every local and loopback connection, replication
// included, after the caller's own lines (Options.HBA).
func (s *Server) writeHBA() error {
	const hba = `# Written by pgserver: a throwaway cluster that trusts loopback.
# TYPE  DATABASE     USER  ADDRESS       METHOD
local   all          all                 trust
local   replication  all                 trust
host    all          all   127.0.0.1/32  trust
host    replication  all   127.0.0.1/32  trust
`
	var b bytes.Buffer
	if len(s.hba) > 0 {
		b.WriteString("# Options.HBA\n")
		for _, l := range s.hba {
			b.WriteString(l + "\n")
		}
	}
	b.WriteString(hba)
	return s.writeFile(filepath.Join(s.dataDir, "pg_hba.conf"), b.Bytes())
}

// startOnFreePort picks a port, writes the settings and starts the server,
// picking another port if a different process took the first one meanwhile.
func (s *Server) startOnFreePort(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		s.port = port
		if err := s.writeFile(filepath.Join(s.dataDir, confFile), s.conf()); err != nil {
			return err
		}
		logStart := fileSize(s.logFile)
		s.logf("pgserver: starting PostgreSQL from %s on 127.0.0.1:%d", s.binDir, s.port)
		_, err = s.pgCtl(ctx, "start", "-l", s.logFile)
		if err == nil {
			return nil
		}
		if attempt < 3 && ctx.Err() == nil && logContains(s.logFile, logStart, "could not bind") {
			s.logf("pgserver: port %d was taken; trying another", s.port)
			continue
		}
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
}

// conf renders pgserver.conf. Every value is quoted, which postgresql.conf
// accepts for settings of any type.
func (s *Server) conf() []byte {
	var b bytes.Buffer
	b.WriteString("# Written by pgserver before each start; edits are overwritten.\n")
	set := func(k, v string) { fmt.Fprintf(&b, "%s = %s\n", k, quoteConf(v)) }
	set("listen_addresses", "127.0.0.1")
	set("port", strconv.Itoa(s.port))
	set("unix_socket_directories", s.sockDir)
	set("wal_level", "logical")
	set("max_wal_senders", "20")
	set("max_replication_slots", "20")
	set("fsync", "off")
	set("synchronous_commit", "on")
	set("full_page_writes", "off")
	set("shared_buffers", "128MB")
	if len(s.settings) > 0 {
		b.WriteString("# Options.Settings\n")
		for _, k := range slices.Sorted(maps.Keys(s.settings)) {
			set(k, s.settings[k])
		}
	}
	return b.Bytes()
}

var settingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*$`)

func validateSettings(settings map[string]string) error {
	for k, v := range settings {
		if !settingName.MatchString(k) {
			return fmt.Errorf("setting %q: not a PostgreSQL parameter name", k)
		}
		if strings.ContainsAny(v, "\n\r\x00") {
			return fmt.Errorf("setting %s: value must be a single line", k)
		}
	}
	return nil
}

func quoteConf(v string) string {
	v = strings.ReplaceAll(v, `\`, `\\`)
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

// writeFile writes a file in the data directory, owned by the user the
// server runs as.
func (s *Server) writeFile(path string, data []byte) error {
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	if s.osUser != nil {
		if err := os.Chown(path, s.osUser.uid, s.osUser.gid); err != nil {
			return fmt.Errorf("write %s: %w", filepath.Base(path), err)
		}
	}
	return nil
}

// Ports are picked below the kernel's ephemeral range when it leaves room, so
// that an outgoing connection cannot take the port while the server is down
// between Kill and StartAgain.
const lowestPort = 20000

func freePort() (int, error) {
	if hi := ephemeralLow(); hi-lowestPort >= 1000 {
		for range 20 {
			port := lowestPort + rand.IntN(hi-lowestPort)
			if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
				l.Close()
				return port, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow returns the first port of the kernel's ephemeral range, or 0
// if unknown.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[0])
	return n
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func fileSize(path string) int64 {
	info, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return info.Size()
}

// logContains reports whether the log, from byte offset from on, contains s.
func logContains(path string, from int64, s string) bool {
	b, err := os.ReadFile(path)
	if err != nil || from > int64(len(b)) {
		return false
	}
	return bytes.Contains(b[from:], []byte(s))
}

// tailFile returns the last n lines of a file, reading at most its last
// 256 KiB.
func tailFile(path string, n int) string {
	if n <= 0 {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const window = 256 << 10
	if info, err := f.Stat(); err == nil && info.Size() > window {
		if _, err := f.Seek(info.Size()-window, 0); err != nil {
			return ""
		}
	}
	var b bytes.Buffer
	if _, err := b.ReadFrom(f); err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
