package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// defaultStartTimeout bounds a start, a restart and a cluster's formation.
	defaultStartTimeout = 10 * time.Second
	// stopGrace is how long a stop waits after SIGTERM before it sends SIGKILL.
	stopGrace = 5 * time.Second
	// pollInterval is the pause between two readiness probes.
	pollInterval = 5 * time.Millisecond
	// maxPortAttempts bounds how many ports one start tries.
	maxPortAttempts = 20
	// logTailLines is how many log lines an error or a failed test shows.
	logTailLines = 30
	// installHint says how to get the binaries this package runs.
	installHint = "run `make deps` or apt-get install -y redis-server redis-tools"
)

// errPortInUse means redis-server could not bind its port (or its cluster
// bus port): somebody took it between the pick and the bind.
var errPortInUse = errors.New("redistest: port already in use")

// Option changes how a server (or every node of a cluster) is started.
type Option func(*config)

type config struct {
	extraArgs    []string
	tls          *TLS   // WithTLS; nil: plaintext
	password     string // WithPassword; empty: no AUTH
	startTimeout time.Duration
	// pickPort returns a port to try; cluster is set when port+10000 (the
	// cluster bus) must be free too. Tests of this package replace it.
	pickPort func(cluster bool) (int, error)
}

func newConfig(opts []Option) config {
	c := config{startTimeout: defaultStartTimeout, pickPort: newPortPicker().pick}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WithArgs appends redis-server command-line arguments, for example
// WithArgs("--maxmemory", "10mb", "--maxmemory-policy", "allkeys-lru").
// They come after this package's own arguments and so override them; do not
// override --port or --bind, and set a password with WithPassword rather
// than --requirepass (the readiness probe must know it).
func WithArgs(args ...string) Option {
	return func(c *config) { c.extraArgs = append(c.extraArgs, args...) }
}

// WithStartTimeout bounds how long a start (or Restart, or a cluster's
// formation) may take before the test fails. Default 10 s; d <= 0 keeps the
// default.
func WithStartTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.startTimeout = d
		}
	}
}

// Server is one redis-server process on 127.0.0.1, owned by the test that
// started it. Its address never changes, across Stop and Restart.
//
// Methods other than Restart are safe for concurrent use. Stop, Kill and
// Restart block until the process has exited (and, for Restart, until the new
// one answers).
type Server struct {
	addr    string
	port    int
	dir     string
	bin     string
	cluster bool
	cfg     config
	tlsCfg  *tls.Config // this package's clients' TLS; nil without WithTLS
	log     *tailBuffer

	mu     sync.Mutex // guards proc and ended; held across stop and start
	proc   *process   // nil while stopped
	ended  bool       // the owning test's cleanup has run
	cliMu  sync.Mutex // guards client
	client *redis.Client
}

// process is one running redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd.Wait has returned
}

// StartServer starts a standalone redis-server on a free loopback port with
// no persistence, waits until it answers (bounded by the start timeout,
// default 10 s) and registers t.Cleanup to stop it and remove its files.
// It fails the test with t.Fatalf, including the last lines of the server's
// log, if redis-server is not installed or does not come up.
func StartServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s, err := startServer(t, newConfig(opts), false)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return s
}

// startServer starts one server, standalone or as a cluster node, retrying
// on another port when the one it picked is taken.
func startServer(t testing.TB, cfg config, cluster bool) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redistest: redis-server not found: %s", installHint)
	}
	tlsCfg, err := cfg.clientTLS()
	if err != nil {
		return nil, err
	}
	s := &Server{
		tlsCfg:  tlsCfg,
		dir:     t.TempDir(),
		bin:     bin,
		cluster: cluster,
		cfg:     cfg,
		log:     &tailBuffer{},
	}
	deadline := time.Now().Add(cfg.startTimeout)
	for attempt := 1; ; attempt++ {
		port, err := cfg.pickPort(cluster)
		if err != nil {
			return nil, err
		}
		s.port = port
		s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if err := clearDir(s.dir); err != nil {
			return nil, err
		}
		proc, err := s.launch(deadline)
		if errors.Is(err, errPortInUse) && attempt < maxPortAttempts {
			continue
		}
		if err != nil {
			return nil, err
		}
		s.proc = proc
		t.Cleanup(func() { s.cleanup(t) })
		return s, nil
	}
}

