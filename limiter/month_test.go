package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

const dayMs = int64(86_400_000)

// msOf is the time s (RFC 3339) in ms after t0, the origin of timelines.
func msOf(t *testing.T, s string) int64 {
	t.Helper()
	tm, err := time.Parse(time.RFC3339Nano, s)
	require.NoError(t, err)
	return tm.Sub(t0).Milliseconds()
}

// monthStores runs fn on the in-memory store and, unless -short, on the
// Lua script of a real redis-server deciding at the timeline's times.
func monthStores(t *testing.T, fn func(t *testing.T, store Store)) {
	t.Run("memory", func(t *testing.T) { fn(t, NewMemoryStore()) })
	t.Run("redis", func(t *testing.T) {
		rs := NewRedisStore(redistest.StartServer(t).Client())
		rs.decideAtGivenTime()
		fn(t, rs)
	})
}

// TestMonthWindowTimeline walks a monthly fixed window across month ends:
// December to January, February in a common year (28 days) and in a leap
// year (29 days), 30- and 31-day months, and a clock that steps back over a
// month end. Reset and retry run until the next month starts.
func TestMonthWindowTimeline(t *testing.T) {
	p := mustPolicy(t, `{"id":"month","algorithm":"fixed_window","limit":3,"window":"month"}`)
	monthStores(t, func(t *testing.T, store Store) {
		runTimeline(t, store, p, []step{
			// December 2026 (31 days) into January 2027.
			{ms: msOf(t, "2026-12-01T00:00:00Z"), cost: 1, allowed: true, remaining: 2, resetMs: 31 * dayMs},
			{ms: msOf(t, "2026-12-31T23:59:59.999Z"), cost: 2, allowed: true, remaining: 0, resetMs: 1},
			{ms: msOf(t, "2026-12-31T23:59:59.999Z"), cost: 1, allowed: false, remaining: 0, retryMs: 1, resetMs: 1},
			{ms: msOf(t, "2027-01-01T00:00:00Z"), cost: 1, allowed: true, remaining: 2, resetMs: 31 * dayMs},
			// February 2027: 28 days.
			{ms: msOf(t, "2027-02-27T12:00:00Z"), cost: 2, allowed: true, remaining: 1, resetMs: dayMs + dayMs/2},
			{ms: msOf(t, "2027-02-28T23:59:59.999Z"), cost: 2, allowed: false, remaining: 1, retryMs: 1, resetMs: 1},
			{ms: msOf(t, "2027-03-01T00:00:00Z"), cost: 3, allowed: true, remaining: 0, resetMs: 31 * dayMs},
			// The clock steps back into February: still March's window, no
			// fresh quota, retry at April.
			{ms: msOf(t, "2027-02-28T23:59:59Z"), cost: 1, allowed: false, remaining: 0, retryMs: 31 * dayMs, resetMs: 31 * dayMs},
			// More than the limit: never; retry-after reports the reset.
			{ms: msOf(t, "2027-03-31T23:59:59.999Z"), cost: 4, allowed: false, remaining: 0, retryMs: -1, resetMs: 1},
			// April: 30 days.
			{ms: msOf(t, "2027-04-01T00:00:00Z"), cost: 1, allowed: true, remaining: 2, resetMs: 30 * dayMs},
			{ms: msOf(t, "2027-04-15T00:00:00Z"), cost: 0, allowed: true, remaining: 2, resetMs: 16 * dayMs}, // peek
			// February 2028: 29 days (leap year).
			{ms: msOf(t, "2028-02-01T00:00:00Z"), cost: 1, allowed: true, remaining: 2, resetMs: 29 * dayMs},
			{ms: msOf(t, "2028-02-28T23:00:00Z"), cost: 1, allowed: true, remaining: 1, resetMs: dayMs + 3_600_000},
			{ms: msOf(t, "2028-02-29T23:00:00Z"), cost: 1, allowed: true, remaining: 0, resetMs: 3_600_000},
			{ms: msOf(t, "2028-02-29T23:59:59.500Z"), cost: 1, allowed: false, remaining: 0, retryMs: 500, resetMs: 500},
			{ms: msOf(t, "2028-03-01T00:00:00.001Z"), cost: 1, allowed: true, remaining: 2, resetMs: 31*dayMs - 1},
		})
	})
}

// TestMonthWindowExpiresAtTheMonthEnd checks the in-memory store's TTL: the
// state of a month lives until the next month starts plus one second.
func TestMonthWindowExpiresAtTheMonthEnd(t *testing.T) {
	p := mustPolicy(t, `{"id":"month","algorithm":"fixed_window","limit":3,"window":"month"}`)
	store := NewMemoryStore()
	l, err := New(Config{Store: store}, []*Policy{p})
	require.NoError(t, err)
	subj := Subject{Kind: SubjectAPIKey, Value: "k"}
	check := func(s string, cost int64) {
		_, err := l.checkSubjectAt(context.Background(), at(msOf(t, s)), subj, []*Policy{p}, cost)
		require.NoError(t, err)
	}
	check("2027-02-10T00:00:00Z", 1)
	check("2027-03-01T00:00:00.999Z", 0) // sweeps; the state lives until 00:00:01
	assert.Equal(t, 1, store.Len())
	check("2027-03-01T00:00:11Z", 0) // the next sweep drops it
	assert.Equal(t, 0, store.Len())
}

