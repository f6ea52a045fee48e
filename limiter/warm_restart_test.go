package limiter

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

const restartPolicies = `[{"id":"shape","algorithm":"leaky_bucket","rate_per_sec":5,"burst":10}]`

// serverCold is the cold-path work a redis-server has done since it
// started: NOSCRIPT answers and EVAL calls (script sources compiled).
func serverCold(t *testing.T, srv *redistest.Server) (noscript, evals int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := srv.Client().Info(ctx, "errorstats", "commandstats").Result()
	require.NoError(t, err)
	return infoInt(t, info, `(?m)^errorstat_NOSCRIPT:count=(\d+)`), infoInt(t, info, `(?m)^cmdstat_eval:calls=(\d+)`)
}

// checkBurst runs n Checks of key at once and returns their sources.
func checkBurst(t *testing.T, l *Limiter, key string, n int) map[Source]int {
	t.Helper()
	var mu sync.Mutex
	out := map[Source]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			d, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: key}, Method: "GET", Path: "/"})
			assert.NoError(t, err)
			mu.Lock()
			out[d.Source]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	return out
}

// assertFromStore checks that all n decisions of a burst came from the
// store (its rejections possibly from the deny cache it filled), none
// from the fallback.
func assertFromStore(t *testing.T, srcs map[Source]int, n int) {
	t.Helper()
	assert.Zero(t, srcs[SourceFallback], "%v", srcs)
	assert.Equal(t, n, srcs[SourceStore]+srcs[SourceDenyCache], "%v", srcs)
}

// startWarmer runs a Warmer of s until the test ends and waits for its
// first warm-up.
func startWarmer(t *testing.T, s *RedisStore, cfg WarmConfig) *Warmer {
	t.Helper()
	w, err := NewWarmer(s, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-w.Ready():
	case <-time.After(10 * time.Second):
		t.Fatalf("not warm after 10 s: %+v", w.Status())
	}
	return w
}

// waitWarmups waits (bounded) until w has succeeded n warm-ups.
func waitWarmups(t *testing.T, w *Warmer, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for st := w.Status(); !st.Warm || st.Warmups < n; st = w.Status() {
		require.True(t, time.Now().Before(deadline), "warm-up %d not done after 10 s: %+v", n, st)
		time.Sleep(5 * time.Millisecond) // polling a real server with a deadline
	}
}

// TestWarmerBypassesStoreUntilRedisIsWarmAgain: redis-server restarts
// (empty, no scripts) under a warm store. The decisions sent the moment
// it accepts connections again make it do no cold-path work (no NOSCRIPT,
// no EVAL): the Warmer learned of the restart from its watch connection
// and they are answered by the fallback without a store call, until it
// has warmed the new server; then they come from the store again, and
// the breaker never counted the bypassed ones. The Warmer's periodic
// check is a minute away, so only the watch can have told it.
func TestWarmerBypassesStoreUntilRedisIsWarmAgain(t *testing.T) {
	for _, pipelined := range []bool{false, true} {
		t.Run(map[bool]string{false: "one call per decision", true: "pipelined"}[pipelined], func(t *testing.T) {
			testBypassUntilWarmAgain(t, pipelined)
		})
	}
}

func testBypassUntilWarmAgain(t *testing.T, pipelined bool) {
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	s := NewRedisStore(client)
	if pipelined {
		var err error
		s, err = NewPipelinedRedisStore(client, DefaultPipelineConfig())
		require.NoError(t, err)
		t.Cleanup(s.Close)
	}
	w := startWarmer(t, s, WarmConfig{Interval: time.Minute})
	// A long deadline: what is checked is where decisions go, not how
	// fast they are on a loaded machine.
	l, err := New(Config{Store: s, Deadline: 2 * time.Second}, mustPolicies(t, restartPolicies))
	require.NoError(t, err)
	assertFromStore(t, checkBurst(t, l, "before", 14), 14)

	srv.Restart(t)
	srcs := checkBurst(t, l, "right-after", 14)
	noscript, evals := serverCold(t, srv)
	assert.Zero(t, noscript, "no decision met NOSCRIPT on the restarted server (sources %v)", srcs)
	assert.Zero(t, evals, "no decision sent the script with EVAL (sources %v)", srcs)
	assert.Equal(t, 14, srcs[SourceStore]+srcs[SourceFallback], "%v", srcs)

	waitWarmups(t, w, 2)
	assert.False(t, w.Status().Bypassed)
	assertFromStore(t, checkBurst(t, l, "warm-again", 14), 14)
	noscript, evals = serverCold(t, srv)
	assert.Zero(t, noscript+evals, "the Warmer loaded the scripts before the store answered again")
	assert.Equal(t, BreakerClosed, l.BreakerState())
}