// Addr returns the server's address, "127.0.0.1:PORT".
func (s *Server) Addr() string { return s.addr }

// Port returns the server's TCP port.
func (s *Server) Port() int { return s.port }

// Client returns a go-redis client for this server, created on first use
// with go-redis defaults (and the TLS and password of WithTLS and
// WithPassword) and closed when the owning test ends. It survives
// Stop and Restart: its next command after a Restart reconnects.
func (s *Server) Client() *redis.Client {
	s.cliMu.Lock()
	defer s.cliMu.Unlock()
	if s.client == nil {
		s.client = redis.NewClient(&redis.Options{Addr: s.addr, TLSConfig: s.tlsCfg, Password: s.cfg.password})
	}
	return s.client
}

// Stop stops the server (SIGTERM, then SIGKILL after 5 s) and waits until the
// process has exited, for tests that take Redis away. Its data is gone. The
// port is not held while the server is stopped; this package never hands it
// to another server, but another process could take it and make Restart
// fail. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.stop(stopGrace)
		s.proc = nil
	}
}

// Kill ends the server abruptly with SIGKILL, as a crash would, and waits
// until the process has exited. Killing a stopped server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.stop(0)
		s.proc = nil
	}
}

// Restart stops the server if it is running, starts it again on the same
// port (empty, apart from a cluster node's nodes.conf), and waits until it
// answers, so existing clients reconnect to the same address. It fails t if
// the server cannot come up within the start timeout, for example because
// another process took the port meanwhile. Call it from t's goroutine.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.restart(); err != nil {
		t.Fatalf("%v", err)
	}
}

func (s *Server) restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return fmt.Errorf("redistest: restart of %s after its test ended", s.addr)
	}
	if s.proc != nil {
		s.proc.stop(stopGrace)
		s.proc = nil
	}
	deadline := time.Now().Add(s.cfg.startTimeout)
	for {
		proc, err := s.launch(deadline)
		if err == nil {
			s.proc = proc
			return nil
		}
		if !errors.Is(err, errPortInUse) || time.Now().After(deadline) {
			return fmt.Errorf("redistest: restart on the same address: %w", err)
		}
		// The port is held by someone else; it may be let go. Try again
		// until the deadline.
		time.Sleep(50 * time.Millisecond)
	}
}

// cleanup runs at the end of the owning test.
func (s *Server) cleanup(t testing.TB) {
	s.cliMu.Lock()
	if s.client != nil {
		_ = s.client.Close()
	}
	s.cliMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	if s.proc != nil {
		s.proc.stop(stopGrace)
		s.proc = nil
	}
	if t.Failed() {
		t.Logf("redistest: last lines of the log of redis-server %s:\n%s", s.addr, s.log.lastLines(logTailLines))
	}
}

// args returns the command line of the server.
func (s *Server) args() []string {
	a := append(s.cfg.tlsArgs(s.port, s.cluster),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--logfile", "", // log to stdout, which we capture
		"--loglevel", "notice",
		// Redis acts on SIGTERM in its cron, which runs hz times a second:
		// at the default 10 every stop would take up to 100 ms. An idle
		// server at 100 uses about 0.7% of a core.
		"--hz", "100",
	)
	if s.cfg.password != "" {
		a = append(a, "--requirepass", s.cfg.password)
	}
	if s.cluster {
		a = append(a,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.dir, "nodes.conf"),
			"--cluster-node-timeout", "5000",
		)
	}
	return append(a, s.cfg.extraArgs...)
}

