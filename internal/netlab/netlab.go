// Package netlab builds test networks of Linux network namespaces: each
// host is its own namespace with one veth interface on a bridge that the
// test process (in the root namespace) also sits on, so the test reaches
// every host by its address and hosts reach each other through the
// bridge. Links can be cut in both directions with nftables rules inside
// the hosts (a partition), and healed again.
//
// It serves tests (New, AddHost, Cut and Heal fail the test on an error)
// and programs such as `quotient simulate --deployed` (Open, NewHost,
// Block, Unblock and Redirect return errors). It needs root, iproute2
// (`ip`) and nftables (`nft`); Available says what is missing. Every name
// it creates carries a per-lab suffix, and Close (registered with
// t.Cleanup by New; the caller's job after Open) deletes the namespaces
// and the bridge, so concurrent labs do not meet.
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

// openMu makes the choice of a lab's subnet and the bridge that takes it
// atomic within this process.
var openMu sync.Mutex

// TB is the part of testing.TB that New uses (so that programs using Open
// do not link package testing).
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
}

// Lab is one network. Its methods are safe for concurrent use.
type Lab struct {
	t      TB     // nil for a lab from Open
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
// the test when Available or the setup fails. Its AddHost, Cut and Heal
// fail the test on an error.
func New(t TB) *Lab {
	t.Helper()
	l, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	l.t = t
	t.Cleanup(l.Close)
	return l
}

// Open builds an empty lab as New does, for a program: the error names what
// is missing (Available) or which setup command failed, and the caller
// must call Close (also after an error of a later method).
func Open() (*Lab, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	// The check for a free /24 and the bridge that takes it are one step
	// within this process, so labs opened at the same moment (parallel
	// tests) never pick the same subnet.
	openMu.Lock()
	defer openMu.Unlock()
	n := labs.Add(1)
	l := &Lab{id: fmt.Sprintf("%d%d", os.Getpid()%100000, n), subnet: -1}
	for i := range int64(250) {
		s := int((int64(os.Getpid())*7 + n + i) % 250)
		if out, err := exec.Command("ip", "-4", "-o", "addr", "show", "to", fmt.Sprintf("10.213.%d.0/24", s)).Output(); err == nil && len(bytes.TrimSpace(out)) == 0 {
			l.subnet = s
			break
		}
	}
	if l.subnet < 0 {
		return nil, errors.New("netlab: no free /24 in 10.213.0.0/16")
	}
	l.bridge = "qlb" + l.id
	for _, c := range [][]string{
		{"ip", "link", "add", l.bridge, "type", "bridge"},
		{"ip", "addr", "add", l.Gateway() + "/24", "dev", l.bridge},
		{"ip", "link", "set", l.bridge, "up"},
	} {
		if err := run(c[0], c[1:]...); err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

// AddHost is NewHost for a lab from New: it fails the test on an error
// (and panics on a lab from Open, a programmer error).
func (l *Lab) AddHost(name string) *Host {
	l.t.Helper()
	h, err := l.NewHost(name)
	l.check(err)
	return h
}

// NewHost creates a namespace named after name, with loopback up and one
// interface on the lab's bridge, and returns it. On an error the host may
// be half built; Close removes it.
func (l *Lab) NewHost(name string) (*Host, error) {
	l.mu.Lock()
	i := len(l.hosts)
	h := &Host{lab: l, Name: name, NS: fmt.Sprintf("ql%s-%d", l.id, i), IP: fmt.Sprintf("10.213.%d.%d", l.subnet, i+2), veth: fmt.Sprintf("qv%s-%d", l.id, i)}
	l.hosts = append(l.hosts, h)
	l.mu.Unlock()
	peer := h.veth + "p"
	for _, c := range [][]string{
		{"ip", "netns", "add", h.NS},
		{"ip", "link", "add", h.veth, "type", "veth", "peer", "name", peer},
		{"ip", "link", "set", peer, "netns", h.NS},
		{"ip", "link", "set", h.veth, "master", l.bridge},
		{"ip", "link", "set", h.veth, "up"},
		{"ip", "-n", h.NS, "link", "set", "lo", "up"},
		{"ip", "-n", h.NS, "link", "set", peer, "name", "eth0"},
		{"ip", "-n", h.NS, "addr", "add", h.IP + "/24", "dev", "eth0"},
		{"ip", "-n", h.NS, "link", "set", "eth0", "up"},
		{"ip", "-n", h.NS, "route", "add", "default", "via", l.Gateway()},
		h.nft("add", "table", "inet", "netlab"),
		h.nft("add", "chain", "inet", "netlab", "input", "{ type filter hook input priority 0; policy accept; }"),
		h.nft("add", "chain", "inet", "netlab", "output", "{ type filter hook output priority 0; policy accept; }"),
	} {
		if err := run(c[0], c[1:]...); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// nft is the command line of nft args... inside the host.
func (h *Host) nft(args ...string) []string {
	return append([]string{"ip", "netns", "exec", h.NS, "nft"}, args...)
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

// Cut is Block for a lab from New: it fails the test on an error.
func (h *Host) Cut(others ...*Host) {
	h.lab.t.Helper()
	h.lab.check(h.Block(others...))
}

// Heal is Unblock for a lab from New: it fails the test on an error.
func (h *Host) Heal() {
	h.lab.t.Helper()
	h.lab.check(h.Unblock())
}

// Block drops every packet between h and the other hosts, in both
// directions (the root namespace can still reach h). Unblock undoes it.
// Connections that Redirect sends elsewhere are matched by the address
// they were opened to (conntrack's original tuple), so a blocked host is
// also cut from a redirected peer, in both directions.
func (h *Host) Block(others ...*Host) error {
	for _, o := range others {
		for _, c := range [][]string{
			h.nft("add", "rule", "inet", "netlab", "input", "ip", "saddr", o.IP, "drop"),
			h.nft("add", "rule", "inet", "netlab", "output", "ip", "daddr", o.IP, "drop"),
			// Connections Redirect sent elsewhere, by their original
			// destination (the NAT has rewritten daddr before this filter).
			h.nft("add", "rule", "inet", "netlab", "output", "ct", "original", "ip", "daddr", o.IP, "drop"),
			h.nft("add", "rule", "inet", "netlab", "input", "ct", "original", "ip", "daddr", o.IP, "drop"),
		} {
			if err := run(c[0], c[1:]...); err != nil {
				return err
			}
		}
	}
	return nil
}

// Unblock removes every block of h.
func (h *Host) Unblock() error {
	for _, chain := range []string{"input", "output"} {
		c := h.nft("flush", "chain", "inet", "netlab", chain)
		if err := run(c[0], c[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// Redirect sends the TCP connections that processes of h open to
// to.IP:port to via (host:port, typically a proxy in the root namespace
// on the lab's Gateway address) instead, by destination NAT in h's output
// path; Block still cuts them (it matches the original destination).
// Calling it again for the same destination adds a rule that never
// matches (the first one wins).
func (h *Host) Redirect(to *Host, port int, via string) error {
	for _, c := range [][]string{
		h.nft("add", "table", "ip", "netlabnat"),
		h.nft("add", "chain", "ip", "netlabnat", "output", "{ type nat hook output priority -100; policy accept; }"),
		h.nft("add", "chain", "ip", "netlabnat", "input", "{ type nat hook input priority 100; policy accept; }"),
		h.nft("add", "rule", "ip", "netlabnat", "output", "ip", "daddr", to.IP, "tcp", "dport", fmt.Sprint(port), "dnat", "to", via),
	} {
		if err := run(c[0], c[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// check fails the test of a lab from New with err, or panics on a lab from
// Open (whose callers use the error-returning methods).
func (l *Lab) check(err error) {
	if err == nil {
		return
	}
	if l.t == nil {
		panic(fmt.Sprintf("netlab: a test helper on a lab from Open: %v", err))
	}
	l.t.Helper()
	l.t.Fatal(err)
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
