package limiter

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// subjectStateEntry is op o's entry in its subject's key in Redis (nil
// when there is none), expired or not.
func subjectStateEntry(t *testing.T, client redis.UniversalClient, subj Subject, o *op) *subjectEntry {
	t.Helper()
	key := subjectKey(subj.Key())
	v, err := client.Get(context.Background(), key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	require.NoError(t, err, key)
	entries, err := parseSubjectState(v)
	require.NoError(t, err, key)
	for i := range entries {
		if entries[i].algo == algoCode(o) && entries[i].policy == o.policy {
			return &entries[i]
		}
	}
	return nil
}

// policyStateValue is the state of policy p for subj in Redis in the
// encoding of the layout of one key per policy (a bucket's 12 bytes,
// "start:count" for a fixed window, "start:current:previous" for a
// sliding window counter), or false when there is none; for the
// policies that keep a key of their own, that key's string value.
func policyStateValue(t *testing.T, client redis.UniversalClient, subj Subject, p *Policy) (string, bool) {
	t.Helper()
	o := op{algo: p.Algorithm, global: p.Scope == ScopeGlobal, policy: p.ID}
	if !o.inSubjectState() {
		v, err := client.Get(context.Background(), StateKey(subj, p)).Result()
		if errors.Is(err, redis.Nil) {
			return "", false
		}
		require.NoError(t, err)
		return v, true
	}
	e := subjectStateEntry(t, client, subj, &o)
	if e == nil {
		return "", false
	}
	switch o.algo {
	case TokenBucket, LeakyBucket:
		return string(packBucket(e.st)), true
	case FixedWindow:
		return fmt.Sprintf("%d:%d", e.st.a, e.st.b), true
	}
	return fmt.Sprintf("%d:%d:%d", e.st.a, e.st.b, e.st.c), true
}

// packBucket is the 12 bytes of a bucket state (unpackBucket's inverse).
func packBucket(st state) []byte {
	u := uint64(st.a + 1<<51)
	h, l := uint64(st.b)*16+u>>48, u&(1<<48-1)
	b := make([]byte, 12)
	for i := range 6 {
		b[5-i] = byte(h >> (8 * i))
		b[11-i] = byte(l >> (8 * i))
	}
	return b
}

// packEntry is one entry of a subject state (subjectstate.go) with the
// state's bytes st.
func packEntry(algo byte, policy string, expireMs int64, st []byte) []byte {
	b := append([]byte{algo, byte(len(policy))}, policy...)
	b = append(b, byte(expireMs>>40), byte(expireMs>>32), byte(expireMs>>24), byte(expireMs>>16), byte(expireMs>>8), byte(expireMs))
	return append(b, st...)
}

// subjectPolicies: a token bucket, a daily fixed window and an hourly
// sliding window counter, all of one subject's key.
func subjectPolicies(t *testing.T) []*Policy {
	return []*Policy{
		mustPolicy(t, `{"id":"b","algorithm":"token_bucket","rate_per_sec":0.001,"burst":10}`),
		mustPolicy(t, `{"id":"d","algorithm":"fixed_window","limit":10,"window_s":86400}`),
		mustPolicy(t, `{"id":"s","algorithm":"sliding_window_counter","limit":10,"window_s":3600}`),
	}
}

// TestSubjectStateKeepsPoliciesNotNamed: a request that names only some
// of a subject's policies rewrites their entries and copies the others
// byte for byte; the key lives as long as the longest-lived entry needs.
func TestSubjectStateKeepsPoliciesNotNamed(t *testing.T) {
	client := redistest.StartServer(t).Client()
	rs := NewRedisStore(client)
	rs.decideAtGivenTime()
	ps := subjectPolicies(t)
	l, err := New(Config{Store: rs}, ps)
	require.NoError(t, err)
	ctx := context.Background()
	subj := Subject{Kind: SubjectAPIKey, Value: "k"}
	_, err = l.checkSubjectAt(ctx, at(1_000), subj, ps, 1)
	require.NoError(t, err)
	keys, err := client.Keys(ctx, "*").Result()
	require.NoError(t, err)
	require.Equal(t, []string{"rl:{k:k}"}, keys, "one key holds the three policies")
	d0, ok := policyStateValue(t, client, subj, ps[1])
	require.True(t, ok)
	s0, ok := policyStateValue(t, client, subj, ps[2])
	require.True(t, ok)
	for i := range 3 {
		d, err := l.checkSubjectAt(ctx, at(2_000+int64(i)), subj, ps[:1], 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		assert.Equal(t, int64(8-i), d.Policies[0].Remaining)
	}
	d1, ok := policyStateValue(t, client, subj, ps[1])
	require.True(t, ok)
	s1, ok := policyStateValue(t, client, subj, ps[2])
	require.True(t, ok)
	assert.Equal(t, d0, d1, "the daily window, not named, is unchanged")
	assert.Equal(t, s0, s1, "the sliding counter, not named, is unchanged")
	d, err := l.checkSubjectAt(ctx, at(3_000), subj, ps[1:], 1)
	require.NoError(t, err)
	assert.Equal(t, int64(8), d.Policies[0].Remaining, "the daily window counts on")
	assert.Equal(t, int64(8), d.Policies[1].Remaining, "the sliding counter counts on")
	v, err := client.Get(ctx, "rl:{k:k}").Bytes()
	require.NoError(t, err)
	entries, err := parseSubjectState(v)
	require.NoError(t, err)
	require.Len(t, entries, 3)
	var latest int64
	for _, e := range entries {
		latest = max(latest, e.expireMs)
	}
	// The daily window's entry: until the day ends (t0 is a midnight),
	// plus a second; the key carries that expiry as its TTL.
	assert.Equal(t, at(86_400_000+1_000).UnixMilli(), latest)
	ttl, err := client.PTTL(ctx, "rl:{k:k}").Result()
	require.NoError(t, err)
	// Written with PX = that expiry - the decision's time; read at once.
	want := time.Duration(86_400_000+1_000-3_000) * time.Millisecond
	assert.LessOrEqual(t, ttl, want, "the key's TTL is the latest expiry")
	assert.Greater(t, ttl, want-time.Minute, "the key's TTL is the latest expiry")
}

// TestSubjectStateEntryExpires: on Redis's own clock, an entry past its
// expiry is no state (as a key of its own past its TTL would be), even
// while the key lives on for another policy's entry, and the next write
// drops it; the live entry is copied byte for byte.
func TestSubjectStateEntryExpires(t *testing.T) {
	client := redistest.StartServer(t).Client()
	rs := NewRedisStore(client)
	ps := subjectPolicies(t)
	l, err := New(Config{Store: rs}, ps)
	require.NoError(t, err)
	ctx := context.Background()
	subj := Subject{Kind: SubjectAPIKey, Value: "k"}
	now := redisNow(t, client).UnixMilli()
	// The bucket: empty a second ago, at 0.001/s (1 milli-token/s), so a
	// state read as live holds no token; its entry expired 1 ms ago.
	empty := packBucket(state{a: 0, b: now - 1_000})
	// The daily window: 4 counted, live for a minute.
	start := now - now%86_400_000
	day := make([]byte, 13)
	for i := range 6 {
		day[5-i] = byte(start >> (8 * i))
	}
	day[12] = 4
	live := packEntry(3, "d", now+60_000, day)
	v := append(packEntry(1, "b", now-1, empty), live...)
	require.NoError(t, client.Set(ctx, "rl:{k:k}", v, time.Minute).Err())

	d, err := l.checkSubjectAt(ctx, time.Now(), subj, ps[:1], 1)
	require.NoError(t, err)
	require.True(t, d.Allowed, "the expired bucket is full again")
	assert.Equal(t, int64(9), d.Policies[0].Remaining)
	got, err := client.Get(ctx, "rl:{k:k}").Bytes()
	require.NoError(t, err)
	entries, err := parseSubjectState(got)
	require.NoError(t, err)
	require.Len(t, entries, 2, "the expired entry was replaced, not kept beside the new one")
	assert.Equal(t, live, got[:len(live)], "the live entry is copied as it was")
	d, err = l.checkSubjectAt(ctx, time.Now(), subj, ps[1:2], 0)
	require.NoError(t, err)
	assert.Equal(t, int64(6), d.Policies[0].Remaining, "the daily window counts on from its entry")
}

// TestSubjectStateUpgradeFromKeyPerPolicy: a subject whose states are in
// the layout before (one key per policy, written by a gateway of an
// older version) is decided from them; the first write moves them into
// the subject's key and leaves the old keys as they were (they expire by
// their own TTL); a refund of that first write gives back exactly (a
// bucket's entry is removed, so the old key counts again).
func TestSubjectStateUpgradeFromKeyPerPolicy(t *testing.T) {
	client := redistest.StartServer(t).Client()
	rs := NewRedisStore(client)
	rs.decideAtGivenTime()
	ps := subjectPolicies(t)[:2]
	l, err := New(Config{Store: rs}, ps)
	require.NoError(t, err)
	ctx := context.Background()
	subj := Subject{Kind: SubjectAPIKey, Value: "k"}
	oldBucket, oldDay := stateKey(subj.Key(), "b", "tb"), stateKey(subj.Key(), "d", "fw")
	// 3 tokens at t0 (0.001/s: nothing refills in these seconds); 7 counted today.
	bucket := string(packBucket(state{a: 3 * nano, b: at(0).UnixMilli()}))
	day := fmt.Sprintf("%d:7", at(0).UnixMilli())
	require.NoError(t, client.Set(ctx, oldBucket, bucket, time.Hour).Err())
	require.NoError(t, client.Set(ctx, oldDay, day, time.Hour).Err())

	// A first write, refunded: the entries go, the old states count again.
	ops := []op{l.opFor(ps[0], 1), l.opFor(ps[1], 1)}
	ri := &refundInfo{r: make([][5]int64, 2), wrote: make([]bool, 2)}
	ok, _, err := rs.evalCall(ctx, at(1_000), []Subject{subj, subj}, ops, make([]result, 2), ri)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, rs.refund(ctx, at(1_001), subj, ops, ri, 0, ri.nowUs))
	_, ok = policyStateValue(t, client, subj, ps[0])
	assert.False(t, ok, "the refund removed the bucket's entry moved from the old key")
	v, ok := policyStateValue(t, client, subj, ps[1])
	require.True(t, ok)
	assert.Equal(t, day, v, "the refund gave the window's cost back: its old count")

	for i, want := range []int64{2, 1} {
		d, err := l.checkSubjectAt(ctx, at(2_000+int64(i)), subj, ps, 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		assert.Equal(t, want, d.Policies[0].Remaining, "the bucket goes on from the old key's 3 tokens")
		assert.Equal(t, want, d.Policies[1].Remaining, "the window goes on from the old key's 7")
	}
	for key, want := range map[string]string{oldBucket: bucket, oldDay: day} {
		v, err := client.Get(ctx, key).Result()
		require.NoError(t, err)
		assert.Equal(t, want, v, "%s is left as it was", key)
	}
}
