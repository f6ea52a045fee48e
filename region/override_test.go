package region

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/region/admin"
	"github.com/quotientlabs/quotient/region/policysync"
)

// TestOverrideLimitAgreesWithTheGateway: the limit the coordinator computes
// shares from for an overridden subject (policySet.SubjectLimit, the
// rebalancer's lookup) is the one a gateway enforces for it: the same
// catalog goes through the region's Redis snapshot (a real redis-server)
// to a Reloader, whose Override the limiter applies. Both give the
// override's rate and burst (also when the override sets only the rate
// and the burst follows it), both drop it at its expiry, and then the
// coordinator uses the policy's limit.
func TestOverrideLimitAgreesWithTheGateway(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	cat := admin.NewCatalog()
	doc := `{"id":"g","version":1,"algorithm":"token_bucket","rate_per_sec":300,"burst":600,"scope":"global"}`
	_, err := cat.Apply(admin.Record{Kind: admin.KindPolicy, ID: "g", Version: 1, Document: []byte(doc), Author: "ops", UnixMs: now.UnixMilli()})
	require.NoError(t, err)
	for _, o := range []admin.Override{
		{Subject: "k:abuser", Policy: "g", RatePerSec: 30, Burst: 60, ExpiresAt: now.Add(time.Hour)},
		{Subject: "k:big", Policy: "g", RatePerSec: 900, ExpiresAt: now.Add(2 * time.Hour)},
	} {
		rec, _, err := cat.PrepareOverride(o, "ops", now)
		require.NoError(t, err)
		_, err = cat.Apply(rec)
		require.NoError(t, err)
	}
	ps := newPolicySet(nil, cat, 3)

	rs := redistest.StartServer(t)
	_, err = policysync.WriteSnapshot(ctx, rs.Client(), policysync.SnapshotOf(cat))
	require.NoError(t, err)
	lim, err := limiter.New(limiter.DefaultConfig(), nil)
	require.NoError(t, err)
	r, err := policysync.NewReloader(policysync.ReloaderConfig{Client: rs.Client(), Target: lim})
	require.NoError(t, err)
	require.NoError(t, r.Load(ctx))

	base, ok := ps.Limit("g")
	require.True(t, ok)
	for _, tc := range []struct {
		key     string
		at      time.Time
		applies bool
	}{
		{"abuser", now.Add(time.Minute), true},
		{"big", now.Add(time.Minute), true},
		{"abuser", now.Add(time.Hour), false}, // expired
		{"big", now.Add(90 * time.Minute), true},
		{"big", now.Add(2 * time.Hour), false},
		{"nobody", now.Add(time.Minute), false},
	} {
		subj := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: tc.key}
		gw, gwOK := r.Override(subj, "g", tc.at)
		co, coOK := ps.SubjectLimit("g", subj.Key(), tc.at)
		require.Equal(t, tc.applies, gwOK, "%s at %v: gateway", tc.key, tc.at)
		require.Equal(t, tc.applies, coOK, "%s at %v: coordinator", tc.key, tc.at)
		if !tc.applies {
			continue
		}
		assert.Equal(t, gw.RateMilli(), co.RateMilli, "%s: rate", tc.key)
		assert.Equal(t, gw.BurstMilli(), co.BurstMilli, "%s: burst", tc.key)
		assert.Equal(t, base.Regions, co.Regions)
		assert.NotEqual(t, base.RateMilli, co.RateMilli, "%s: the override's limit, not the policy's", tc.key)
	}
	abuser, _ := ps.SubjectLimit("g", "k:abuser", now)
	assert.Equal(t, int64(30_000), abuser.RateMilli)
	assert.Equal(t, int64(60_000), abuser.BurstMilli)
	big, _ := ps.SubjectLimit("g", "k:big", now)
	assert.Equal(t, int64(900_000), big.RateMilli)
	assert.Equal(t, int64(900_000), big.BurstMilli, "burst follows the rate, as the policy's would")
}
