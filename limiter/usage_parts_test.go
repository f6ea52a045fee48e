package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// TestUsagePartIsTheShardModParts: a key's part is its usage shard modulo
// the part count for every shard count that is a multiple of it (so it is
// the same in regions with different shard counts), and 0 with one part.
func TestUsagePartIsTheShardModParts(t *testing.T) {
	for i := range 2000 {
		sk := fmt.Sprintf("k:key-%07d", i)
		for _, parts := range []int{2, 3, 4, 8} {
			p := UsagePart("g", sk, parts)
			require.True(t, p >= 0 && p < parts)
			for _, shards := range []int{parts, 4 * parts, 16384 / parts * parts} {
				require.Equal(t, usageShard("g", sk, shards)%parts, p, "key %s, %d parts, %d shards", sk, parts, shards)
			}
		}
		require.Zero(t, UsagePart("g", sk, 1))
		require.Zero(t, UsagePart("g", sk, 0))
	}
}

// TestCollectUsagePart: a collection of one part reads exactly the keys of
// that part (the parts' totals are the whole epoch's, each key in one
// part), and a layout whose shards are not a multiple of the parts, or
// with split shards, is refused.
func TestCollectUsagePart(t *testing.T) {
	client := redistest.StartServer(t).Client()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	const shards, parts = 16, 4
	epoch := time.Now().UnixMilli() / 1000
	sink := NewRedisUsageSink(client, shards, time.Second, 60)
	var counts []UsageCount
	for i := range 200 {
		counts = append(counts, UsageCount{Epoch: epoch, PolicyID: "g", Subject: Subject{Kind: SubjectAPIKey, Value: fmt.Sprintf("key-%03d", i)}, Demand: int64(i + 1), Admitted: 1})
	}
	failed, err := sink.WriteUsage(ctx, counts)
	require.NoError(t, err)
	require.Empty(t, failed)
	all, err := CollectUsageRead(ctx, client, epoch, UsageLayout{Shards: shards})
	require.NoError(t, err)
	require.Len(t, all.Totals, 200)
	var union []UsageTotal
	for p := range parts {
		r, err := CollectUsageRead(ctx, client, epoch, UsageLayout{Shards: shards, Parts: parts, Part: p})
		require.NoError(t, err)
		assert.NotEmpty(t, r.Totals, "part %d", p)
		for _, tot := range r.Totals {
			assert.Equal(t, p, UsagePart(tot.PolicyID, tot.SubjectKey, parts), "key %s in part %d's collection", tot.SubjectKey, p)
		}
		union = append(union, r.Totals...)
	}
	assert.ElementsMatch(t, all.Totals, union)
	for _, l := range []UsageLayout{{Shards: 18, Parts: 4}, {Shards: 16, Parts: 4, SplitShards: 16}, {Shards: 16, Parts: 4, Part: 4}, {Shards: 16, Parts: 4, Part: -1}} {
		_, err := CollectUsageRead(ctx, client, epoch, l)
		assert.Error(t, err, "%+v", l)
	}
}
