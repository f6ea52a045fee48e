package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testCtx returns a context that ends with a bound, so that no test waits
// for ever on a broken server.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// requireDown asserts that nothing answers on addr.
func requireDown(t *testing.T, ctx context.Context, addr string) {
	t.Helper()
	_, err := probePID(ctx, addr, nil, "")
	require.Error(t, err, "a server still answers on %s", addr)
}

func TestStartServerSetGetStop(t *testing.T) {
	ctx := testCtx(t)
	s := StartServer(t)

	host, port, err := net.SplitHostPort(s.Addr())
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", host)
	assert.NotEqual(t, "6379", port)
	assert.Equal(t, port, strconv.Itoa(s.Port()))

	c := s.Client()
	require.NoError(t, c.Set(ctx, "k", "v1", 0).Err())
	got, err := c.Get(ctx, "k").Result()
	require.NoError(t, err)
	assert.Equal(t, "v1", got)

	// No persistence: nothing is configured to save.
	cfg, err := c.ConfigGet(ctx, "save").Result()
	require.NoError(t, err)
	assert.Equal(t, "", cfg["save"])
	cfg, err = c.ConfigGet(ctx, "appendonly").Result()
	require.NoError(t, err)
	assert.Equal(t, "no", cfg["appendonly"])

	s.Stop()
	requireDown(t, ctx, s.Addr())
	s.Stop() // stopping twice does nothing
}

func TestStopThenRestartKeepsAddress(t *testing.T) {
	ctx := testCtx(t)
	s := StartServer(t)
	addr := s.Addr()
	c := s.Client()
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())

	s.Stop()
	requireDown(t, ctx, addr)

	s.Restart(t)
	assert.Equal(t, addr, s.Addr())
	// The same client reconnects; the restarted server is empty.
	require.NoError(t, c.Ping(ctx).Err())
	assert.ErrorIs(t, c.Get(ctx, "k").Err(), redis.Nil)
	require.NoError(t, c.Set(ctx, "k", "again", 0).Err())

	// Kill (a crash) and Restart of a running server work the same way.
	s.Kill()
	requireDown(t, ctx, addr)
	s.Restart(t)
	s.Restart(t)
	assert.Equal(t, addr, s.Addr())
	assert.ErrorIs(t, c.Get(ctx, "k").Err(), redis.Nil)
}

func TestParallelServersGetDifferentPorts(t *testing.T) {
	var (
		mu    sync.Mutex
		addrs = map[string]string{}
		ready sync.WaitGroup
	)
	ready.Add(2)
	allReady := make(chan struct{})
	go func() { ready.Wait(); close(allReady) }()

	t.Run("group", func(t *testing.T) {
		for _, name := range []string{"a", "b"} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx := testCtx(t)
				s := StartServer(t)
				require.NoError(t, s.Client().Set(ctx, "owner", name, 0).Err())
				mu.Lock()
				addrs[name] = s.Addr()
				mu.Unlock()

				// Both servers run at the same time from here on.
				ready.Done()
				select {
				case <-allReady:
				case <-ctx.Done():
					t.Fatal("the other server did not start in time")
				}
				got, err := s.Client().Get(ctx, "owner").Result()
				require.NoError(t, err)
				assert.Equal(t, name, got, "another test's server answered on %s", s.Addr())
			})
		}
	})
	require.Len(t, addrs, 2)
	assert.NotEqual(t, addrs["a"], addrs["b"])
}

// scriptedPicker hands out the given ports first, then real free ones.
func scriptedPicker(ports ...int) func(bool) (int, error) {
	var mu sync.Mutex
	real := newPortPicker()
	return func(cluster bool) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(ports) > 0 {
			p := ports[0]
			ports = ports[1:]
			return p, nil
		}
		return real.pick(cluster)
	}
}

func TestStartRetriesWhenPortTaken(t *testing.T) {
	ctx := testCtx(t)
	// One port held by a plain listener, one by another redis-server: the
	// latter answers PING, so only the pid check tells it apart.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	held := l.Addr().(*net.TCPAddr).Port
	other := StartServer(t)

	cfg := newConfig(nil)
	cfg.pickPort = scriptedPicker(held, other.Port())
	s, err := startServer(t, cfg, false)
	require.NoError(t, err)
	assert.NotEqual(t, held, s.Port())
	assert.NotEqual(t, other.Port(), s.Port())

	pid, err := probePID(ctx, s.Addr(), nil, "")
	require.NoError(t, err)
	assert.Equal(t, s.proc.cmd.Process.Pid, pid)
	assert.Contains(t, s.log.lastLines(100), "Address already in use")
}

