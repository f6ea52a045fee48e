package limiter

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// serverConns is the connections a redis-server has accepted since it
// started.
func serverConns(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := srv.Client().Info(ctx, "stats").Result()
	require.NoError(t, err)
	return infoInt(t, info, `(?m)^total_connections_received:(\d+)`)
}

// TestFirstDecisionLatency measures the first decision's latency (one
// Check, 1 s deadline so that the cold cost is seen whole) after start and
// after a redis-server restart, warm (a Warmer runs) against cold (none),
// side by side in one run on two servers, and logs the medians of 5
// rounds each. It checks what makes the difference: the warm first
// decisions open no connection and load no script on their server; the
// cold ones dial, meet NOSCRIPT and send the script with EVAL.
func TestFirstDecisionLatency(t *testing.T) {
	srvCold, srvWarm := redistest.StartServer(t), redistest.StartServer(t)
	policies := mustPolicies(t, restartPolicies)
	first := func(l *Limiter, key string) time.Duration {
		start := time.Now()
		d, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: key}, Method: "GET", Path: "/"})
		took := time.Since(start)
		require.NoError(t, err)
		require.Equal(t, SourceStore, d.Source, key)
		return took
	}
	newLimiter := func(srv *redistest.Server) (*Limiter, *RedisStore) {
		client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = client.Close() })
		s := NewRedisStore(client)
		l, err := New(Config{Store: s, Deadline: time.Second}, policies)
		require.NoError(t, err)
		return l, s
	}
	type sample struct{ took, conns, noscript, evals int64 }
	measure := func(srv *redistest.Server, l *Limiter, key string) sample {
		c0 := serverConns(t, srv)
		n0, e0 := serverCold(t, srv)
		took := first(l, key)
		n1, e1 := serverCold(t, srv)
		return sample{took: int64(took), conns: serverConns(t, srv) - c0, noscript: n1 - n0, evals: e1 - e0}
	}
	var startCold, startWarm, restartCold, restartWarm []sample
	for range 5 {
		for _, srv := range []*redistest.Server{srvCold, srvWarm} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			require.NoError(t, srv.Client().ScriptFlush(ctx).Err())
			cancel()
		}
		lc, _ := newLimiter(srvCold)
		lw, sw := newLimiter(srvWarm)
		ctx, cancel := context.WithCancel(context.Background())
		w, err := NewWarmer(sw, WarmConfig{Interval: time.Minute})
		require.NoError(t, err)
		done := make(chan struct{})
		go func() { defer close(done); _ = w.Run(ctx) }()
		<-w.Ready()
		startWarm = append(startWarm, measure(srvWarm, lw, "start"))
		startCold = append(startCold, measure(srvCold, lc, "start"))
		srvCold.Restart(t)
		srvWarm.Restart(t)
		waitWarmups(t, w, 2)
		restartWarm = append(restartWarm, measure(srvWarm, lw, "restart"))
		restartCold = append(restartCold, measure(srvCold, lc, "restart"))
		cancel()
		<-done
	}
	median := func(ss []sample) time.Duration {
		v := make([]int64, len(ss))
		for i, s := range ss {
			v[i] = s.took
		}
		slices.Sort(v)
		return time.Duration(v[len(v)/2]).Round(10 * time.Microsecond)
	}
	for _, s := range append(slices.Clone(startWarm), restartWarm...) {
		assert.Equal(t, sample{took: s.took}, s, "a warm first decision opens no connection and loads no script")
	}
	for _, s := range append(slices.Clone(startCold), restartCold...) {
		assert.Equal(t, sample{took: s.took, conns: 1, noscript: 1, evals: 1}, s, "a cold first decision dials (after a restart its pool died with the server), meets NOSCRIPT and sends the script")
	}
	t.Logf("first decision latency, median of 5 rounds: after start warm %v, cold %v; after a redis-server restart warm %v, cold %v",
		median(startWarm), median(startCold), median(restartWarm), median(restartCold))
}