// launch starts redis-server on s.port and waits until that very process
// answers or the deadline passes. It returns errPortInUse (wrapped) when the
// process could not bind a port.
func (s *Server) launch(deadline time.Time) (*process, error) {
	mark := s.log.written()
	fmt.Fprintf(s.log, "--- redistest: starting redis-server on %s ---\n", s.addr)
	cmd := exec.Command(s.bin, s.args()...)
	cmd.Dir = s.dir
	cmd.Stdout = s.log
	cmd.Stderr = s.log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("redistest: start redis-server: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()

	// ctx ends at the deadline or when the process exits, whichever is
	// first, so that a probe stuck on somebody else's port is cut short.
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		if pid, err := probePID(ctx, s.addr, s.tlsCfg, s.cfg.password); err == nil && pid == cmd.Process.Pid {
			return p, nil
		}
		select {
		case <-p.done:
			out := s.log.since(mark)
			if strings.Contains(out, "Address already in use") {
				return nil, fmt.Errorf("%w: %s", errPortInUse, s.addr)
			}
			return nil, fmt.Errorf("redistest: redis-server on %s exited during start (%v); last log lines:\n%s",
				s.addr, cmd.ProcessState, lastLines(out, logTailLines))
		case <-ctx.Done():
			if isClosed(p.done) {
				continue // the process exited: the case above reports it
			}
			p.stop(0)
			return nil, fmt.Errorf("redistest: redis-server on %s did not answer within %v; last log lines:\n%s",
				s.addr, s.cfg.startTimeout, lastLines(s.log.since(mark), logTailLines))
		case <-ticker.C:
		}
	}
}

// stop sends SIGTERM, waits up to grace, then sends SIGKILL and waits until
// the process has exited. grace 0 sends SIGKILL at once.
func (p *process) stop(grace time.Duration) {
	if grace > 0 {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case <-p.done:
			return
		case <-timer.C:
		}
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// probePID asks the server at addr for its process id (INFO server) over a
// fresh connection: one dial, no retries, so that a refused connection is
// reported at once. It speaks the few lines of RESP2 it needs itself rather
// than through go-redis, whose pool logs every failed dial to a process-wide
// logger and backs off after dial errors. With tlsCfg it speaks TLS, with
// password it authenticates first.
func probePID(ctx context.Context, addr string, tlsCfg *tls.Config, password string) (int, error) {
	d := net.Dialer{Timeout: 200 * time.Millisecond}
	var conn net.Conn
	var err error
	if tlsCfg != nil {
		conn, err = (&tls.Dialer{NetDialer: &d, Config: tlsCfg}).DialContext(ctx, "tcp", addr)
	} else {
		conn, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	deadline := time.Now().Add(500 * time.Millisecond)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return 0, err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	r := bufio.NewReader(conn)
	if password != "" {
		if _, err := fmt.Fprintf(conn, "*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n", len(password), password); err != nil {
			return 0, err
		}
		ok, err := r.ReadString('\n')
		if err != nil {
			return 0, err
		}
		if ok != "+OK\r\n" {
			return 0, fmt.Errorf("redistest: AUTH answered %q", strings.TrimSpace(ok))
		}
	}
	if _, err := io.WriteString(conn, "*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n"); err != nil {
		return 0, err
	}
	head, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	head = strings.TrimRight(head, "\r\n")
	if !strings.HasPrefix(head, "$") {
		// An error reply such as -LOADING or -NOAUTH: not ready for us.
		return 0, fmt.Errorf("redistest: INFO server answered %q", head)
	}
	n, err := strconv.Atoi(head[1:])
	if err != nil || n < 0 {
		return 0, fmt.Errorf("redistest: INFO server answered %q", head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("redistest: no process_id in INFO server")
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// clearDir empties dir, so a retry does not inherit a failed attempt's files.
func clearDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("redistest: %w", err)
		}
	}
	return nil
}
