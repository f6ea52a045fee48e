package deployed

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// proc is one process of the deployment, its output in a log file. Not
// safe for concurrent use.
type proc struct {
	name string
	args []string // the command line, for restarts
	host func(ctx context.Context, name string, args ...string) *exec.Cmd
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// start runs the process (again, after a kill), appending to its log.
func (p *proc) start() error {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	c := p.host(context.Background(), p.args[0], p.args[1:]...)
	c.Stdout, c.Stderr = f, f
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		_ = f.Close()
		return fmt.Errorf("%w: start %s: %v", ErrRun, p.name, err)
	}
	p.cmd, p.done, p.err = c, make(chan struct{}), nil
	done := p.done
	go func() {
		p.err = c.Wait()
		_ = f.Close()
		close(done)
	}()
	return nil
}

// running reports whether the process is alive.
func (p *proc) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill ends the process with SIGKILL (a crash) and waits for it.
func (p *proc) kill() {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// stop ends the process with SIGTERM, or SIGKILL after 10 s.
func (p *proc) stop() {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.kill()
	}
}

// waitLog waits until the log matches re (within timeout) and returns the
// last submatch.
func (p *proc) waitLog(ctx context.Context, re *regexp.Regexp, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		data, _ := os.ReadFile(p.log)
		if m := re.FindSubmatch(data); m != nil {
			return string(m[len(m)-1]), nil
		}
		if !p.running() {
			return "", fmt.Errorf("%w: %s exited (%v) before its log matched %s:\n%s", ErrRun, p.name, p.err, re, tail(p.log, 20))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("%w: %s: no %s within %v:\n%s", ErrRun, p.name, re, timeout, tail(p.log, 20))
		}
		time.Sleep(20 * time.Millisecond) // bounded poll of a real process
	}
}

// waitHTTP polls url until it answers 200, within timeout.
func waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) && ctx.Err() == nil {
		resp, err := c.Get(url)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond) // bounded poll of a real process
	}
	return fmt.Errorf("%w: %s not ready within %v (last: %s)", ErrRun, url, timeout, last)
}

// tail returns the last n lines of the file at path.
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
