package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// clusterSize is the number of primaries of a Cluster.
	clusterSize = 3
	// clusterSlots is the number of hash slots of Redis Cluster.
	clusterSlots = 16384
)

// Cluster is a Redis Cluster of three primaries and no replicas on
// 127.0.0.1, owned by the test that started it. Node i serves the i-th third
// of the hash slots (0-5460, 5461-10921, 10922-16383). Its methods are safe
// for concurrent use.
type Cluster struct {
	nodes []*Server

	mu     sync.Mutex // guards client
	client *redis.ClusterClient
}

// StartCluster starts three redis-server nodes with cluster mode on (each on
// a free port whose cluster bus port, port+10000, is free too, each with its
// own nodes.conf in its own directory), forms a cluster of three primaries
// and no replicas from them (as `redis-cli --cluster create
// --cluster-replicas 0` would, see form), and waits until every node reports
// cluster_state:ok, knows the other two and sees all 16384 slots assigned.
// It takes about 2 s: a Redis primary does not declare its cluster ok until
// 2 s after it started (CLUSTER_WRITABLE_DELAY). The whole start is bounded
// by the start timeout (default 10 s); opts apply to every node. Cleanup
// stops the nodes at the end of the test. It fails the test with t.Fatalf on
// any error, with the reason the cluster was not ready.
func StartCluster(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	c, err := startCluster(t, newConfig(opts))
	if err != nil {
		t.Fatalf("%v", err)
	}
	return c
}

func startCluster(t testing.TB, cfg config) (*Cluster, error) {
	deadline := time.Now().Add(cfg.startTimeout)
	c := &Cluster{}
	for range clusterSize {
		s, err := startServer(t, cfg, true)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, s)
	}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.client != nil {
			_ = c.client.Close()
		}
	})

	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := c.form(ctx); err != nil {
		return nil, fmt.Errorf("redistest: form cluster %s: %w", strings.Join(c.Addrs(), " "), err)
	}
	if err := c.waitReady(ctx); err != nil {
		return nil, fmt.Errorf("redistest: cluster %s not ready within %v: %w",
			strings.Join(c.Addrs(), " "), cfg.startTimeout, err)
	}
	return c, nil
}

// form does what `redis-cli --cluster create --cluster-replicas 0` does
// (assign each node a third of the slots and its own config epoch, then
// introduce the nodes), except that every pair of nodes meets directly.
// redis-cli introduces every node to the first one only and leaves the rest
// to gossip, which spreads one node a second and made formation take 1 to
// 6 s here; a full mesh needs no gossip.
func (c *Cluster) form(ctx context.Context) error {
	for i, n := range c.nodes {
		lo, hi := slotRange(i)
		if err := n.Client().ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			return fmt.Errorf("node %s: cluster addslotsrange %d %d: %w", n.Addr(), lo, hi, err)
		}
		if err := n.Client().Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("node %s: cluster set-config-epoch %d: %w", n.Addr(), i+1, err)
		}
	}
	for i, n := range c.nodes {
		for _, m := range c.nodes[i+1:] {
			if err := n.Client().ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(m.Port())).Err(); err != nil {
				return fmt.Errorf("node %s: cluster meet %s: %w", n.Addr(), m.Addr(), err)
			}
		}
	}
	return nil
}

// slotRange returns the first and last slot of node i: the i-th third of the
// slots (0-5460, 5461-10921, 10922-16383).
func slotRange(i int) (lo, hi int) {
	return i * clusterSlots / clusterSize, (i+1)*clusterSlots/clusterSize - 1
}

// waitReady polls every node until each one reports a healthy, fully
// assigned cluster of clusterSize nodes, or ctx ends. It returns the last
// reason a node was not ready.
func (c *Cluster) waitReady(ctx context.Context) error {
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		err := c.checkReady(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-ticker.C:
		}
	}
}

func (c *Cluster) checkReady(ctx context.Context) error {
	for _, n := range c.nodes {
		info, err := n.Client().ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("node %s: cluster info: %w", n.Addr(), err)
		}
		fields := map[string]string{}
		for _, line := range strings.Split(info, "\n") {
			if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
				fields[k] = v
			}
		}
		for _, want := range [][2]string{
			{"cluster_state", "ok"},
			{"cluster_slots_assigned", fmt.Sprint(clusterSlots)},
			{"cluster_known_nodes", fmt.Sprint(clusterSize)},
			{"cluster_size", fmt.Sprint(clusterSize)},
		} {
			if got := fields[want[0]]; got != want[1] {
				return fmt.Errorf("node %s: cluster info %s is %q, want %q", n.Addr(), want[0], got, want[1])
			}
		}
		shards, err := n.Client().ClusterShards(ctx).Result()
		if err != nil {
			return fmt.Errorf("node %s: cluster shards: %w", n.Addr(), err)
		}
		covered := 0
		for _, sh := range shards {
			for _, r := range sh.Slots {
				covered += int(r.End-r.Start) + 1
			}
		}
		if covered != clusterSlots {
			return fmt.Errorf("node %s: cluster shards cover %d of %d slots", n.Addr(), covered, clusterSlots)
		}
	}
	return nil
}

// Addrs returns the nodes' addresses, "127.0.0.1:PORT", in slot order.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Nodes returns the nodes in slot order, for tests that stop, kill or
// restart one of them. A restarted node keeps its nodes.conf and rejoins the
// cluster with its slots, but empty.
func (c *Cluster) Nodes() []*Server {
	return append([]*Server(nil), c.nodes...)
}

// Client returns a go-redis cluster client seeded with every node, created
// on first use with go-redis defaults (and the TLS and password of WithTLS
// and WithPassword) and closed when the owning test ends.
func (c *Cluster) Client() *redis.ClusterClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client == nil {
		n := c.nodes[0]
		c.client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), TLSConfig: n.tlsCfg, Password: n.cfg.password})
	}
	return c.client
}

// Stop stops every node (SIGTERM, then SIGKILL after 5 s) and waits until
// they have exited.
func (c *Cluster) Stop() {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(n.Stop)
	}
	wg.Wait()
}
