package limiter

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

const usagePolicies = `[
 {"id":"g","algorithm":"token_bucket","rate_per_sec":1,"burst":2,"scope":"global","cost":{"POST /export":2}},
 {"id":"local","algorithm":"token_bucket","rate_per_sec":100,"burst":100}
]`

func TestUsageCountsDemandAndAdmittedPerEpoch(t *testing.T) {
	clock := newManualClock() // 2026-01-02T03:04:05Z: 5 s into a 10 s epoch
	l, err := New(Config{Clock: clock}, mustPolicies(t, usagePolicies))
	require.NoError(t, err)
	ctx := context.Background()
	check := func(key, method, path string) {
		_, err := l.Check(ctx, Request{Identity: Identity{APIKey: key}, Method: method, Path: path})
		require.NoError(t, err)
	}
	check("a", "GET", "/")        // admitted 1
	check("a", "POST", "/export") // cost 2 > 1 left: rejected
	check("a", "GET", "/")        // admitted 1
	check("b", "POST", "/export") // admitted 2
	_, err = l.Check(ctx, Request{Identity: Identity{APIKey: "a"}, Method: "GET", Path: "/", Peek: true})
	require.NoError(t, err)
	clock.Advance(5 * time.Second) // next epoch
	check("a", "GET", "/")         // 5 s refill: admitted

	e0 := clock.Now().UnixMilli()/10_000 - 1
	got := l.usage.take()
	assert.Equal(t, []UsageCount{
		{Epoch: e0, PolicyID: "g", Subject: Subject{Kind: SubjectAPIKey, Value: "a"}, Demand: 4, Admitted: 2},
		{Epoch: e0, PolicyID: "g", Subject: Subject{Kind: SubjectAPIKey, Value: "b"}, Demand: 2, Admitted: 2},
		{Epoch: e0 + 1, PolicyID: "g", Subject: Subject{Kind: SubjectAPIKey, Value: "a"}, Demand: 1, Admitted: 1},
	}, got, "peeks and region policies are not counted")
	assert.Empty(t, l.usage.take(), "take empties")
}

func TestUsageMemoryIsBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	l, err := New(Config{UsageMaxKeys: 10, Metrics: reg}, mustPolicies(t, usagePolicies))
	require.NoError(t, err)
	for i := range 50 {
		_, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: string(rune('A' + i))}, Method: "GET", Path: "/"})
		require.NoError(t, err)
	}
	assert.Len(t, l.usage.take(), 10)
	assert.Equal(t, 40.0, gatherValue(t, reg, "quotient_limiter_usage_dropped_total", nil))
}

func TestParseSubjectKeyInvertsKey(t *testing.T) {
	for _, s := range []Subject{
		{Kind: SubjectAPIKey, Value: "plain-key_1.2"},
		{Kind: SubjectAccount, Value: "a}b{c d%e\x00\xff:"},
		{Kind: SubjectUser, Value: "ü"},
		{Kind: SubjectIP, Value: "2001:db8::/64"},
		{Kind: SubjectDescriptor, Value: "api/tenant=acme%2F1"},
	} {
		got, err := ParseSubjectKey(s.Key())
		require.NoError(t, err, s.Key())
		assert.Equal(t, s, got)
		assert.True(t, validSubjectKey(s.Key()), "CollectUsageTotals accepts %s", s.Key())
	}
	for _, bad := range []string{"", "x:1", "k", "k:%4", "k:%zz", "k:a b", "k:%61"} {
		_, err := ParseSubjectKey(bad)
		assert.Error(t, err, bad)
	}
}

func usageLimiter(t *testing.T, clock Clock, reg prometheus.Registerer) *Limiter {
	t.Helper()
	l, err := New(Config{Clock: clock, Metrics: reg}, mustPolicies(t, usagePolicies))
	require.NoError(t, err)
	return l
}

func hammer(t *testing.T, l *Limiter, keys ...string) {
	t.Helper()
	for _, k := range keys {
		for range 3 {
			_, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: k}, Method: "GET", Path: "/"})
			require.NoError(t, err)
		}
	}
}

