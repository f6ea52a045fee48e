package limiter

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const denyPolicies = `[
 {"id":"tb","algorithm":"token_bucket","rate_per_sec":1,"burst":3,"cost":{"POST /big":3}},
 {"id":"global","algorithm":"token_bucket","rate_per_sec":100,"burst":100,"scope":"global"},
 {"id":"shadow","algorithm":"fixed_window","limit":1,"window_s":60,"mode":"shadow"}
]`

func TestDenyCacheRejectsLocallyUntilRetry(t *testing.T) {
	clock := newManualClock()
	store := newFlakyStore()
	l, err := New(Config{Store: store, Clock: clock}, mustPolicies(t, denyPolicies))
	require.NoError(t, err)
	ctx := context.Background()
	small := Request{Identity: Identity{APIKey: "abuser"}, Method: "GET", Path: "/"}
	big := Request{Identity: Identity{APIKey: "abuser"}, Method: "POST", Path: "/big"}

	for range 3 {
		d, err := l.Check(ctx, small)
		require.NoError(t, err)
		require.True(t, d.Allowed, "shadow policies never reject")
	}
	d, err := l.Check(ctx, small)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, SourceStore, d.Source)
	require.Equal(t, time.Second, d.RetryAfter())
	calls := store.calls.Load()

	clock.Advance(400 * time.Millisecond)
	d, err = l.Check(ctx, small)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, SourceDenyCache, d.Source)
	assert.Equal(t, 600*time.Millisecond, d.RetryAfter(), "the store's retry time, counted down")
	require.Len(t, d.Policies, 1, "only the cached policy is reported")
	assert.Equal(t, "tb", d.Policies[0].Policy.ID)
	assert.Equal(t, int64(3), d.Policies[0].Limit)

	d, err = l.Check(ctx, big)
	require.NoError(t, err)
	assert.Equal(t, SourceDenyCache, d.Source, "a larger cost is rejected too")
	assert.Equal(t, calls, store.calls.Load(), "no store call")

	clock.Advance(600 * time.Millisecond)
	d, err = l.Check(ctx, small)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "after the retry time the store decides again")
	assert.Equal(t, SourceStore, d.Source)
	assert.Equal(t, calls+1, store.calls.Load())

	// A big rejection caches cost 3; a smaller cost still goes to the store.
	d, err = l.Check(ctx, big)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, SourceStore, d.Source)
	clock.Advance(1100 * time.Millisecond) // one token now
	d, err = l.Check(ctx, small)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, SourceStore, d.Source)

	// Demand from every path is counted for the global policy.
	counts := l.usage.take()
	require.Len(t, counts, 1)
	assert.Equal(t, "global", counts[0].PolicyID)
	assert.Equal(t, int64(9), counts[0].Demand, "nine attempts of cost 1 (the global policy has no cost table)")
	assert.Equal(t, int64(5), counts[0].Admitted)
}

func TestDenyCacheIsClearedBySetPolicies(t *testing.T) {
	clock := newManualClock()
	store := newFlakyStore()
	ps := mustPolicies(t, denyPolicies)
	l, err := New(Config{Store: store, Clock: clock}, ps)
	require.NoError(t, err)
	req := Request{Identity: Identity{APIKey: "k"}, Method: "POST", Path: "/big"}
	d, _ := l.Check(context.Background(), req)
	require.True(t, d.Allowed)
	d, _ = l.Check(context.Background(), req)
	require.False(t, d.Allowed)
	require.Equal(t, 1, l.deny.len())
	require.NoError(t, l.SetPolicies(ps))
	assert.Zero(t, l.deny.len())
}

func TestDenyCacheIsBounded(t *testing.T) {
	c := newDenyCache(64)
	now := int64(1000)
	for i := range 10_000 {
		c.add(denyKey{policy: "p", kind: SubjectAPIKey, value: strconv.Itoa(i)}, denyEntry{until: now + 10, cost: 1}, now)
	}
	assert.LessOrEqual(t, c.len(), 64)
	// Expired entries make room.
	c.add(denyKey{policy: "p", kind: SubjectAPIKey, value: "late"}, denyEntry{until: now + 100, cost: 1}, now+50)
	_, ok := c.lookup(denyKey{policy: "p", kind: SubjectAPIKey, value: "late"}, 1, now+60)
	assert.True(t, ok)
}

func TestDenyCacheKeysDoNotCollide(t *testing.T) {
	c := newDenyCache(100)
	c.add(denyKey{policy: "p", kind: SubjectAPIKey, value: "x"}, denyEntry{until: 100, cost: 1}, 0)
	for _, k := range []denyKey{
		{policy: "p", kind: SubjectAccount, value: "x"},
		{policy: "q", kind: SubjectAPIKey, value: "x"},
		{policy: "p", kind: SubjectAPIKey, value: "x "},
	} {
		_, ok := c.lookup(k, 1, 50)
		assert.False(t, ok, "%+v", k)
	}
}

// BenchmarkDenyCacheHit is one Check of an abusive key that the deny cache
// answers, with a pooled Decision: the target is <= 1 µs and 0 allocs.
func BenchmarkDenyCacheHit(b *testing.B) {
	clock := newManualClock()
	store := newFlakyStore()
	l, err := New(Config{Store: store, Clock: clock, EventSampleRate: -1}, mustPolicies(b, `[{"id":"tb","algorithm":"token_bucket","rate_per_sec":1,"burst":1}]`))
	require.NoError(b, err)
	req := Request{Identity: Identity{APIKey: "abuser-0123456789"}, Method: "GET", Path: "/v1/things"}
	ctx := context.Background()
	now := clock.Now()
	var d Decision
	for range 3 {
		require.NoError(b, l.CheckInto(ctx, now, req, &d))
	}
	require.Equal(b, SourceDenyCache, d.Source)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		_ = l.CheckInto(ctx, now, req, &d)
	}
	b.StopTimer()
	require.Equal(b, SourceDenyCache, d.Source)
}