func TestStartFailureShowsLog(t *testing.T) {
	cfg := newConfig([]Option{WithArgs("--maxmemory", "banana")})
	_, err := startServer(t, cfg, false)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "exited during start")
	assert.Contains(t, err.Error(), "maxmemory", "the error shows the server's log")
}

func TestMissingServerIsNamed(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := startServer(t, newConfig(nil), false)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "redis-server not found")
	assert.Contains(t, err.Error(), "make deps")
	_, err = startCluster(t, newConfig(nil))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "redis-server not found")
}

func TestCleanupStopsServer(t *testing.T) {
	var s *Server
	var p *process
	t.Run("owner", func(t *testing.T) {
		s = StartServer(t)
		p = s.proc
		_ = s.Client()
	})
	select {
	case <-p.done:
	default:
		t.Fatal("redis-server still runs after its test ended")
	}
	requireDown(t, testCtx(t), s.Addr())
	_, err := os.Stat(s.dir)
	assert.True(t, os.IsNotExist(err), "server directory %s was not removed", s.dir)
	require.Error(t, s.restart(), "restart after the owning test ended")
}

func TestCluster(t *testing.T) {
	ctx := testCtx(t)
	c := StartCluster(t)
	addrs := c.Addrs()
	require.Len(t, addrs, 3)
	nodes := c.Nodes()

	for _, n := range nodes {
		info, err := n.Client().ClusterInfo(ctx).Result()
		require.NoError(t, err)
		assert.Contains(t, info, "cluster_state:ok")
	}

	// Find one key per node (by slot), write it through the cluster client
	// and read it back from that node directly.
	shards, err := nodes[0].Client().ClusterShards(ctx).Result()
	require.NoError(t, err)
	require.Len(t, shards, 3)
	owner := func(slot int64) string {
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if slot >= r.Start && slot <= r.End {
					require.NotEmpty(t, sh.Nodes)
					return net.JoinHostPort(sh.Nodes[0].IP, strconv.FormatInt(sh.Nodes[0].Port, 10))
				}
			}
		}
		return ""
	}
	keyOn := map[string]string{}
	for i := 0; len(keyOn) < len(nodes) && i < 1000; i++ {
		key := fmt.Sprintf("key-%d", i)
		slot, err := nodes[0].Client().ClusterKeySlot(ctx, key).Result()
		require.NoError(t, err)
		if a := owner(slot); a != "" && keyOn[a] == "" {
			keyOn[a] = key
		}
	}
	require.Len(t, keyOn, 3, "every node owns some slots")

	cc := c.Client()
	for _, n := range nodes {
		key := keyOn[n.Addr()]
		require.NotEmpty(t, key, "no key found for node %s", n.Addr())
		require.NoError(t, cc.Set(ctx, key, n.Addr(), 0).Err())
		got, err := n.Client().Get(ctx, key).Result()
		require.NoError(t, err, "key %s is not on node %s", key, n.Addr())
		assert.Equal(t, n.Addr(), got)
	}

	c.Stop()
	for _, a := range addrs {
		requireDown(t, ctx, a)
	}
}

func TestClusterNodeRestartRejoins(t *testing.T) {
	ctx := testCtx(t)
	c := StartCluster(t)
	n := c.Nodes()[1]
	n.Kill()
	n.Restart(t)
	// The node comes back with its nodes.conf: same slots, no data.
	require.NoError(t, c.waitReady(ctx))
	require.NoError(t, c.Client().Set(ctx, "after-restart", "v", 0).Err())
}

// BenchmarkStartServer measures starting a server until it answers, and
// stopping it.
func BenchmarkStartServer(b *testing.B) {
	for b.Loop() {
		StartServer(b).Stop()
	}
}

// BenchmarkStartCluster measures starting and forming a three-primary
// cluster until every node reports it healthy, and stopping it.
func BenchmarkStartCluster(b *testing.B) {
	for b.Loop() {
		StartCluster(b).Stop()
	}
}
