package limiter

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

func TestRegionSetRoundTripAndErrors(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client()
	ctx := context.Background()

	_, ok, err := ReadRegionSet(ctx, c)
	require.NoError(t, err)
	assert.False(t, ok, "no record yet")

	want := RegionSet{Region: "eu", Regions: []string{"us", "eu", "ap"}, Epoch: 2 * time.Second, UsageShards: 16}
	require.NoError(t, WriteRegionSet(ctx, c, want))
	got, ok, err := ReadRegionSet(ctx, c)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, []string{"ap", "eu", "us"}, got.Regions, "sorted")
	assert.Empty(t, want.Differences(got), "order of regions does not count")
	assert.Equal(t, []string{"regions: ap,eu,us vs ap,eu", "usage shards: 16 vs 4"},
		got.Differences(RegionSet{Region: "eu", Regions: []string{"eu", "ap"}, Epoch: 2 * time.Second, UsageShards: 4}))

	require.ErrorIs(t, WriteRegionSet(ctx, c, RegionSet{Region: "x", Regions: []string{"eu"}, Epoch: time.Second, UsageShards: 1}), ErrRegionSet)
	require.NoError(t, c.HSet(ctx, RegionSetKey, "usage_shards", "many").Err())
	_, _, err = ReadRegionSet(ctx, c)
	require.ErrorContains(t, err, `usage_shards "many"`)

	for list, msg := range map[string]string{"eu,,us": `region name ""`, "eu,eu": `"eu" listed twice`, "e u": `region name "e u"`} {
		_, err := ParseRegionList(list)
		require.ErrorIs(t, err, ErrRegionSet, list)
		assert.ErrorContains(t, err, msg, list)
	}
}

// TestSetRegionsChangesTheDefaultShare: a key without a share record gets
// 1/n of a global bucket, with n what SetRegions said last.
func TestSetRegionsChangesTheDefaultShare(t *testing.T) {
	ps, err := ParsePolicies([]byte(`[{"id":"g","algorithm":"token_bucket","rate_per_sec":0.04,"burst":40,"scope":"global"}]`))
	require.NoError(t, err)
	cfg := DefaultConfig()
	cfg.Regions = 4
	l, err := New(cfg, ps)
	require.NoError(t, err)
	now := time.Unix(1_700_000_000, 0)
	admitted := func(key string) int {
		n := 0
		for range 50 {
			d, err := l.CheckAt(context.Background(), now, Request{Identity: Identity{APIKey: key}})
			require.NoError(t, err)
			if d.Allowed {
				n++
			}
		}
		return n
	}
	assert.Equal(t, 10, admitted("a"), "burst 40 over 4 regions")
	require.NoError(t, l.SetRegions("eu", 2))
	region, n := l.RegionSetting()
	assert.Equal(t, "eu", region)
	assert.Equal(t, 2, n)
	assert.Equal(t, 20, admitted("b"), "burst 40 over 2 regions")
	require.ErrorContains(t, l.SetRegions("eu", 0), "between 1 and 64")
	require.ErrorContains(t, l.SetRegions("e u", 2), `region "e u"`)
}

// TestRegionSetUsageLayouts: the record states both usage layouts for a
// rolling upgrade. A record as a coordinator of the previous release
// wrote it (usage_shards only) reads as the split layout (UsageShards 0),
// which a gateway then writes; a record of this release keeps
// usage_shards for the previous release's gateways (the split count) and
// adds usage_packed_shards; without a split count it has no usage_shards.
func TestRegionSetUsageLayouts(t *testing.T) {
	c := redistest.StartServer(t).Client()
	ctx := context.Background()
	require.NoError(t, c.HSet(ctx, RegionSetKey, "region", "eu", "regions", "eu,us", "epoch_ms", 10_000, "usage_shards", 16).Err())
	got, ok, err := ReadRegionSet(ctx, c)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, RegionSet{Region: "eu", Regions: []string{"eu", "us"}, Epoch: 10 * time.Second, UsageShards: 0, SplitShards: 16}, got)

	rs := RegionSet{Region: "eu", Regions: []string{"eu", "us"}, Epoch: 10 * time.Second, UsageShards: DefaultUsageShards, SplitShards: 16}
	require.NoError(t, WriteRegionSet(ctx, c, rs))
	fields, err := c.HGetAll(ctx, RegionSetKey).Result()
	require.NoError(t, err)
	assert.Equal(t, "16", fields["usage_shards"], "what the previous release's gateways follow")
	assert.Equal(t, strconv.Itoa(DefaultUsageShards), fields["usage_packed_shards"])
	got, _, err = ReadRegionSet(ctx, c)
	require.NoError(t, err)
	assert.Equal(t, rs, got)
	assert.Equal(t, []string{"usage shards: 16384 vs 0"}, got.Differences(RegionSet{Region: "eu", Regions: []string{"eu", "us"}, Epoch: 10 * time.Second, SplitShards: 16}))

	rs.SplitShards = 0
	require.NoError(t, WriteRegionSet(ctx, c, rs))
	n, err := c.HExists(ctx, RegionSetKey, "usage_shards").Result()
	require.NoError(t, err)
	assert.False(t, n, "no split layout read: no usage_shards")
	got, _, err = ReadRegionSet(ctx, c)
	require.NoError(t, err)
	assert.Equal(t, rs, got)

	require.ErrorContains(t, WriteRegionSet(ctx, c, RegionSet{Region: "eu", Regions: []string{"eu"}, Epoch: time.Second}), "no usage layout")
}
