package redisio_test

import (
	"context"
	"hash/fnv"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/redisio"
)

// TestSourceReadsBothLayoutsDuringUpgrade: during a rolling upgrade,
// gateways of the previous release (the split layout, 16 shards) and of
// this one (the packed layout) flush the same epoch, some keys from both;
// a Source with the split layout's shard count reads the sum of both, per
// key, and a Source without it reads only the packed layout. On a
// standalone Redis and a cluster.
func TestSourceReadsBothLayoutsDuringUpgrade(t *testing.T) {
	for name, c := range clients(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			epoch := rebalancer.EpochOf(time.Now(), 10*time.Second)
			const shards = 64
			oldGW := limiter.NewSplitUsageSink(c, limiter.DefaultSplitUsageShards, 10*time.Second, 3)
			newGW := limiter.NewRedisUsageSink(c, shards, 10*time.Second, 3)
			subj := func(i int) limiter.Subject {
				return limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "key-" + strconv.Itoa(i)}
			}
			// Keys 0-99 from old gateways, 50-149 from new ones.
			var oldCounts, newCounts []limiter.UsageCount
			want := map[string]rebalancer.Usage{}
			packedOnly := map[string]rebalancer.Usage{}
			add := func(m map[string]rebalancer.Usage, i int, d, a int64) {
				u := m[subj(i).Key()]
				u.Key = rebalancer.Key{PolicyID: "g", Subject: subj(i).Key()}
				u.Demand += d
				u.Admitted += a
				m[subj(i).Key()] = u
			}
			for i := range 100 {
				oldCounts = append(oldCounts, limiter.UsageCount{Epoch: epoch, PolicyID: "g", Subject: subj(i), Demand: 5, Admitted: 2})
				add(want, i, 5, 2)
			}
			for i := 50; i < 150; i++ {
				newCounts = append(newCounts, limiter.UsageCount{Epoch: epoch, PolicyID: "g", Subject: subj(i), Demand: 7, Admitted: 3})
				add(want, i, 7, 3)
				add(packedOnly, i, 7, 3)
			}
			for sink, counts := range map[*limiter.RedisUsageSink][]limiter.UsageCount{oldGW: oldCounts, newGW: newCounts} {
				failed, err := sink.WriteUsage(ctx, counts)
				require.NoError(t, err)
				require.Empty(t, failed)
			}
			// Where the previous release put a key: shard FNV-1a-64 of
			// "<policy>:<subject key>" mod 16, fields d: and a:.
			for i := range 100 {
				h := fnv.New64a()
				_, _ = h.Write([]byte("g:" + subj(i).Key()))
				key := limiter.SplitUsageKey(epoch, int(h.Sum64()%limiter.DefaultSplitUsageShards))
				v, err := c.HMGet(ctx, key, "d:g:"+subj(i).Key(), "a:g:"+subj(i).Key()).Result()
				require.NoError(t, err)
				require.Equal(t, []any{"5", "2"}, v, "key %d in %s, as the previous release wrote it", i, key)
			}

			got, err := redisio.NewLayoutSource(c, limiter.UsageLayout{Shards: shards, SplitShards: limiter.DefaultSplitUsageShards}).Usage(ctx, epoch)
			require.NoError(t, err)
			require.Len(t, got, len(want))
			for _, u := range got {
				assert.Equal(t, want[u.Subject], u, u.Subject)
			}
			only, err := redisio.NewSource(c, shards).Usage(ctx, epoch)
			require.NoError(t, err)
			require.Len(t, only, len(packedOnly))
			for _, u := range only {
				assert.Equal(t, packedOnly[u.Subject], u, u.Subject)
			}
		})
	}
}
