package netlab

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLabCutAndHeal: a redis-server in one host answers the other host and
// the test process; a cut stops the other host (not the test), a heal
// restores it.
func TestLabCutAndHeal(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("this machine lacks what network namespaces need: %v", err)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (make deps installs it)")
	}
	l := New(t)
	a, b := l.AddHost("a"), l.AddHost("b")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := a.Command(ctx, "redis-server", "--bind", a.IP, "--port", "7001", "--save", "", "--appendonly", "no", "--protected-mode", "no")
	require.NoError(t, srv.Start())
	t.Cleanup(func() { cancel(); _ = srv.Wait() })

	ping := func(from *Host) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		out, err := from.Command(ctx, "redis-cli", "-h", a.IP, "-p", "7001", "PING").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "PONG") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for ping(b) != nil {
		require.True(t, time.Now().Before(deadline), "redis-server in host a did not answer host b: %v", ping(b))
		time.Sleep(20 * time.Millisecond) // bounded poll of a real process
	}
	conn, err := net.DialTimeout("tcp", a.Addr(7001), time.Second)
	require.NoError(t, err, "the test process reaches the hosts")
	require.NoError(t, conn.Close())

	a.Cut(b)
	assert.Error(t, ping(b), "cut: host b cannot reach host a")
	conn, err = net.DialTimeout("tcp", a.Addr(7001), time.Second)
	require.NoError(t, err, "a cut between hosts leaves the test process connected")
	require.NoError(t, conn.Close())
	a.Heal()
	assert.NoError(t, ping(b), "healed")
}

// TestRedirectThroughProxy: host b's connections to host a's redis-server
// go through a forwarder in the root namespace (Redirect), and a Block of
// b from a still cuts them although they are sent to the forwarder.
func TestRedirectThroughProxy(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("this machine lacks what network namespaces need: %v", err)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (make deps installs it)")
	}
	l, err := Open()
	require.NoError(t, err)
	t.Cleanup(l.Close)
	a, err := l.NewHost("a")
	require.NoError(t, err)
	b, err := l.NewHost("b")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := a.Command(ctx, "redis-server", "--bind", a.IP, "--port", "7001", "--save", "", "--appendonly", "no", "--protected-mode", "no")
	require.NoError(t, srv.Start())
	t.Cleanup(func() { cancel(); _ = srv.Wait() })

	// The forwarder counts the connections it carries.
	ln, err := net.Listen("tcp", l.Gateway()+":0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	var carried atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			carried.Add(1)
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", a.Addr(7001))
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c) }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	require.NoError(t, b.Redirect(a, 7001, ln.Addr().String()))

	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		out, err := b.Command(ctx, "redis-cli", "-h", a.IP, "-p", "7001", "PING").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "PONG") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for ping() != nil {
		require.True(t, time.Now().Before(deadline), "redis-server in host a did not answer host b: %v", ping())
		time.Sleep(20 * time.Millisecond) // bounded poll of a real process
	}
	assert.Positive(t, carried.Load(), "b's connection to a went through the forwarder")

	require.NoError(t, b.Block(a))
	before := carried.Load()
	assert.Error(t, ping(), "blocked: the redirected connection is cut too")
	assert.Equal(t, before, carried.Load(), "no connection reached the forwarder while blocked")
	require.NoError(t, b.Unblock())
	assert.NoError(t, ping(), "unblocked")
}
