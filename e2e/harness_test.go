package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// binaries are built once per test binary run, into binDir.
var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// bin returns the path of a binary built from ./cmd/<name> of this module,
// without the race detector (the processes are the product, not the test).
func bin(t *testing.T, name string) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "quotient-e2e-bin-")
		if buildErr != nil {
			return
		}
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Dir(filepath.Dir(file))
		for _, cmd := range []string{"quotient", "devkafka"} {
			c := exec.Command("go", "build", "-o", filepath.Join(binDir, cmd), "./cmd/"+cmd)
			c.Dir = root
			c.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := c.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build ./cmd/%s: %v\n%s", cmd, err, out)
				return
			}
		}
	})
	require.NoError(t, buildErr)
	return filepath.Join(binDir, name)
}

// proc is one process of the deployment; its output goes to a log file
// that is printed (tail) when the test fails.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// start runs bin args... with env added to this process's environment.
// The process is stopped (SIGTERM, then SIGKILL after 10 s) at cleanup.
func start(t *testing.T, dir, name, binPath string, env []string, args ...string) *proc {
	t.Helper()
	c := exec.Command(binPath, args...)
	c.Env = append(os.Environ(), env...)
	return startCmd(t, dir, name, c)
}

// startCmd starts c (for example a command inside a netlab host) as start
// does: output to a log file, stopped at cleanup, its log tail printed when
// the test fails.
func startCmd(t *testing.T, dir, name string, c *exec.Cmd) *proc {
	t.Helper()
	p := &proc{name: name, log: filepath.Join(dir, name+".log"), done: make(chan struct{}), cmd: c}
	f, err := os.Create(p.log)
	require.NoError(t, err)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, p.cmd.Start(), name)
	go func() {
		p.err = p.cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("--- %s (%s), last lines:\n%s", name, strings.Join(c.Args, " "), tail(p.log, 30))
		}
	})
	return p
}

// stop ends the process gracefully, or kills it after 10 s.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitLog waits until the process's log matches re and returns the first
// submatch (or the match).
func (p *proc) waitLog(t *testing.T, re *regexp.Regexp, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		data, _ := os.ReadFile(p.log)
		if m := re.FindSubmatch(data); m != nil {
			return string(m[len(m)-1])
		}
		require.False(t, p.exited(), "%s exited (%v) before its log matched %s:\n%s", p.name, p.err, re, tail(p.log, 30))
		require.True(t, time.Now().Before(deadline), "%s: no %s within %v:\n%s", p.name, re, timeout, tail(p.log, 30))
		time.Sleep(20 * time.Millisecond) // bounded poll of a real process
	}
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freeAddr returns a loopback address with a port free at the time of the
// call.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// waitHTTP polls url until it answers 200, within timeout.
func waitHTTP(t *testing.T, url string, timeout time.Duration, ok func(body string) bool) {
	t.Helper()
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := c.Do(req)
		if err == nil {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			_ = resp.Body.Close()
			last = fmt.Sprintf("%d %s", resp.StatusCode, b.String())
			if resp.StatusCode == 200 && (ok == nil || ok(b.String())) {
				cancel()
				return
			}
		} else {
			last = err.Error()
		}
		cancel()
		time.Sleep(50 * time.Millisecond) // bounded poll of a real process
	}
	t.Fatalf("%s not ready within %v; last answer: %s", url, timeout, last)
}

// logMetrics logs the samples of the Prometheus text at url whose names
// start with one of prefixes: what each process counted, for the reader
// of a run.
func logMetrics(t *testing.T, name, url string, prefixes ...string) {
	t.Helper()
	samples, err := scrapeMetrics(url, 5*time.Second)
	if err != nil {
		t.Logf("%s: metrics: %v", name, err)
		return
	}
	var lines []string
	for _, s := range samples {
		for _, p := range prefixes {
			if strings.HasPrefix(s.series, p) {
				lines = append(lines, s.line)
			}
		}
	}
	t.Logf("%s metrics:\n%s", name, strings.Join(lines, "\n"))
}

// upstreamURL starts the plain upstream every gateway forwards to and
// returns its URL.
func upstreamURL(t *testing.T) string { return upstreamOn(t, "127.0.0.1:0") }

// upstreamOn is upstreamURL listening on addr.
func upstreamOn(t *testing.T, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	up := &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })}}
	up.Start()
	t.Cleanup(up.Close)
	return up.URL
}

// regexpFor matches s literally.
func regexpFor(s string) *regexp.Regexp { return regexp.MustCompile("(" + regexp.QuoteMeta(s) + ")") }

// startBroker runs devkafka on a free loopback port and returns its address.
func startBroker(t *testing.T, dir string) string {
	t.Helper()
	broker := start(t, dir, "devkafka", bin(t, "devkafka"), nil, "--listen", "127.0.0.1:0")
	return broker.waitLog(t, regexp.MustCompile(`(127\.0\.0\.1:\d+)`), 20*time.Second)
}
