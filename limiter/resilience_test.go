package limiter

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// manualClock is a Clock the test moves by hand.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func newManualClock() *manualClock {
	return &manualClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// flakyStore is a remote-looking Store: it answers from an in-memory store
// at the time given, fails while failing is set, and blocks (ignoring its
// context) while hang is set, until release is closed.
type flakyStore struct {
	mem     *MemoryStore
	calls   atomic.Int64
	failing atomic.Bool
	hang    atomic.Bool
	release chan struct{}
}

var _ Store = (*flakyStore)(nil)

func newFlakyStore() *flakyStore {
	return &flakyStore{mem: NewMemoryStore(), release: make(chan struct{})}
}

var errInjected = errors.New("injected store failure")

func (f *flakyStore) eval(ctx context.Context, now time.Time, subjects []Subject, ops []op, res []result) (bool, error) {
	f.calls.Add(1)
	if f.hang.Load() {
		<-f.release
		return false, errInjected
	}
	if f.failing.Load() {
		return false, errInjected
	}
	return f.mem.eval(ctx, now, subjects, ops, res)
}

func mustPolicies(t testing.TB, doc string) []*Policy {
	t.Helper()
	ps, err := ParsePolicies([]byte(doc))
	require.NoError(t, err)
	return ps
}

func TestBreakerTimeline(t *testing.T) {
	b, err := NewBreaker(BreakerConfig{MinCalls: 4})
	require.NoError(t, err)
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

	steps := []struct {
		ms        int
		success   bool
		wantState BreakerState
	}{
		{0, true, BreakerClosed},
		{100, false, BreakerClosed},
		{200, true, BreakerClosed},
		{300, false, BreakerOpen}, // 2 of 4 failed: 50%
	}
	for i, s := range steps {
		ok, probe := b.Allow(at(s.ms))
		require.True(t, ok, "step %d", i)
		require.False(t, probe)
		b.Record(at(s.ms), probe, s.success)
		require.Equal(t, s.wantState, b.State(at(s.ms)), "step %d", i)
	}
	ok, _ := b.Allow(at(5299))
	assert.False(t, ok, "open for 5 s")
	assert.Equal(t, time.Millisecond, b.RetryAfter(at(5299)))
	assert.Equal(t, BreakerHalfOpen, b.State(at(5300)))

	ok, probe := b.Allow(at(5300))
	require.True(t, ok)
	require.True(t, probe, "first call after OpenFor is the probe")
	ok, _ = b.Allow(at(5301))
	assert.False(t, ok, "one probe at a time")
	b.Record(at(5302), true, false)
	assert.Equal(t, BreakerOpen, b.State(at(5302)), "failed probe opens again")

	ok, probe = b.Allow(at(10302))
	require.True(t, ok && probe)
	b.Record(at(10303), true, true)
	assert.Equal(t, BreakerClosed, b.State(at(10303)), "successful probe closes")

	// Old failures age out of the 10 s window.
	for i := range 3 {
		b.Record(at(20000+i), false, false)
	}
	assert.Equal(t, BreakerClosed, b.State(at(20002)), "3 calls < MinCalls")
	for i := range 4 {
		b.Record(at(31000+i), false, true)
	}
	b.Record(at(31010), false, false)
	assert.Equal(t, BreakerClosed, b.State(at(31010)), "the failures at 20 s left the window: 1 of 5 failed")

	// Time going backwards counts in the newest slot and does not panic.
	b.Record(at(0), false, true)
	assert.Equal(t, BreakerClosed, b.State(at(31010)))
}

func TestBreakerConfigErrorsNameTheField(t *testing.T) {
	_, err := NewBreaker(BreakerConfig{FailureRatio: 2})
	require.ErrorContains(t, err, "Breaker.FailureRatio")
	_, err = New(Config{Deadline: -1}, nil)
	require.ErrorContains(t, err, "Deadline")
	_, err = New(Config{Instances: -3}, nil)
	require.ErrorContains(t, err, "Instances")
}

const classPolicies = `[
 {"id":"quota","algorithm":"token_bucket","rate_per_sec":10,"burst":10,"class":"quota"},
 {"id":"cap","subject":"account","algorithm":"token_bucket","rate_per_sec":10,"burst":10,"class":"capacity"},
 {"id":"login","subject":"ip","match":{"routes":["/login"]},"algorithm":"sliding_window_log","limit":5,"window_s":60,"class":"security"},
 {"id":"daily","subject":"user","algorithm":"fixed_window","limit":100,"window_s":100,"class":"quota"}
]`