// TestMonthWindowRedisTTL checks that the script keeps a month's key until
// the month ends plus one second.
func TestMonthWindowRedisTTL(t *testing.T) {
	client := redistest.StartServer(t).Client()
	rs := NewRedisStore(client)
	rs.decideAtGivenTime()
	p := mustPolicy(t, `{"id":"month","algorithm":"fixed_window","limit":3,"window":"month"}`)
	l, err := New(Config{Store: rs}, []*Policy{p})
	require.NoError(t, err)
	subj := Subject{Kind: SubjectAPIKey, Value: "k"}
	ctx := context.Background()
	_, err = l.checkSubjectAt(ctx, at(msOf(t, "2027-02-27T00:00:00Z")), subj, []*Policy{p}, 1)
	require.NoError(t, err)
	ttl, err := client.PTTL(ctx, StateKey(subj, p)).Result()
	require.NoError(t, err)
	// The key was written with PX = 2 days + 1 s + the script's slack
	// (expirySlack); the call took well under a minute of the server's
	// clock.
	want := time.Duration(2*dayMs+1000) * time.Millisecond
	assert.LessOrEqual(t, ttl, want+expirySlack)
	assert.Greater(t, ttl, want-time.Minute)
}

// TestMonthWindowReplicated runs a global monthly window on both stores:
// the decision is on the sum over regions, counts of other regions merge
// into the month they belong to (windowMs is that month's own length), a
// count for a month that has ended is dropped, and the cap bounds this
// region.
func TestMonthWindowReplicated(t *testing.T) {
	p := mustPolicy(t, `{"id":"pm","algorithm":"fixed_window","limit":100,"window":"month","scope":"global"}`)
	jan := msOf(t, "2027-01-01T00:00:00Z") + t0.UnixMilli()
	feb := msOf(t, "2027-02-01T00:00:00Z") + t0.UnixMilli()
	subj := Subject{Kind: SubjectAccount, Value: "acme"}
	ctx := context.Background()
	type stores struct {
		store  Store
		merge  func(now time.Time, ws, win int64, region string, n int64)
		setCap func(now time.Time, ws, win, c int64)
		counts func(now time.Time) WindowCounts
	}
	run := func(t *testing.T, s stores) {
		l, err := New(Config{Store: s.store, Region: "us-east", Regions: 3}, []*Policy{p})
		require.NoError(t, err)
		check := func(when string, cost int64) PolicyDecision {
			d, err := l.checkSubjectAt(ctx, at(msOf(t, when)), subj, []*Policy{p}, cost)
			require.NoError(t, err)
			return d.Policies[0]
		}
		now := func(when string) time.Time { return at(msOf(t, when)) }

		require.True(t, check("2027-01-31T23:00:00Z", 30).Allowed)
		s.merge(now("2027-01-31T23:00:00Z"), jan, 31*dayMs, "eu-west", 50)
		s.merge(now("2027-01-31T23:00:00Z"), jan, 31*dayMs, "eu-west", 40) // older news: max wins
		r := check("2027-01-31T23:00:00Z", 21)
		assert.False(t, r.Allowed)
		assert.Equal(t, int64(20), r.Remaining, "100 - 30 here - 50 in eu-west")
		assert.Equal(t, time.Hour, r.RetryAfter, "until February starts")
		assert.Equal(t, time.Hour, r.ResetAfter)

		// February (28 days): a fresh month.
		r = check("2027-02-01T00:00:00Z", 1)
		assert.True(t, r.Allowed)
		assert.Equal(t, int64(99), r.Remaining)
		assert.Equal(t, 28*24*time.Hour, r.ResetAfter)
		// A late count for January is dropped; February's counts add up.
		s.merge(now("2027-02-01T00:00:01Z"), jan, 31*dayMs, "ap-south", 99)
		s.merge(now("2027-02-01T00:00:01Z"), feb, 28*dayMs, "eu-west", 10)
		wc := s.counts(now("2027-02-01T00:00:01Z"))
		assert.Equal(t, feb, wc.StartMs)
		assert.Equal(t, map[string]int64{"us-east": 1, "eu-west": 10}, wc.Counts)
		assert.Equal(t, int64(89), check("2027-02-01T00:00:02Z", 0).Remaining)
		// The coordinator's cap for February.
		s.setCap(now("2027-02-14T00:00:00Z"), feb, 28*dayMs, 5)
		assert.Equal(t, int64(4), check("2027-02-14T00:00:00Z", 0).Remaining)
		r = check("2027-02-14T00:00:00Z", 5)
		assert.False(t, r.Allowed)
		assert.Equal(t, 15*24*time.Hour, r.RetryAfter)
		// March's first count (from a region whose clock is ahead) starts
		// March here too.
		s.merge(now("2027-02-28T23:59:59Z"), feb+28*dayMs, 31*dayMs, "eu-west", 7)
		r = check("2027-03-01T00:00:00Z", 3)
		assert.True(t, r.Allowed)
		assert.Equal(t, int64(90), r.Remaining)
	}
	t.Run("memory", func(t *testing.T) {
		m := NewMemoryStore()
		run(t, stores{
			store: m,
			merge: func(now time.Time, ws, win int64, region string, n int64) {
				m.MergeWindowCount(now, subj, p.ID, ws, win, region, n)
			},
			setCap: func(now time.Time, ws, win, c int64) { m.SetWindowCap(now, subj, p.ID, ws, win, c) },
			counts: func(now time.Time) WindowCounts { return m.WindowCounts(now, subj, p.ID) },
		})
	})
	t.Run("redis", func(t *testing.T) {
		client := redistest.StartServer(t).Client()
		rs := NewRedisStore(client)
		rs.decideAtGivenTime()
		run(t, stores{
			store: rs,
			merge: func(_ time.Time, ws, win int64, region string, n int64) {
				require.NoError(t, rs.MergeWindowCount(ctx, subj, p.ID, ws, win, region, n))
			},
			setCap: func(_ time.Time, ws, win, c int64) {
				require.NoError(t, rs.SetWindowCap(ctx, subj, p.ID, ws, win, c))
			},
			counts: func(time.Time) WindowCounts {
				wc, err := rs.WindowCounts(ctx, subj, p.ID)
				require.NoError(t, err)
				return wc
			},
		})
		// The merge expires the hash one second after its month ends, by
		// the absolute time (Redis 7: PEXPIRETIME).
		key := StateKey(subj, p)
		require.NoError(t, rs.MergeWindowCount(ctx, subj, p.ID, feb+28*dayMs, 31*dayMs, "eu-west", 8))
		exp, err := client.PExpireTime(ctx, key).Result()
		require.NoError(t, err)
		assert.Equal(t, time.Duration(feb+(28+31)*dayMs+1000)*time.Millisecond, exp)
	})
}

