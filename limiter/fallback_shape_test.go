package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The fallback keeps each algorithm's shape (fallback.go), on the fixed
// timeline t0 (a whole UTC day, so every window starts at t0).

// TestFallbackLeakyBucketStillShapes: a leaky bucket (5/s, burst 10) whose
// store is down still delays what it admits, through Check: a queue of
// burst 10 x 2 drained at 5/s x 2 (OpenFactor), so the k-th request of a
// burst waits k x 100 ms, and the 21st is rejected until 100 ms of the
// queue has drained.
func TestFallbackLeakyBucketStillShapes(t *testing.T) {
	clock := newManualClock()
	clock.t = t0
	store := newFlakyStore()
	store.failing.Store(true)
	l, err := New(Config{Store: store, Clock: clock, Breaker: BreakerConfig{Disabled: true}}, mustPolicies(t,
		`[{"id":"shape","algorithm":"leaky_bucket","rate_per_sec":5,"burst":10}]`))
	require.NoError(t, err)
	req := Request{Identity: Identity{APIKey: "k"}, Method: "GET", Path: "/"}
	ctx := context.Background()
	for k := range 20 {
		d, err := l.Check(ctx, req)
		require.NoError(t, err)
		require.True(t, d.Allowed, "request %d", k)
		assert.Equal(t, SourceFallback, d.Source)
		assert.Equal(t, time.Duration(k)*100*time.Millisecond, d.Delay, "request %d waits for the %d queued ahead at 10/s", k, k)
		assert.Equal(t, d.Delay, d.Policies[0].Delay)
	}
	d, err := l.Check(ctx, req)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "the queue holds 20")
	assert.Zero(t, d.Delay, "a rejection is not delayed")
	assert.Equal(t, 100*time.Millisecond, d.RetryAfter())

	clock.Advance(100 * time.Millisecond)
	d, err = l.Check(ctx, req)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, 1900*time.Millisecond, d.Delay, "19 requests still queued ahead")

	// A shadow leaky bucket never delays.
	ps := mustPolicies(t, `[{"id":"shadow","mode":"shadow","algorithm":"leaky_bucket","rate_per_sec":5,"burst":10}]`)
	for range 3 {
		d, err := l.checkSubjectFallbackAt(at(0), Subject{Kind: SubjectAPIKey, Value: "s"}, ps, 1)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		assert.Zero(t, d.Delay)
	}
}

// TestFallbackWindowsKeepTheirWindows: windows fall back to the same
// windows at the scaled limit, not to a bucket that refills: a fixed
// window admits limit x 2 until its window ends, then again; a sliding
// window (log or counter) admits limit x 2 over its window and nothing
// more a few seconds later; local policies get limit / Instances.
func TestFallbackWindowsKeepTheirWindows(t *testing.T) {
	ps := mustPolicies(t, `[
		{"id":"fw","algorithm":"fixed_window","limit":100,"window_s":100},
		{"id":"log","algorithm":"sliding_window_log","limit":5,"window_s":60},
		{"id":"swc","algorithm":"sliding_window_counter","limit":5,"window_s":60},
		{"id":"month","algorithm":"fixed_window","limit":3,"window":"month"},
		{"id":"fwlocal","algorithm":"fixed_window","limit":100,"window_s":100,"on_store_failure":"local"}
	]`)
	l, err := New(Config{Instances: 4}, ps)
	require.NoError(t, err)
	subj := Subject{Kind: SubjectAPIKey, Value: "k"}
	admitted := func(p *Policy, ms int64, n int) (int, Decision) {
		t.Helper()
		var last Decision
		got := 0
		for range n {
			d, err := l.checkSubjectFallbackAt(at(ms), subj, []*Policy{p}, 1)
			require.NoError(t, err)
			require.Equal(t, SourceFallback, d.Source)
			if d.Allowed {
				got++
			}
			last = d
		}
		return got, last
	}

	t.Run("fixed window", func(t *testing.T) {
		got, last := admitted(ps[0], 0, 250)
		assert.Equal(t, 200, got, "limit 100 x 2 in the window")
		assert.Equal(t, 100*time.Second, last.RetryAfter(), "until the window ends")
		got, _ = admitted(ps[0], 50_000, 10)
		assert.Zero(t, got, "no refill within the window (a bucket would have refilled 100)")
		got, _ = admitted(ps[0], 100_000, 250)
		assert.Equal(t, 200, got, "the next window")
	})
	for _, p := range ps[1:3] {
		t.Run(p.ID, func(t *testing.T) {
			got, last := admitted(p, 0, 15)
			assert.Equal(t, 10, got, "limit 5 x 2 over the window")
			assert.Positive(t, last.RetryAfter())
			got, _ = admitted(p, 10_000, 3)
			assert.Zero(t, got, "10 s later the window still holds 10 (a bucket would have refilled 1.6)")
		})
	}
	t.Run("calendar month", func(t *testing.T) {
		got, last := admitted(ps[3], 0, 10)
		assert.Equal(t, 6, got, "limit 3 x 2 in the month")
		assert.Equal(t, 24*time.Hour, last.RetryAfter(), "t0 is 30 November: until 1 December")
		got, _ = admitted(ps[3], 24*3600*1000, 10)
		assert.Equal(t, 6, got, "December")
	})
	t.Run("local", func(t *testing.T) {
		got, _ := admitted(ps[4], 0, 50)
		assert.Equal(t, 25, got, "limit 100 / 4 instances")
	})
}

// TestFallbackTimeNeverGoesBack: a request that reaches the fallback after
// a later one (its store call took longer to fail) is decided at the later
// time, so it neither waits for time that has already passed nor takes a
// place from the queue: 20 requests fit the queue of 20 whatever order
// their times arrive in.
func TestFallbackTimeNeverGoesBack(t *testing.T) {
	ps := mustPolicies(t, `[{"id":"shape","algorithm":"leaky_bucket","rate_per_sec":5,"burst":10}]`)
	l, err := New(Config{}, ps)
	require.NoError(t, err)
	subj := Subject{Kind: SubjectAPIKey, Value: "k"}
	d, err := l.checkSubjectFallbackAt(at(3), subj, ps, 1)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	assert.Zero(t, d.Delay)
	for k := 1; k < 20; k++ {
		d, err := l.checkSubjectFallbackAt(at(0), subj, ps, 1)
		require.NoError(t, err)
		require.True(t, d.Allowed, "request %d", k)
		assert.Equal(t, time.Duration(k)*100*time.Millisecond, d.Delay, "request %d", k)
	}
	d, err = l.checkSubjectFallbackAt(at(0), subj, ps, 1)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "the queue holds 20")
}