// BenchmarkDenyCacheLookup is the bare cache lookup.
func BenchmarkDenyCacheLookup(b *testing.B) {
	c := newDenyCache(1000)
	k := denyKey{policy: "policy-id", kind: SubjectAPIKey, value: "abuser-0123456789"}
	c.add(k, denyEntry{until: 1 << 62, cost: 1}, 0)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := c.lookup(k, 1, 1); !ok {
			b.Fatal("miss")
		}
	}
}

// TestDenyCacheGivesAGrownShareItsTurn: a region's share of a global
// policy grows at the coordinator's decision, which the gateway does not
// see, so a rejection of a global policy answers locally for at most a
// tenth of the usage epoch, 1 s by default (Retry-After still the
// store's). Without the bound a floor share
// (one request, almost no refill) kept rejecting locally for its whole
// retry time after the share grew.
func TestDenyCacheGivesAGrownShareItsTurn(t *testing.T) {
	clock := newManualClock()
	store := newFlakyStore()
	l, err := New(Config{Store: store, Clock: clock, Regions: 3}, mustPolicies(t, `[{"id":"g","algorithm":"token_bucket","rate_per_sec":30,"burst":30,"scope":"global"}]`))
	require.NoError(t, err)
	ctx := context.Background()
	subj := Subject{Kind: SubjectAPIKey, Value: "k"}
	req := Request{Identity: Identity{APIKey: "k"}, Method: "GET", Path: "/"}
	store.mem.SetShare(clock.Now(), subj, "g", 1, 1000, time.Hour) // the floor: one request, 0.001/s
	d, err := l.Check(ctx, req)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = l.Check(ctx, req)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, SourceStore, d.Source)
	require.Greater(t, d.RetryAfter(), time.Minute)

	store.mem.SetShare(clock.Now(), subj, "g", 20_000, 20_000, time.Hour) // the decision grows it
	clock.Advance(500 * time.Millisecond)
	d, err = l.Check(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, SourceDenyCache, d.Source, "within the bound the cache still answers")
	assert.Greater(t, d.RetryAfter(), time.Minute, "with the store's retry time")
	clock.Advance(600 * time.Millisecond)
	d, err = l.Check(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, SourceStore, d.Source, "after a second the store decides")
	assert.True(t, d.Allowed, "with the grown share")
}

// TestFallbackKeepsTheStoresLastRejection: a global daily window the store
// found spent stays spent while the store cannot answer. Before, the
// fallback started an empty in-process window at limit x OpenFactor per
// gateway instance once the deny entry's tenth-of-an-epoch bound had
// passed, so a store that timed out under load re-opened a spent daily
// quota (the e2e run at load 30 admitted 3 903 of a global 2 000). The
// store's retry time bounds the rejection; subjects the store had not
// rejected still get the fallback; a new window gets the fallback again.
func TestFallbackKeepsTheStoresLastRejection(t *testing.T) {
	clock := newManualClock()
	store := newFlakyStore()
	l, err := New(Config{Store: store, Clock: clock, Regions: 3}, mustPolicies(t,
		`[{"id":"day","algorithm":"fixed_window","limit":3,"window_s":86400,"scope":"global"}]`))
	require.NoError(t, err)
	ctx := context.Background()
	spent := Request{Identity: Identity{APIKey: "spent"}, Method: "GET", Path: "/"}
	other := Request{Identity: Identity{APIKey: "other"}, Method: "GET", Path: "/"}
	for range 3 {
		d, err := l.Check(ctx, spent)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	d, err := l.Check(ctx, spent)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, SourceStore, d.Source)
	dayEnd := clock.Now().Truncate(24 * time.Hour).Add(24 * time.Hour)
	require.InDelta(t, dayEnd.Sub(clock.Now()).Seconds(), d.RetryAfter().Seconds(), 1, "the store's retry time is the window's end")

	store.failing.Store(true)
	clock.Advance(5 * time.Second) // past the entry's bound while the store is up (1 s)
	calls := store.calls.Load()
	d, err = l.Check(ctx, spent)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "the store's rejection stands while it cannot answer")
	assert.Equal(t, SourceFallback, d.Source, "decided without the store")
	require.Len(t, d.Policies, 1)
	assert.Equal(t, SourceDenyCache, d.Policies[0].Source, "from the store's last answer")
	assert.InDelta(t, dayEnd.Sub(clock.Now()).Seconds(), d.RetryAfter().Seconds(), 1, "with the store's retry time")
	assert.Equal(t, calls+1, store.calls.Load(), "the store was asked first (it failed)")

	d, err = l.Check(ctx, other)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "a subject the store had not rejected gets the fallback")
	assert.Equal(t, SourceFallback, d.Source)
	assert.Equal(t, SourceFallback, d.Policies[0].Source)

	clock.Advance(dayEnd.Sub(clock.Now()) + time.Second) // the next UTC day
	d, err = l.Check(ctx, spent)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "a new window: the fallback decides")
	assert.Equal(t, SourceFallback, d.Policies[0].Source)

	store.failing.Store(false)
	d, err = l.Check(ctx, spent)
	require.NoError(t, err)
	assert.Equal(t, SourceStore, d.Source, "the store decides again once it answers")
}
