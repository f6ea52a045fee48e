package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// t0 is the start of every timeline: a whole UTC day, so fixed windows start
// at t0.
var t0 = time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)

func at(ms int64) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func mustPolicy(t testing.TB, doc string) *Policy {
	t.Helper()
	p, err := ParsePolicy([]byte(doc))
	require.NoError(t, err)
	return p
}

// step is one request on a timeline and what must come back for policy 0.
type step struct {
	ms        int64
	cost      int64
	allowed   bool
	remaining int64
	retryMs   int64 // -1: never
	resetMs   int64
	delayMs   int64
}

func runTimeline(t *testing.T, store Store, p *Policy, steps []step) {
	t.Helper()
	l, err := New(Config{Store: store}, []*Policy{p})
	require.NoError(t, err)
	subj := Subject{Kind: SubjectAPIKey, Value: "key-1"}
	for i, s := range steps {
		d, err := l.checkSubjectAt(context.Background(), at(s.ms), subj, []*Policy{p}, s.cost)
		require.NoError(t, err)
		require.Len(t, d.Policies, 1)
		pd := d.Policies[0]
		assert.Equal(t, s.allowed, d.Allowed, "step %d (t=%dms cost %d): allowed", i, s.ms, s.cost)
		assert.Equal(t, s.remaining, pd.Remaining, "step %d: remaining", i)
		if s.retryMs < 0 {
			assert.True(t, pd.Never, "step %d: never", i)
		} else {
			assert.Equal(t, time.Duration(s.retryMs)*time.Millisecond, pd.RetryAfter, "step %d: retry", i)
		}
		assert.Equal(t, time.Duration(s.resetMs)*time.Millisecond, pd.ResetAfter, "step %d: reset", i)
		assert.Equal(t, time.Duration(s.delayMs)*time.Millisecond, d.Delay, "step %d: delay", i)
	}
}

func TestTokenBucketTimeline(t *testing.T) {
	// 10 tokens/s, burst 20: 100 ms per token.
	p := mustPolicy(t, `{"id":"tb","algorithm":"token_bucket","rate_per_sec":10,"burst":20}`)
	runTimeline(t, NewMemoryStore(), p, []step{
		{ms: 0, cost: 15, allowed: true, remaining: 5, resetMs: 1500},
		{ms: 0, cost: 6, allowed: false, remaining: 5, retryMs: 100, resetMs: 1500},
		{ms: 100, cost: 6, allowed: true, remaining: 0, resetMs: 2000},
		{ms: 150, cost: 1, allowed: false, remaining: 0, retryMs: 50, resetMs: 1950},
		{ms: 150, cost: 0, allowed: true, remaining: 0, resetMs: 1950}, // peek
		{ms: 250, cost: 1, allowed: true, remaining: 0, resetMs: 1950},
		{ms: 10_000, cost: 20, allowed: true, remaining: 0, resetMs: 2000}, // refilled to the cap, not beyond
		{ms: 10_000, cost: 21, allowed: false, remaining: 0, retryMs: -1, resetMs: 2000},
		{ms: 9_000, cost: 1, allowed: false, remaining: 0, retryMs: 100, resetMs: 2000}, // clock went back: no refill
	})
}

func TestLeakyBucketTimeline(t *testing.T) {
	// Drains 10/s (100 ms per unit), queue of 5.
	p := mustPolicy(t, `{"id":"lb","algorithm":"leaky_bucket","rate_per_sec":10,"burst":5}`)
	runTimeline(t, NewMemoryStore(), p, []step{
		{ms: 0, cost: 1, allowed: true, remaining: 4, resetMs: 100, delayMs: 0},
		{ms: 0, cost: 1, allowed: true, remaining: 3, resetMs: 200, delayMs: 100},
		{ms: 0, cost: 3, allowed: true, remaining: 0, resetMs: 500, delayMs: 200},
		{ms: 0, cost: 1, allowed: false, remaining: 0, retryMs: 100, resetMs: 500},
		{ms: 250, cost: 2, allowed: true, remaining: 0, resetMs: 450, delayMs: 250},
		{ms: 250, cost: 6, allowed: false, remaining: 0, retryMs: -1, resetMs: 450},
	})
}

