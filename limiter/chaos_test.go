package limiter

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

const chaosPolicies = `[
 {"id":"quota","algorithm":"token_bucket","rate_per_sec":0.01,"burst":5,"class":"quota"},
 {"id":"login","subject":"ip","match":{"routes":["/login"]},"algorithm":"sliding_window_log","limit":3,"window_s":60,"class":"security"}
]`

// chaosSlack is the "small constant" a request may wait beyond the
// deadline: scheduling on a loaded, race-instrumented machine.
const chaosSlack = 250 * time.Millisecond

// TestChaosRedisDies kills Redis under steady load: every request returns
// within the deadline plus a small constant, quota traffic flows under the
// local limits, security traffic is refused as failed closed, the breaker
// opens; after a restart the breaker closes and exact limiting resumes.
func TestChaosRedisDies(t *testing.T) {
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	clock := newManualClock() // drives the breaker and fallback; Redis keeps its own time
	reg := prometheus.NewRegistry()
	const deadline = 50 * time.Millisecond
	l, err := New(Config{Store: NewRedisStore(client), Clock: clock, Deadline: deadline, Metrics: reg}, mustPolicies(t, chaosPolicies))
	require.NoError(t, err)
	ctx := context.Background()
	quota := func(key string) Request {
		return Request{Identity: Identity{APIKey: key}, Method: "GET", Path: "/v1/x"}
	}
	login := Request{Identity: Identity{IP: netip.MustParseAddr("198.51.100.7")}, Method: "POST", Path: "/login"}

	var slowest atomic.Int64
	timed := func(req Request) (Decision, error) {
		start := time.Now()
		d, err := l.Check(ctx, req)
		el := time.Since(start)
		for {
			old := slowest.Load()
			if int64(el) <= old || slowest.CompareAndSwap(old, int64(el)) {
				break
			}
		}
		return d, err
	}
	check := func(req Request) Decision {
		d, err := timed(req)
		require.NoError(t, err)
		return d
	}
	admitted := func(req Request, n int) (int, Decision) {
		ok := 0
		var last Decision
		for range n {
			last = check(req)
			if last.Allowed {
				ok++
			}
		}
		return ok, last
	}

	// Healthy: exact limits from Redis.
	n, last := admitted(quota("before"), 10)
	require.Equal(t, 5, n)
	require.NotEqual(t, SourceFallback, last.Source)
	n, _ = admitted(login, 5)
	require.Equal(t, 3, n)

	// Kill Redis under steady load from several goroutines. (The address
	// rejected above stays rejected by the deny cache; use a fresh one.)
	login.Identity.IP = netip.MustParseAddr("2001:db8:1:2::99")
	srv.Stop()
	var wg sync.WaitGroup
	var quotaOK, loginOK, loginClosed atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				if i%5 == 4 {
					d, err := timed(login)
					if err == nil && d.Allowed {
						loginOK.Add(1)
					} else if err == nil && d.FailedClosed() {
						loginClosed.Add(1)
					}
					continue
				}
				d, err := timed(quota("during"))
				if err == nil && d.Allowed {
					quotaOK.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(10), quotaOK.Load(), "quota fails open onto burst 5 x 2, clock frozen")
	assert.Zero(t, loginOK.Load(), "security never admitted while Redis is down")
	assert.Equal(t, int64(40), loginClosed.Load(), "every login refused as failed closed")
	assert.Equal(t, BreakerOpen, l.BreakerState())
	assert.Equal(t, 2.0, gatherValue(t, reg, "quotient_limiter_breaker_state", nil))
	n, _ = admitted(quota("during-open"), 20)
	assert.Equal(t, 10, n, "while open, each key gets its own local limit")

	// Restart: after OpenFor the probe succeeds and exact limiting resumes.
	srv.Restart(t)
	clock.Advance(5 * time.Second)
	waitUntil := time.Now().Add(10 * time.Second)
	for {
		d := check(quota("probe"))
		if d.Source == SourceStore {
			break
		}
		require.True(t, time.Now().Before(waitUntil), "the breaker never closed")
		clock.Advance(5 * time.Second) // a failed probe reopened it: try again
	}
	assert.Equal(t, BreakerClosed, l.BreakerState())
	n, last = admitted(quota("after"), 10)
	assert.Equal(t, 5, n, "exact again")
	assert.NotEqual(t, SourceFallback, last.Source)

	el := time.Duration(slowest.Load())
	t.Logf("slowest check: %v (deadline %v)", el, deadline)
	assert.LessOrEqual(t, el, deadline+chaosSlack)
}

// TestChaosHungRedis freezes Redis (SIGSTOP-like: a server that accepts
// but never answers is modelled by a client pointed at a listener that
// never replies): every request still returns within the deadline plus a
// small constant.
func TestChaosHungRedis(t *testing.T) {
	// Both ways of bounding a call: a client that ignores contexts (the
	// limiter abandons the call in its goroutine) and one built with
	// ContextTimeoutEnabled (go-redis ends the call at the deadline).
	for _, bounded := range []bool{false, true} {
		t.Run(fmt.Sprintf("context_timeout_enabled=%v", bounded), func(t *testing.T) {
			ln := listenSilently(t)
			client := redis.NewClient(&redis.Options{Addr: ln, MaxRetries: -1, ReadTimeout: time.Minute, WriteTimeout: time.Minute, ContextTimeoutEnabled: bounded})
			t.Cleanup(func() { _ = client.Close() })
			const deadline = 20 * time.Millisecond
			store := NewRedisStore(client)
			require.Equal(t, bounded, store.boundedByContext)
			l, err := New(Config{Store: store, Deadline: deadline}, mustPolicies(t, chaosPolicies))
			require.NoError(t, err)
			for range 5 {
				start := time.Now()
				d, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: "k"}, Method: "GET", Path: "/"})
				el := time.Since(start)
				require.NoError(t, err)
				assert.True(t, d.Allowed)
				assert.Equal(t, SourceFallback, d.Source)
				assert.LessOrEqual(t, el, deadline+chaosSlack)
			}
		})
	}
}

// listenSilently accepts TCP connections on loopback and never answers.
func listenSilently(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String()
}