// TestMonthWindowFallback: while the store is down, a monthly window falls
// back to the same UTC calendar month (fallback.go: windows keep their
// windows), at the limit scaled by the failure mode like any window.
func TestMonthWindowFallback(t *testing.T) {
	p := mustPolicy(t, `{"id":"m","algorithm":"fixed_window","limit":2678400,"window":"month"}`)
	f := newFallback(10, 2, 4, 1)
	o := f.fallbackOp(p)
	assert.Equal(t, FixedWindow, o.algo)
	assert.True(t, o.monthly(), "calendar months, not 31-day windows")
	assert.Equal(t, int64(2*2678400), o.limit, "limit x 2")
	local := mustPolicy(t, `{"id":"m","algorithm":"fixed_window","limit":2678400,"window":"month","on_store_failure":"local"}`)
	o = f.fallbackOp(local)
	assert.True(t, o.monthly())
	assert.Equal(t, int64(2678400/4), o.limit, "over 4 instances")
}

// BenchmarkFixedWindowKinds compares a decision of a fixed window over a
// length (window_s 86400) with one over calendar months, on the memory
// store and on the script of a local redis-server (one caller).
func BenchmarkFixedWindowKinds(b *testing.B) {
	docs := map[string]string{
		"window_s": `{"id":"d","algorithm":"fixed_window","limit":1000000000,"window_s":86400}`,
		"month":    `{"id":"m","algorithm":"fixed_window","limit":1000000000,"window":"month"}`,
	}
	stores := map[string]func(b *testing.B) Store{
		"memory": func(*testing.B) Store { return NewMemoryStore() },
		"redis": func(b *testing.B) Store {
			return NewRedisStore(redistest.StartServer(b).Client())
		},
	}
	for _, sn := range []string{"memory", "redis"} {
		for _, kind := range []string{"window_s", "month"} {
			b.Run(sn+"/"+kind, func(b *testing.B) {
				p := mustPolicy(b, docs[kind])
				l, err := New(Config{Store: stores[sn](b)}, []*Policy{p})
				require.NoError(b, err)
				ctx := context.Background()
				subj := Subject{Kind: SubjectAPIKey, Value: "bench"}
				now := time.Now()
				b.ResetTimer()
				for i := range b.N {
					if _, err := l.checkSubjectAt(ctx, now.Add(time.Duration(i)*time.Millisecond), subj, []*Policy{p}, 1); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