func TestFixedWindowTimeline(t *testing.T) {
	p := mustPolicy(t, `{"id":"fw","algorithm":"fixed_window","limit":3,"window_s":60}`)
	runTimeline(t, NewMemoryStore(), p, []step{
		{ms: 1_000, cost: 2, allowed: true, remaining: 1, resetMs: 59_000},
		{ms: 2_000, cost: 2, allowed: false, remaining: 1, retryMs: 58_000, resetMs: 58_000},
		{ms: 3_000, cost: 1, allowed: true, remaining: 0, resetMs: 57_000},
		{ms: 59_999, cost: 1, allowed: false, remaining: 0, retryMs: 1, resetMs: 1},
		{ms: 60_000, cost: 3, allowed: true, remaining: 0, resetMs: 60_000}, // new window
		{ms: 61_000, cost: 4, allowed: false, remaining: 0, retryMs: -1, resetMs: 59_000},
	})
}

func TestFixedWindowIsTheUTCDay(t *testing.T) {
	p := mustPolicy(t, `{"id":"day","algorithm":"fixed_window","limit":2,"window_s":86400}`)
	late := int64(23*3600_000 + 59*60_000)
	runTimeline(t, NewMemoryStore(), p, []step{
		{ms: late, cost: 2, allowed: true, remaining: 0, resetMs: 60_000},
		{ms: late + 59_999, cost: 1, allowed: false, remaining: 0, retryMs: 1, resetMs: 1},
		{ms: 86_400_000, cost: 1, allowed: true, remaining: 1, resetMs: 86_400_000},
	})
}

func TestSlidingWindowLogTimeline(t *testing.T) {
	p := mustPolicy(t, `{"id":"sl","algorithm":"sliding_window_log","limit":3,"window_s":10}`)
	runTimeline(t, NewMemoryStore(), p, []step{
		{ms: 0, cost: 1, allowed: true, remaining: 2, resetMs: 10_000},
		{ms: 4_000, cost: 2, allowed: true, remaining: 0, resetMs: 10_000},
		{ms: 9_000, cost: 1, allowed: false, remaining: 0, retryMs: 1_000, resetMs: 5_000},
		{ms: 10_000, cost: 1, allowed: true, remaining: 0, resetMs: 10_000}, // the entry at 0 left the window
		{ms: 12_000, cost: 2, allowed: false, remaining: 0, retryMs: 2_000, resetMs: 8_000},
		{ms: 14_000, cost: 2, allowed: true, remaining: 0, resetMs: 10_000},
		{ms: 14_000, cost: 4, allowed: false, remaining: 0, retryMs: -1, resetMs: 10_000},
	})
}

func TestSlidingWindowCounterSeedExample(t *testing.T) {
	p := mustPolicy(t, `{"id":"sc","algorithm":"sliding_window_counter","limit":100,"window_s":60}`)
	l, err := New(Config{}, []*Policy{p})
	require.NoError(t, err)
	subj := Subject{Kind: SubjectAPIKey, Value: "k"}
	ctx := context.Background()
	check := func(ms, cost int64) PolicyDecision {
		d, err := l.checkSubjectAt(ctx, at(ms), subj, []*Policy{p}, cost)
		require.NoError(t, err)
		return d.Policies[0]
	}
	require.True(t, check(0, 80).Allowed) // the previous window holds 80
	// 15 s into the current window the estimate is 80*(1-15/60) = 60, so 30
	// more fit; then the estimate is 30 + 60 = 90 and a limit of 100 allows 10.
	require.True(t, check(75_000, 30).Allowed)
	assert.Equal(t, int64(10), check(75_000, 0).Remaining)
	assert.True(t, check(75_000, 10).Allowed)
	r := check(75_000, 1)
	assert.False(t, r.Allowed)
	// One more fits when 80*(60-e)/60 <= 100-40-1 = 59, at e = 15.75 s.
	assert.Equal(t, 750*time.Millisecond, r.RetryAfter)
}
