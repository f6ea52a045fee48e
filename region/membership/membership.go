package membership

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// LeaderOf is the leader among the live member names: the smallest. ""
// when there is none.
func LeaderOf(alive []string) string {
	if len(alive) == 0 {
		return ""
	}
	return slices.Min(alive)
}

// Config configures a Member. Start from DefaultConfig.
type Config struct {
	// Name is this replica's unique name in the region. Required.
	Name string
	// BindAddr and BindPort are where gossip listens (TCP and UDP); port 0
	// picks a free one. Default 0.0.0.0:7946.
	BindAddr string
	BindPort int
	// Seeds are host:port of other replicas to join; empty starts a new
	// cluster (the others join it).
	Seeds []string
	// ProbeInterval, ProbeTimeout and SuspicionMult set failure detection
	// (memberlist's LAN defaults: 1 s, 500 ms, 4). A dead member is
	// declared after about ProbeInterval + SuspicionMult x log10(n) x
	// ProbeInterval.
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration
	SuspicionMult int
	// GossipInterval is how often state is gossiped (default 200 ms).
	GossipInterval time.Duration
	// RejoinInterval is how often Seeds are joined again while this
	// replica runs (default 30 s; negative: never). memberlist joins only
	// when asked, so replicas that all started before any of them was
	// reachable at a seed address (a DNS name with no records yet) would
	// otherwise stay in clusters of one, each its own leader, until the next
	// replica starts.
	RejoinInterval time.Duration
	// Logger receives memberlist's log. Default: discard.
	Logger *slog.Logger
}

// DefaultConfig is memberlist's LAN profile for replica name.
func DefaultConfig(name string) Config {
	lan := memberlist.DefaultLANConfig()
	return Config{
		Name: name, BindAddr: "0.0.0.0", BindPort: 7946,
		ProbeInterval: lan.ProbeInterval, ProbeTimeout: lan.ProbeTimeout,
		SuspicionMult: lan.SuspicionMult, GossipInterval: lan.GossipInterval,
		RejoinInterval: 30 * time.Second,
	}
}

// Member is this replica's membership. Safe for concurrent use.
type Member struct {
	ml      *memberlist.Memberlist
	name    string
	changed chan struct{} // capacity 1: a view change happened
	stop    chan struct{} // closed by Shutdown: ends the re-join loop
	mu      sync.Mutex
	closed  bool
}

type events struct{ m *Member }

func (e events) NotifyJoin(*memberlist.Node)   { e.m.kick() }
func (e events) NotifyLeave(*memberlist.Node)  { e.m.kick() }
func (e events) NotifyUpdate(*memberlist.Node) { e.m.kick() }

// Join starts gossip and joins cfg.Seeds (a seed that does not answer is
// skipped). When no seed answers (replicas of a region started together,
// so the others' gossip is not up yet) this replica starts as a cluster of
// one, logs it, and joins again every second until it has company, then
// every RejoinInterval: a replica that exited instead left its region with
// one replica fewer for good (found by the end-to-end test of the
// binaries). Meanwhile it may lead alone; the region's epoch fence keeps
// two leaders from publishing the same epoch.
func Join(cfg Config) (*Member, error) {
	if cfg.Name == "" {
		return nil, errors.New("membership: config: Name is required")
	}
	d := DefaultConfig(cfg.Name)
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Name
	mc.BindAddr = cfg.BindAddr
	if mc.BindAddr == "" {
		mc.BindAddr = d.BindAddr
	}
	mc.BindPort, mc.AdvertisePort = cfg.BindPort, cfg.BindPort
	for _, v := range []struct {
		dst *time.Duration
		src time.Duration
	}{{&mc.ProbeInterval, cfg.ProbeInterval}, {&mc.ProbeTimeout, cfg.ProbeTimeout}, {&mc.GossipInterval, cfg.GossipInterval}} {
		if v.src > 0 {
			*v.dst = v.src
		}
	}
	if cfg.SuspicionMult > 0 {
		mc.SuspicionMult = cfg.SuspicionMult
	}
	if cfg.Logger != nil {
		mc.Logger = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug)
	} else {
		mc.Logger = log.New(io.Discard, "", 0)
	}
	m := &Member{name: cfg.Name, changed: make(chan struct{}, 1), stop: make(chan struct{})}
	mc.Events = events{m}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("membership: %w", err)
	}
	m.ml = ml
	if len(cfg.Seeds) > 0 {
		if _, err := ml.Join(cfg.Seeds); err != nil && cfg.Logger != nil {
			cfg.Logger.Warn("membership: no seed answered; running alone and joining again every second", "seeds", cfg.Seeds, "err", err)
		}
		every := cfg.RejoinInterval
		if every == 0 {
			every = d.RejoinInterval
		}
		if every > 0 {
			go m.rejoin(cfg.Seeds, every)
		}
	}
	return m, nil
}