// wallClock is a manual clock at the current time: usage keys expire at
// absolute times, which Redis compares with its own clock.
func wallClock() *manualClock { return &manualClock{t: time.Now()} }

func testUsageRoundTrip(t *testing.T, client redis.UniversalClient) {
	clock := wallClock()
	l := usageLimiter(t, clock, nil)
	sink := NewRedisUsageSink(client, 8, 10*time.Second, 3)
	f := NewUsageFlusher(l, sink, UsageFlusherConfig{})
	ctx := context.Background()
	keys := []string{"a", "b", "odd {key}", "\xff\x00"}
	hammer(t, l, keys...)
	require.NoError(t, f.Flush(ctx, clock.Now()))
	hammer(t, l, keys...) // a second flush adds to the same fields
	require.NoError(t, f.Flush(ctx, clock.Now()))

	epoch := clock.Now().UnixMilli() / 10_000
	got, err := CollectUsage(ctx, client, epoch, 8)
	require.NoError(t, err)
	require.Len(t, got, len(keys))
	for _, u := range got {
		assert.Equal(t, "g", u.PolicyID)
		assert.Equal(t, int64(6), u.Demand, u.Subject.Value)
		assert.Equal(t, int64(2), u.Admitted, "burst 2, frozen clock: %q", u.Subject.Value)
	}
	ttl, err := client.PTTL(ctx, UsageKey(epoch, usageShard("g", Subject{Kind: SubjectAPIKey, Value: "a"}.Key(), 8))).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, 25*time.Second, "expires at the end of epoch+3")
	assert.LessOrEqual(t, ttl, 40*time.Second)

	other, err := CollectUsage(ctx, client, epoch+1, 8)
	require.NoError(t, err)
	assert.Empty(t, other)
}

func TestUsageRoundTripStandalone(t *testing.T) {
	srv := redistest.StartServer(t)
	testUsageRoundTrip(t, srv.Client())
}

func TestUsageRoundTripCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	testUsageRoundTrip(t, c.Client())
}

func TestUsageFlushFailureKeepsCounts(t *testing.T) {
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	clock := wallClock()
	reg := prometheus.NewRegistry()
	l := usageLimiter(t, clock, reg)
	f := NewUsageFlusher(l, NewRedisUsageSink(client, 4, 10*time.Second, 3), UsageFlusherConfig{Timeout: 2 * time.Second})
	ctx := context.Background()

	srv.Stop()
	hammer(t, l, "a", "b")
	require.ErrorIs(t, f.Flush(ctx, clock.Now()), ErrStoreUnavailable)
	assert.Equal(t, 1.0, gatherValue(t, reg, "quotient_limiter_usage_flush_errors_total", nil))
	hammer(t, l, "a")

	srv.Restart(t)
	require.NoError(t, f.Flush(ctx, clock.Now()))
	got, err := CollectUsage(ctx, client, clock.Now().UnixMilli()/10_000, 4)
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, int64(6), got[0].Demand, "the failed flush was retried and merged with newer counts")
	assert.Equal(t, int64(3), got[1].Demand)

	// Counts too old for any coordinator are dropped, and counted, not kept.
	srv.Stop()
	hammer(t, l, "c")
	require.Error(t, f.Flush(ctx, clock.Now()))
	clock.Advance(30 * time.Second)
	require.Error(t, f.Flush(ctx, clock.Now()), "nothing new, nothing pending? the pending count is retried")
	assert.Equal(t, 1.0, gatherValue(t, reg, "quotient_limiter_usage_dropped_total", nil))
	assert.Empty(t, l.usage.take())
}

// recordingSink remembers what it was given.
type recordingSink struct {
	mu     sync.Mutex
	counts []UsageCount
	calls  int
}

func (s *recordingSink) WriteUsage(_ context.Context, counts []UsageCount) ([]UsageCount, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	s.counts = append(s.counts, counts...)
	return nil, nil
}

func TestUsageFlusherTicksEverySecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := New(Config{}, mustPolicies(t, usagePolicies))
		require.NoError(t, err)
		sink := &recordingSink{}
		f := NewUsageFlusher(l, sink, UsageFlusherConfig{})
		f.Start()
		hammer(t, l, "a")
		time.Sleep(1500 * time.Millisecond) // virtual time
		synctest.Wait()
		sink.mu.Lock()
		assert.Equal(t, 1, sink.calls)
		assert.Len(t, sink.counts, 1)
		sink.mu.Unlock()
		hammer(t, l, "b")
		f.Stop() // flushes what is left
		sink.mu.Lock()
		assert.Len(t, sink.counts, 2)
		sink.mu.Unlock()
	})
}

// TestCollectUsageTotals: totals per (policy, subject key), merged over flushes and over demand-only and admitted-only writes, with
// unparsable fields skipped and named; CollectUsage returns the same totals
// with decoded subjects, sorted.
func TestCollectUsageTotals(t *testing.T) {
	client := redistest.StartServer(t).Client()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	const shards = 4
	epoch := time.Now().UnixMilli() / 1000 // keys expire at absolute times
	sink := NewRedisUsageSink(client, shards, time.Second, 60)
	key := Subject{Kind: SubjectAPIKey, Value: "a b%"}
	user := Subject{Kind: SubjectUser, Value: "u1"}
	ip := Subject{Kind: SubjectIP, Value: "10.0.0.0/8"}
	for range 2 {
		failed, err := sink.WriteUsage(ctx, []UsageCount{
			{Epoch: epoch, PolicyID: "g", Subject: user, Demand: 5, Admitted: 3},
			{Epoch: epoch, PolicyID: "g", Subject: key, Demand: 4},
			{Epoch: epoch, PolicyID: "h", Subject: ip, Admitted: 1},
			{Epoch: epoch + 1, PolicyID: "g", Subject: user, Demand: 9},
		})
		require.NoError(t, err)
		require.Empty(t, failed)
	}
	// Split-layout fields in a packed hash, subjects that do not parse,
	// a negative packed value, a wide field without a policy and a field
	// of an unknown kind.
	bad := []string{"x:g:k:a", "d:g", "d:g:k:a b", "d:g:z:a", "d:g:k:%4", "d:g:k:%41", "#d::k:a", "#x:k:a"}
	for _, f := range bad {
		require.NoError(t, client.HSet(ctx, UsageKey(epoch, 0), f, 1).Err())
	}
	require.NoError(t, client.HSet(ctx, UsageKey(epoch, 0), "g:k:neg", -1).Err())
	require.NoError(t, client.HSet(ctx, UsageKey(epoch, 1), "a:g:k:ok", "x1").Err()) // value not a number

	got, err := CollectUsageTotals(ctx, client, epoch, shards)
	require.ErrorIs(t, err, ErrBadUsage)
	assert.ErrorContains(t, err, `10 unparsable fields, first "#d::k:a"`)
	assert.ElementsMatch(t, []UsageTotal{
		{PolicyID: "g", SubjectKey: "k:a%20b%25", Demand: 8},
		{PolicyID: "g", SubjectKey: "u:u1", Demand: 10, Admitted: 6},
		{PolicyID: "h", SubjectKey: "ip:10.0.0.0/8", Admitted: 2},
	}, got)

	counts, err := CollectUsage(ctx, client, epoch, shards)
	require.ErrorIs(t, err, ErrBadUsage)
	assert.Equal(t, []UsageCount{
		{Epoch: epoch, PolicyID: "g", Subject: key, Demand: 8},
		{Epoch: epoch, PolicyID: "g", Subject: user, Demand: 10, Admitted: 6},
		{Epoch: epoch, PolicyID: "h", Subject: ip, Admitted: 2},
	}, counts)

	none, err := CollectUsageTotals(ctx, client, epoch+2, shards)
	require.NoError(t, err)
	assert.Empty(t, none)
}
