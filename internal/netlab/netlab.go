// Package netlab builds test networks of Linux network namespaces: each
// host is its own namespace with one veth interface on a bridge that the
// test process (in the root namespace) also sits on, so the test reaches
// every host by its address and hosts reach each other through the
// bridge. Links can be cut in both directions with nftables rules inside
// the hosts (a partition), and healed again.
//
// It is for tests only: it needs root, iproute2 (`ip`) and nftables
// (`nft`); Available says what is missing. Every name it creates carries
// a per-lab suffix, and Close (registered with t.Cleanup) deletes the
// namespaces and the bridge, so labs of concurrent tests do not meet.
// Addresses come from 10.213.0.0/16, used only inside the lab: traffic
// to them never leaves the machine.
//
// Processes run inside a host with Host.Command (`ip netns exec`); the
// Go test process itself stays in the root namespace.
package netlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Available reports nil when this machine can build labs, or an error
// naming what is missing (root, ip, nft).
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("netlab: needs root (network namespaces)")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("netlab: needs %s on the PATH (Debian: iproute2, nftables)", tool)
		}
	}
	return nil
}

// labs numbers labs of this process; with the pid it makes names unique.
var labs atomic.Int64

// Lab is one test network. Its methods are safe for concurrent use.
type Lab struct {
	t      testing.TB
	id     string // suffix of every name
	bridge string
	subnet int // third octet of the lab's /24

	mu    sync.Mutex
	hosts []*Host
}

// Host is one namespace of a Lab.
type Host struct {
	lab  *Lab
	Name string // as given to AddHost
	NS   string // the namespace's name
	IP   string // its address on the bridge
	veth string // the root end of its veth pair
}

// New builds an empty lab (a bridge in the root namespace with the
// gateway address .1) and registers its removal with t.Cleanup. It fails
// the test when Available fails.
func New(t testing.TB) *Lab {
	t.Helper()
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	n := labs.Add(1)
	l := &Lab{t: t, id: fmt.Sprintf("%d%d", os.Getpid()%100000, n), subnet: -1}
	for i := range int64(250) {
		s := int((int64(os.Getpid())*7 + n + i) % 250)
		if out, err := exec.Command("ip", "-4", "-o", "addr", "show", "to", fmt.Sprintf("10.213.%d.0/24", s)).Output(); err == nil && len(bytes.TrimSpace(out)) == 0 {
			l.subnet = s
			break
		}
	}
	if l.subnet < 0 {
		t.Fatal("netlab: no free /24 in 10.213.0.0/16")
	}
	l.bridge = "qlb" + l.id
	t.Cleanup(l.Close)
	l.must("ip", "link", "add", l.bridge, "type", "bridge")
	l.must("ip", "addr", "add", l.Gateway()+"/24", "dev", l.bridge)
	l.must("ip", "link", "set", l.bridge, "up")
	return l
}

// AddHost creates a namespace named after name, with loopback up and one
// interface on the lab's bridge, and returns it.
func (l *Lab) AddHost(name string) *Host {
	l.t.Helper()
	l.mu.Lock()
	i := len(l.hosts)
	h := &Host{lab: l, Name: name, NS: fmt.Sprintf("ql%s-%d", l.id, i), IP: fmt.Sprintf("10.213.%d.%d", l.subnet, i+2), veth: fmt.Sprintf("qv%s-%d", l.id, i)}
	l.hosts = append(l.hosts, h)
	l.mu.Unlock()
	peer := h.veth + "p"
	l.must("ip", "netns", "add", h.NS)
	l.must("ip", "link", "add", h.veth, "type", "veth", "peer", "name", peer)
	l.must("ip", "link", "set", peer, "netns", h.NS)
	l.must("ip", "link", "set", h.veth, "master", l.bridge)
	l.must("ip", "link", "set", h.veth, "up")
	l.must("ip", "-n", h.NS, "link", "set", "lo", "up")
	l.must("ip", "-n", h.NS, "link", "set", peer, "name", "eth0")
	l.must("ip", "-n", h.NS, "addr", "add", h.IP+"/24", "dev", "eth0")
	l.must("ip", "-n", h.NS, "link", "set", "eth0", "up")
	l.must("ip", "-n", h.NS, "route", "add", "default", "via", l.Gateway())
	l.must("ip", "netns", "exec", h.NS, "nft", "add", "table", "inet", "netlab")
	l.must("ip", "netns", "exec", h.NS, "nft", "add", "chain", "inet", "netlab", "input", "{ type filter hook input priority 0; policy accept; }")
	l.must("ip", "netns", "exec", h.NS, "nft", "add", "chain", "inet", "netlab", "output", "{ type filter hook output priority 0; policy accept; }")
	return h
}

// Gateway is the lab's address in the root namespace (the bridge's): the
// hosts reach the test process there.
func (l *Lab) Gateway() string { return fmt.Sprintf("10.213.%d.1", l.subnet) }

// Command returns a command that runs name args... inside the host's
// namespace.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// Addr is host:port on this host.
func (h *Host) Addr(port int) string { return fmt.Sprintf("%s:%d", h.IP, port) }

// Cut drops every packet between h and the other hosts, in both
// directions (the test process can still reach h). Heal undoes it.
func (h *Host) Cut(others ...*Host) {
	h.lab.t.Helper()
	for _, o := range others {
		h.lab.must("ip", "netns", "exec", h.NS, "nft", "add", "rule", "inet", "netlab", "input", "ip", "saddr", o.IP, "drop")
		h.lab.must("ip", "netns", "exec", h.NS, "nft", "add", "rule", "inet", "netlab", "output", "ip", "daddr", o.IP, "drop")
	}
}

// Heal removes every cut of h.
func (h *Host) Heal() {
	h.lab.t.Helper()
	h.lab.must("ip", "netns", "exec", h.NS, "nft", "flush", "chain", "inet", "netlab", "input")
	h.lab.must("ip", "netns", "exec", h.NS, "nft", "flush", "chain", "inet", "netlab", "output")
}

// Close deletes every namespace and the bridge (processes still running
// in a namespace keep it alive until they exit; stop them first).
// Idempotent.
func (l *Lab) Close() {
	l.mu.Lock()
	hosts := l.hosts
	l.hosts = nil
	l.mu.Unlock()
	for _, h := range hosts {
		_ = run("ip", "link", "del", h.veth)
		_ = run("ip", "netns", "del", h.NS)
	}
	_ = run("ip", "link", "del", l.bridge)
}

func (l *Lab) must(name string, args ...string) {
	l.t.Helper()
	if err := run(name, args...); err != nil {
		l.t.Fatal(err)
	}
}

// run runs one setup command, bounded by 10 s.
func run(name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	c := exec.CommandContext(ctx, name, args...)
	c.Stdout, c.Stderr = &out, &out
	if err := c.Run(); err != nil {
		return fmt.Errorf("netlab: %s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}