// rejoin joins seeds again every interval until Shutdown: members already
// known are not disturbed, and a seed that answers now merges its cluster
// with this one; while this replica is alone it tries every second. Errors
// (no seed answered) are expected and ignored.
func (m *Member) rejoin(seeds []string, every time.Duration) {
	for {
		wait := every
		if m.ml.NumMembers() <= 1 {
			wait = min(every, time.Second) // alone: the seeds may just be starting
		}
		t := time.NewTimer(wait)
		select {
		case <-m.stop:
			t.Stop()
			return
		case <-t.C:
			_, _ = m.ml.Join(seeds)
		}
	}
}

func (m *Member) kick() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// Name is this replica's name.
func (m *Member) Name() string { return m.name }

// Addr is the gossip address others can join, host:port.
func (m *Member) Addr() string {
	n := m.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Alive are the names of the live members in this replica's view, itself
// included, sorted.
func (m *Member) Alive() []string {
	var out []string
	for _, n := range m.ml.Members() {
		out = append(out, n.Name)
	}
	slices.Sort(out)
	return out
}

// Leader is the leader in this replica's view.
func (m *Member) Leader() string { return LeaderOf(m.Alive()) }

// IsLeader reports whether this replica leads in its own view.
func (m *Member) IsLeader() bool { return m.Leader() == m.name }

// Leave announces departure (so the others hand over at once, without
// waiting for failure detection) and stops gossip.
func (m *Member) Leave(timeout time.Duration) error {
	err := m.ml.Leave(timeout)
	return errors.Join(err, m.Shutdown())
}

// Shutdown stops gossip without a goodbye, as a crash would.
func (m *Member) Shutdown() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	close(m.stop)
	return m.ml.Shutdown()
}

// RunWhileLeader calls fn with a context that is cancelled when this
// replica stops leading, and calls it again whenever it leads again, until
// ctx ends; it returns ctx.Err(). Leadership is re-checked on every view
// change and every recheck (default 100 ms when <= 0). An error from fn is
// passed to onErr (may be nil) and fn is called again at the next check
// while still leading.
func (m *Member) RunWhileLeader(ctx context.Context, recheck time.Duration, fn func(context.Context) error, onErr func(error)) error {
	if recheck <= 0 {
		recheck = 100 * time.Millisecond
	}
	t := time.NewTicker(recheck)
	defer t.Stop()
	type run struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	start := func() *run {
		lctx, cancel := context.WithCancel(ctx)
		r := &run{cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(r.done)
			if err := fn(lctx); err != nil && lctx.Err() == nil && onErr != nil {
				onErr(err)
			}
		}()
		return r
	}
	var cur *run
	defer func() {
		if cur != nil {
			cur.cancel()
			<-cur.done
		}
	}()
	for {
		if cur != nil {
			select {
			case <-cur.done:
				cur.cancel()
				cur = nil
			default:
			}
		}
		lead := m.IsLeader()
		switch {
		case lead && cur == nil:
			cur = start()
		case !lead && cur != nil:
			cur.cancel()
			<-cur.done
			cur = nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.changed:
		case <-t.C:
		}
	}
}