// TestWarmerBypassesStoreWhileRedisIsDown: with redis-server stopped,
// decisions fail over to the fallback without a store call (Bypassed,
// and the breaker stays closed however many there are); /readyz-style
// status says why; once the server is back the Warmer warms it within
// its RetryInterval and decisions come from the store again.
func TestWarmerBypassesStoreWhileRedisIsDown(t *testing.T) {
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	s := NewRedisStore(client)
	w := startWarmer(t, s, WarmConfig{Interval: time.Minute})
	l, err := New(Config{Store: s, Deadline: 2 * time.Second}, mustPolicies(t, restartPolicies))
	require.NoError(t, err)

	srv.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for !w.Status().Bypassed {
		require.True(t, time.Now().Before(deadline), "never bypassed: %+v", w.Status())
		time.Sleep(5 * time.Millisecond) // polling a real server with a deadline
	}
	for range 3 {
		assert.Equal(t, map[Source]int{SourceFallback: 14}, checkBurst(t, l, "down", 14))
	}
	assert.Equal(t, BreakerClosed, l.BreakerState(), "42 bypassed decisions are no evidence against the store")
	// The status says why: the watch connection ended, then the
	// warm-ups it retries are refused.
	for st := w.Status(); st.Err == nil || !strings.Contains(st.Err.Error(), "connection refused"); st = w.Status() {
		require.True(t, time.Now().Before(deadline), "no refused warm-up: %+v", st)
		assert.False(t, st.Warm)
		time.Sleep(5 * time.Millisecond) // polling a real server with a deadline
	}
	assert.ErrorIs(t, w.Status().Err, ErrNotWarm)

	srv.Restart(t)
	waitWarmups(t, w, 2)
	assertFromStore(t, checkBurst(t, l, "back", 14), 14)
}

// TestBreakerIgnoresBypassedCalls: a call the store never made (the
// Warmer bypasses a Redis it knows is down) is not a failure: however
// many there are, the breaker stays closed, and a half-open probe that
// meets one only lets the next call probe; a real failure still counts.
func TestBreakerIgnoresBypassedCalls(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b, err := NewBreaker(BreakerConfig{MinCalls: 4})
	require.NoError(t, err)
	for i := range 50 {
		ok, probe := b.Allow(t0.Add(time.Duration(i) * time.Millisecond))
		require.True(t, ok)
		b.recordStoreErr(t0.Add(time.Duration(i)*time.Millisecond), probe, errBypassed)
	}
	assert.Equal(t, BreakerClosed, b.State(t0.Add(time.Second)))
	for i := range 4 {
		b.recordStoreErr(t0.Add(time.Second+time.Duration(i)), false, ErrStoreUnavailable)
	}
	assert.Equal(t, BreakerOpen, b.State(t0.Add(time.Second+time.Millisecond)))
	half := t0.Add(time.Second + 5*time.Second + time.Millisecond)
	ok, probe := b.Allow(half)
	require.True(t, ok)
	require.True(t, probe)
	b.recordStoreErr(half, probe, errBypassed)
	assert.Equal(t, BreakerHalfOpen, b.State(half), "a bypassed probe neither closes nor opens")
	ok, probe = b.Allow(half)
	assert.True(t, ok && probe, "the next call probes")
}

// TestIsConnErr: what counts as Redis gone (which bypasses the store)
// and what does not (a slow answer, a script error).
func TestIsConnErr(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.Ping(ctx).Err())
	scriptErr := c.Eval(ctx, "return redis.error_reply('ERR boom')", nil).Err()
	require.Error(t, scriptErr)
	assert.False(t, isConnErr(scriptErr), "a script error: %v", scriptErr)
	short, cancelShort := context.WithTimeout(ctx, time.Nanosecond)
	defer cancelShort()
	time.Sleep(time.Millisecond)
	slow := c.Ping(short).Err()
	require.Error(t, slow)
	assert.False(t, isConnErr(slow), "a deadline: %v", slow)
	srv.Stop()
	gone := c.Ping(ctx).Err()
	require.Error(t, gone)
	assert.True(t, isConnErr(gone), "a stopped server: %v", gone)
	assert.False(t, isConnErr(nil))
}