func TestFallbackByFailureMode(t *testing.T) {
	clock := newManualClock()
	store := newFlakyStore()
	store.failing.Store(true)
	l, err := New(Config{Store: store, Clock: clock, Instances: 2, Breaker: BreakerConfig{Disabled: true}}, mustPolicies(t, classPolicies))
	require.NoError(t, err)
	ctx := context.Background()

	count := func(req Request, n int) (admitted int, last Decision) {
		for range n {
			d, err := l.Check(ctx, req)
			require.NoError(t, err)
			if d.Allowed {
				admitted++
			}
			last = d
		}
		return admitted, last
	}

	t.Run("quota fails open at rate x 2", func(t *testing.T) {
		admitted, last := count(Request{Identity: Identity{APIKey: "k1"}, Method: "GET", Path: "/x"}, 30)
		assert.Equal(t, 20, admitted, "burst 10 x OpenFactor 2")
		assert.Equal(t, SourceFallback, last.Source)
		require.Len(t, last.Policies, 1)
		assert.False(t, last.FailedClosed())
		assert.Equal(t, 50*time.Millisecond, last.Policies[0].RetryAfter, "one token at 20/s")
	})
	t.Run("capacity falls back to rate / instances", func(t *testing.T) {
		admitted, _ := count(Request{Identity: Identity{Account: "acme"}, Method: "GET", Path: "/x"}, 30)
		assert.Equal(t, 5, admitted, "burst 10 / 2 instances")
	})
	t.Run("security fails closed", func(t *testing.T) {
		admitted, last := count(Request{Identity: Identity{IP: netip.MustParseAddr("192.0.2.1")}, Method: "POST", Path: "/login"}, 3)
		assert.Zero(t, admitted)
		assert.True(t, last.FailedClosed())
		assert.Equal(t, time.Second, last.RetryAfter(), "at least 1 s when the breaker is not open")
	})
	t.Run("window policies keep their window at limit x 2", func(t *testing.T) {
		admitted, last := count(Request{Identity: Identity{User: "u1"}, Method: "GET", Path: "/x"}, 300)
		assert.Equal(t, 200, admitted, "limit 100 x 2 in the window")
		clock.Advance(last.RetryAfter()) // to the next window
		admitted, _ = count(Request{Identity: Identity{User: "u1"}, Method: "GET", Path: "/x"}, 300)
		assert.Equal(t, 200, admitted, "the next window")
	})
	t.Run("the store answers again once it recovers", func(t *testing.T) {
		store.failing.Store(false)
		d, err := l.Check(ctx, Request{Identity: Identity{APIKey: "k1"}, Method: "GET", Path: "/x"})
		require.NoError(t, err)
		assert.Equal(t, SourceStore, d.Source)
		assert.True(t, d.Allowed, "the store's own bucket is full")
	})
}

func TestFallbackMemoryIsBounded(t *testing.T) {
	clock := newManualClock()
	store := newFlakyStore()
	store.failing.Store(true)
	l, err := New(Config{Store: store, Clock: clock, FallbackMaxKeys: 50, Breaker: BreakerConfig{Disabled: true}}, mustPolicies(t, classPolicies))
	require.NoError(t, err)
	for i := range 500 {
		_, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: string(rune('a'+i%26)) + string(rune(i))}, Method: "GET", Path: "/"})
		require.NoError(t, err)
	}
	assert.LessOrEqual(t, l.fb.len(), 50)
}

// TestDeadlineBoundsHangingStore: a store that never answers costs each
// request exactly the deadline (virtual time), then the fallback answers.
func TestDeadlineBoundsHangingStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newFlakyStore()
		store.hang.Store(true)
		defer close(store.release)
		l, err := New(Config{Store: store, Deadline: 5 * time.Millisecond}, mustPolicies(t, classPolicies))
		require.NoError(t, err)
		for range 3 {
			start := time.Now()
			d, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: "k"}, Method: "GET", Path: "/"})
			require.NoError(t, err)
			assert.Equal(t, 5*time.Millisecond, time.Since(start))
			assert.True(t, d.Allowed)
			assert.Equal(t, SourceFallback, d.Source)
		}
	})
}

func TestCallerCancelIsAnErrorNotAStoreFailure(t *testing.T) {
	store := newFlakyStore()
	l, err := New(Config{Store: store, Breaker: BreakerConfig{MinCalls: 1}}, mustPolicies(t, classPolicies))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = l.Check(ctx, Request{Identity: Identity{APIKey: "k"}, Method: "GET", Path: "/"})
	require.ErrorIs(t, err, ErrCanceled)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, BreakerClosed, l.BreakerState())
}

func TestBreakerSkipsTheStoreWhileOpen(t *testing.T) {
	clock := newManualClock()
	store := newFlakyStore()
	l, err := New(Config{Store: store, Clock: clock, Breaker: BreakerConfig{MinCalls: 10}}, mustPolicies(t, classPolicies))
	require.NoError(t, err)
	req := Request{Identity: Identity{APIKey: "k"}, Method: "GET", Path: "/"}
	ctx := context.Background()
	store.failing.Store(true)
	for range 10 {
		_, err := l.Check(ctx, req)
		require.NoError(t, err)
	}
	require.Equal(t, BreakerOpen, l.BreakerState())
	calls := store.calls.Load()
	for range 100 {
		d, err := l.Check(ctx, req)
		require.NoError(t, err)
		require.Equal(t, SourceFallback, d.Source)
	}
	assert.Equal(t, calls, store.calls.Load(), "no store call while open")

	store.failing.Store(false)
	clock.Advance(5 * time.Second)
	assert.Equal(t, BreakerHalfOpen, l.BreakerState())
	d, err := l.Check(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, SourceStore, d.Source, "the probe goes to the store")
	assert.Equal(t, BreakerClosed, l.BreakerState())
}

func TestMemoryStoreSkipsTheResilienceLayer(t *testing.T) {
	l, err := New(Config{}, mustPolicies(t, classPolicies))
	require.NoError(t, err)
	assert.False(t, l.remote)
	for range 20 {
		d, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: "k"}, Method: "GET", Path: "/"})
		require.NoError(t, err)
		require.NotEqual(t, SourceDenyCache, d.Source)
	}
}
