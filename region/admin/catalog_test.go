package admin_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/region/admin"
)

func policyRecord(id string, version int64, rate int, author string, ms int64) admin.Record {
	doc := fmt.Sprintf(`{"id":%q,"version":%d,"algorithm":"token_bucket","rate_per_sec":%d,"mode":"shadow"}`, id, version, rate)
	return admin.Record{Kind: admin.KindPolicy, ID: id, Version: version, Document: []byte(doc), Author: author, UnixMs: ms}
}

// TestCatalogOrderIndependent: any order of any records, with duplicates
// and two concurrent writers of one version, gives the same versions in
// force, the same history and the same generation.
func TestCatalogOrderIndependent(t *testing.T) {
	recs := []admin.Record{
		policyRecord("a", 1, 1, "alice", 1), policyRecord("a", 2, 2, "alice", 2), policyRecord("a", 3, 3, "alice", 3),
		policyRecord("b", 1, 5, "eu-op", 10), policyRecord("b", 1, 6, "us-op", 10), // conflict: us-op sorts last
		{Kind: admin.KindPolicy, ID: "c", Version: 1, Document: []byte(`{"id":"c","version":1,"algorithm":"token_bucket","rate_per_sec":1}`), Author: "x", UnixMs: 1},
		{Kind: admin.KindPolicy, ID: "c", Version: 2, Deleted: true, Author: "x", UnixMs: 2},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var want []string
	for trial := range 200 {
		c := admin.NewCatalog()
		order := append(append([]admin.Record(nil), recs...), recs[rng.IntN(len(recs))])
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, r := range order {
			_, err := c.Apply(r)
			require.NoError(t, err)
		}
		var got []string
		for _, e := range c.Policies() {
			got = append(got, fmt.Sprintf("%s v%d rate %g by %s", e.ID, e.Version, e.Policy.RatePerSec, e.Author))
		}
		got = append(got, fmt.Sprintf("gen %d, history of a %d", c.Generation(), len(c.History(admin.KindPolicy, "a"))))
		if trial == 0 {
			want = got
			assert.Equal(t, []string{"a v3 rate 3 by alice", "b v1 rate 6 by us-op", "gen 6, history of a 3"}, got)
		}
		require.Equal(t, want, got, "trial %d", trial)
	}
}

// TestCatalogRefusesBadRecords: a record whose document does not parse or
// does not match its key changes nothing.
func TestCatalogRefusesBadRecords(t *testing.T) {
	c := admin.NewCatalog()
	bad := []admin.Record{
		{Kind: "thing", ID: "a", Version: 1},
		{Kind: admin.KindPolicy, ID: "a", Version: 0},
		{Kind: admin.KindPolicy, ID: "a", Version: 1, Document: []byte(`{`)},
		recordAlias(policyRecord("b", 2, 1, "x", 1)).withID("a"),
		{Kind: admin.KindOverride, ID: "o", Version: 1, Document: []byte(`{"id":"o","subject":"k:a","policy":"p","expires_at":"2025-01-01T00:00:00Z"}`)},
	}
	for i, r := range bad {
		_, err := c.Apply(r)
		assert.ErrorIs(t, err, admin.ErrBadRecord, "record %d", i)
	}
	assert.Zero(t, c.Generation())
	assert.Empty(t, c.Audit(admin.AuditFilter{}))
}

// TestKeyUsage: bucket state read by a peek from the region's Redis (the
// limiter's key layout), the share the coordinator wrote, the replicated
// daily counts per region, an unreachable region reported as such, and an
// active override applied.
func TestKeyUsage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rs := redistest.StartServer(t)
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = down.Close() })
	u, err := admin.NewRedisUsage("eu", map[string]redis.UniversalClient{"eu": rs.Client(), "us": down}, 2, 300*time.Millisecond)
	require.NoError(t, err)
	e := newEnv(t, u)

	require.Equal(t, 201, e.do("PUT", "/v1/policies/g-burst", adminTok, `{"expected_version":0,"enforce":true,"policy":{"algorithm":"token_bucket","rate_per_sec":100,"burst":100,"scope":"global"}}`).status)
	require.Equal(t, 201, e.do("PUT", "/v1/policies/daily", adminTok, `{"expected_version":0,"enforce":true,"policy":{"algorithm":"fixed_window","limit":1000,"window_s":86400,"scope":"global"}}`).status)

	// Traffic through a real limiter in region eu: 7 requests.
	store := limiter.NewRedisStore(rs.Client())
	cfg := limiter.DefaultConfig()
	cfg.Store, cfg.Region, cfg.Regions, cfg.Deadline = store, "eu", 2, time.Second
	var pols []*limiter.Policy
	for _, pe := range e.cat.Policies() {
		pols = append(pols, pe.Policy)
	}
	lim, err := limiter.New(cfg, pols)
	require.NoError(t, err)
	subj := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "abc"}
	for range 7 {
		d, err := lim.Check(ctx, limiter.Request{Identity: limiter.Identity{APIKey: "abc"}, Method: "GET", Path: "/x"})
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.NoError(t, store.SetShare(ctx, subj, "g-burst", 60_000, 60_000, time.Minute))
	now := time.Now()
	day := now.Truncate(24 * time.Hour).UnixMilli()
	require.NoError(t, store.MergeWindowCount(ctx, subj, "daily", day, 86_400_000, "us", 40))

	r := e.do("GET", "/v1/keys/k:abc/usage", readTok, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var view admin.KeyUsageView
	require.NoError(t, jsonUnmarshal(r.body, &view))
	require.Len(t, view.Policies, 2)
	byID := map[string]admin.PolicyUsage{}
	for _, p := range view.Policies {
		byID[p.Policy] = p
	}
	daily := byID["daily"]
	assert.Equal(t, map[string]int64{"eu": 7, "us": 40}, daily.WindowCounts)
	assert.Equal(t, int64(1000-47), daily.Regions["eu"].Remaining)
	assert.False(t, daily.Regions["us"].Reachable)
	assert.NotEmpty(t, daily.Regions["us"].Error)
	g := byID["g-burst"]
	require.NotNil(t, g.Regions["eu"].Share)
	assert.Equal(t, 60.0, g.Regions["eu"].Share.RatePerSec)
	assert.Equal(t, int64(100), g.Regions["eu"].Limit, "limit is the global value")
	// 7 admitted under the default share (50/s, burst 50) left 43 tokens;
	// the share (60/s, burst 60) carries them and refills them at 60/s
	// (the limiter keeps tokens across rate changes), so at least 43
	// remain, and what remains is the share's burst less what 60/s
	// refills by the reset (under the default share it would be 50 less
	// 50/s of it).
	rem, reset := g.Regions["eu"].Remaining, g.Regions["eu"].ResetAfterMs
	assert.True(t, rem >= 43 && rem <= 60, "remaining %d: want the 43 tokens left, refilled at the share's rate", rem)
	missing := 60 - float64(rem) - float64(reset)*60/1000
	assert.True(t, missing > -0.1 && missing < 1.1, "remaining %d, reset %d ms: want the share's burst and rate", rem, reset)

	// An override raises the daily limit for this key only.
	r = e.do("POST", "/v1/overrides", adminTok, fmt.Sprintf(`{"subject":"k:abc","policy":"daily","limit":5000,"expires_at":%q}`, e.clock.Now().Add(time.Hour).Format(time.RFC3339)))
	require.Equal(t, 201, r.status, "%s", r.body)
	r = e.do("GET", "/v1/keys/k:abc/usage", readTok, "")
	require.NoError(t, jsonUnmarshal(r.body, &view))
	for _, p := range view.Policies {
		if p.Policy == "daily" {
			require.NotNil(t, p.Override)
			assert.Equal(t, int64(5000-47), p.Regions["eu"].Remaining)
		}
	}
}
