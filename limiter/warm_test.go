package limiter

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// infoInt is the number that re captures in an INFO reply, 0 when absent.
func infoInt(t *testing.T, info, re string) int64 {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	return v
}

func scriptHashes() []string {
	hs := make([]string, len(storeScripts))
	for i, sc := range storeScripts {
		hs[i] = sc.Hash()
	}
	return hs
}

// TestWarmClusterLoadsEveryNode: on a three-node cluster Warm loads both
// scripts on every node and leaves Conns idle connections per node in the
// cluster client's pools.
func TestWarmClusterLoadsEveryNode(t *testing.T) {
	cl := redistest.StartCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, n := range cl.Nodes() {
		require.NoError(t, n.Client().ScriptFlush(ctx).Err())
	}
	s := NewRedisStore(client)
	nodes, err := s.Warm(ctx, WarmConfig{Conns: 5})
	require.NoError(t, err)
	assert.Equal(t, 3, nodes)
	for _, n := range cl.Nodes() {
		have, err := n.Client().ScriptExists(ctx, scriptHashes()...).Result()
		require.NoError(t, err)
		assert.Equal(t, allLoaded(), have, "node %s", n.Addr())
	}
	st := client.PoolStats()
	assert.GreaterOrEqual(t, st.IdleConns, uint32(3*5), "5 idle connections per node: %+v", st)
	require.NoError(t, s.checkWarm(ctx))

	// The first decision sends nothing but its EVALSHA: no COMMAND (the
	// cluster client's command table), no EVAL, no new connection.
	work := func() (commands, evals, conns int64) {
		for _, n := range cl.Nodes() {
			info, err := n.Client().Info(ctx, "commandstats", "stats").Result()
			require.NoError(t, err)
			commands += infoInt(t, info, `(?m)^cmdstat_command:calls=(\d+)`)
			evals += infoInt(t, info, `(?m)^cmdstat_eval:calls=(\d+)`)
			conns += infoInt(t, info, `(?m)^total_connections_received:(\d+)`)
		}
		return
	}
	c0, e0, n0 := work()
	l, err := New(Config{Store: s, Deadline: 5 * time.Second}, mustPolicies(t, `[{"id":"q","algorithm":"token_bucket","rate_per_sec":1,"burst":5}]`))
	require.NoError(t, err)
	d, err := l.Check(ctx, Request{Identity: Identity{APIKey: "first"}, Method: "GET", Path: "/"})
	require.NoError(t, err)
	require.Equal(t, SourceStore, d.Source)
	c1, e1, n1 := work()
	assert.Equal(t, [3]int64{c0, e0, n0}, [3]int64{c1, e1, n1}, "COMMAND, EVAL and connections before and after the first decision")

	// A node that forgets its scripts is found by the check.
	require.NoError(t, cl.Nodes()[1].Client().ScriptFlush(ctx).Err())
	err = s.checkWarm(ctx)
	require.ErrorIs(t, err, ErrNotWarm)
	assert.Contains(t, err.Error(), cl.Nodes()[1].Addr())
}

// TestWarmUnreachable: Warm of a store whose Redis is down fails with
// ErrNotWarm, naming the address and the step, within its context.
func TestWarmUnreachable(t *testing.T) {
	srv := redistest.StartServer(t)
	addr := srv.Addr()
	srv.Stop()
	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nodes, err := NewRedisStore(client).Warm(ctx, WarmConfig{})
	require.ErrorIs(t, err, ErrNotWarm)
	assert.Zero(t, nodes)
	assert.Contains(t, err.Error(), addr)
	assert.Contains(t, err.Error(), "connect")

	_, err = NewRedisStore(client).Warm(ctx, WarmConfig{Conns: -1})
	assert.ErrorContains(t, err, "Conns")
}

// TestWarmerRewarmsAfterRestart: a Warmer reports ready after its first
// warm-up and, when redis-server restarts (forgetting its scripts and
// breaking every pooled connection), loads the scripts again by itself,
// before any decision asks for them.
func TestWarmerRewarmsAfterRestart(t *testing.T) {
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	reg := prometheus.NewRegistry()
	w := startWarmer(t, NewRedisStore(client), WarmConfig{Interval: 20 * time.Millisecond, Conns: 3, Metrics: reg})
	st := w.Status()
	assert.True(t, st.Warm)
	assert.Equal(t, int64(1), st.Warmups)
	assert.Equal(t, 1, st.Nodes)
	assert.Equal(t, 1.0, gatherValue(t, reg, "quotient_store_warm", nil))

	srv.Restart(t)
	waitWarmups(t, w, 2)
	have, err := srv.Client().ScriptExists(context.Background(), scriptHashes()...).Result()
	require.NoError(t, err)
	assert.Equal(t, allLoaded(), have)
	assert.True(t, w.Status().Warm)
	assert.GreaterOrEqual(t, gatherValue(t, reg, "quotient_store_warmups_total", map[string]string{"result": "ok"}), 2.0)
}

// TestNoScriptWakesTheWarmer: a decision that meets NOSCRIPT (the scripts
// flushed, as a restart or failover does) is still answered by the store
// (one EVAL) and wakes the Warmer, which loads every script again at once,
// long before its next periodic check (an hour away here): the decisions
// after it find the scripts.
func TestNoScriptWakesTheWarmer(t *testing.T) {
	for _, pipelined := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "pipelined"}[pipelined], func(t *testing.T) {
			srv := redistest.StartServer(t)
			client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = client.Close() })
			store := NewRedisStore(client)
			if pipelined {
				var err error
				store, err = NewPipelinedRedisStore(client, DefaultPipelineConfig())
				require.NoError(t, err)
				t.Cleanup(store.Close)
			}
			w := startWarmer(t, store, WarmConfig{Interval: time.Hour})
			l, err := New(Config{Store: store, Deadline: 5 * time.Second}, mustPolicies(t, `[{"id":"q","algorithm":"token_bucket","rate_per_sec":1,"burst":5}]`))
			require.NoError(t, err)

			require.NoError(t, srv.Client().ScriptFlush(context.Background()).Err())
			d, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: "k"}, Method: "GET", Path: "/"})
			require.NoError(t, err)
			assert.Equal(t, SourceStore, d.Source, "answered with EVAL")
			deadline := time.Now().Add(10 * time.Second)
			for w.Status().Warmups < 2 {
				require.True(t, time.Now().Before(deadline), "the Warmer was not woken: %+v", w.Status())
				time.Sleep(5 * time.Millisecond) // polling a real server with a deadline
			}
			have, err := srv.Client().ScriptExists(context.Background(), scriptHashes()...).Result()
			require.NoError(t, err)
			assert.Equal(t, allLoaded(), have, "every script, not only the one the EVAL cached")
		})
	}
}

// allLoaded is SCRIPT EXISTS's answer when every store script is loaded.
func allLoaded() []bool {
	out := make([]bool, len(storeScripts))
	for i := range out {
		out[i] = true
	}
	return out
}
