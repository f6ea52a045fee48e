package redisio_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/redisio"
	"github.com/quotientlabs/quotient/shares"
)

func clients(t *testing.T) map[string]redis.UniversalClient {
	return map[string]redis.UniversalClient{
		"standalone": redistest.StartServer(t).Client(),
		"cluster":    redistest.StartCluster(t).Client(),
	}
}

// TestSourceReadsGatewayUsage: what gateways flush with RedisUsageSink is
// read back per (policy, subject key), summed over flushes.
func TestSourceReadsGatewayUsage(t *testing.T) {
	for name, c := range clients(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			epoch := rebalancer.EpochOf(time.Now(), time.Second)
			gw := limiter.NewRedisUsageSink(c, 4, time.Second, 3)
			a := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "a b"}
			u := limiter.Subject{Kind: limiter.SubjectUser, Value: "u1"}
			for range 2 {
				failed, err := gw.WriteUsage(ctx, []limiter.UsageCount{
					{Epoch: epoch, PolicyID: "g", Subject: a, Demand: 5, Admitted: 3},
					{Epoch: epoch, PolicyID: "g", Subject: u, Demand: 1, Admitted: 1},
					{Epoch: epoch + 1, PolicyID: "g", Subject: u, Demand: 7},
				})
				require.NoError(t, err)
				require.Empty(t, failed)
			}
			got, err := redisio.NewSource(c, 4).Usage(ctx, epoch)
			require.NoError(t, err)
			assert.ElementsMatch(t, []rebalancer.Usage{
				{Key: rebalancer.Key{PolicyID: "g", Subject: a.Key()}, Demand: 10, Admitted: 6},
				{Key: rebalancer.Key{PolicyID: "g", Subject: u.Key()}, Demand: 2, Admitted: 2},
			}, got)
		})
	}
}

// TestSinkWritesWhatTheLimiterReads: records land at limiter.ShareKey with
// fields r and b and the Core's expiry; Delete removes them; a subject that
// is no limiter subject key is skipped and counted.
func TestSinkWritesWhatTheLimiterReads(t *testing.T) {
	for name, c := range clients(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			sink := redisio.NewSink(c, 2) // several batches
			subj := func(v string) limiter.Subject { return limiter.Subject{Kind: limiter.SubjectAPIKey, Value: v} }
			exp := time.Now().Add(time.Hour).Truncate(time.Millisecond)
			var ups []rebalancer.Update
			for _, v := range []string{"k1", "k2", "k3"} {
				ups = append(ups, rebalancer.Update{Key: rebalancer.Key{PolicyID: "g", Subject: subj(v).Key()}, Share: shares.Share{RateMilli: 150_000, BurstMilli: 7_500}, ExpireAt: exp})
			}
			ups = append(ups, rebalancer.Update{Key: rebalancer.Key{PolicyID: "g", Subject: "not-a-subject"}, Share: shares.Share{RateMilli: 1}, ExpireAt: exp})
			require.NoError(t, sink.Write(ctx, ups))
			assert.Equal(t, int64(1), sink.Skipped())
			assert.Equal(t, "g/not-a-subject", sink.LastSkipped())
			for _, v := range []string{"k1", "k2", "k3"} {
				key := limiter.ShareKey(subj(v), "g")
				h, err := c.HGetAll(ctx, key).Result()
				require.NoError(t, err)
				assert.Equal(t, map[string]string{"r": "150000", "b": "7500"}, h)
				at, err := c.PExpireTime(ctx, key).Result()
				require.NoError(t, err)
				assert.Equal(t, exp.UnixMilli(), at.Milliseconds())
			}
			// Retrying the same batch is harmless; then k2 goes back to the default.
			require.NoError(t, sink.Write(ctx, ups[:3]))
			require.NoError(t, sink.Write(ctx, []rebalancer.Update{{Key: ups[1].Key, Delete: true}}))
			n, err := c.Exists(ctx, limiter.ShareKey(subj("k2"), "g")).Result()
			require.NoError(t, err)
			assert.Zero(t, n)
		})
	}
}

// TestSinkReloadsScriptAfterFlush: a server that lost its scripts (restart,
// SCRIPT FLUSH) fails one write, which the driver retries; the retry loads
// the script again.
func TestSinkReloadsScriptAfterFlush(t *testing.T) {
	c := redistest.StartServer(t).Client()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	sink := redisio.NewSink(c, 0)
	up := []rebalancer.Update{{Key: rebalancer.Key{PolicyID: "g", Subject: "k:x"}, Share: shares.Share{RateMilli: 1, BurstMilli: 1}, ExpireAt: time.Now().Add(time.Minute)}}
	require.NoError(t, sink.Write(ctx, up))
	require.NoError(t, c.ScriptFlush(ctx).Err())
	err := sink.Write(ctx, up)
	require.ErrorIs(t, err, redisio.ErrWrite)
	assert.ErrorContains(t, err, "NOSCRIPT")
	require.NoError(t, sink.Write(ctx, up))
}

func TestSourceUnreachable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	_, err := redisio.NewSource(c, 0).Usage(t.Context(), 1)
	assert.ErrorIs(t, err, redisio.ErrRead)
	assert.ErrorIs(t, err, limiter.ErrStoreUnavailable)
}

// TestSinkBatchesRecordsPerCall: many records, written several per script
// call (per slot on a cluster) by one writer or several pipelines in
// flight, all land with their share and expiry; a key updated twice in one
// Write ends as the later update says.
func TestSinkBatchesRecordsPerCall(t *testing.T) {
	for name, c := range clients(t) {
		for _, writers := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/writers=%d", name, writers), func(t *testing.T) {
				testSinkBatches(t, c, writers)
			})
		}
	}
}

func testSinkBatches(t *testing.T, c redis.UniversalClient, writers int) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	sink := redisio.NewSink(c, 100) // several pipelines of several calls
	sink.SetWriters(writers)
	exp := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	subj := func(i int) limiter.Subject {
		return limiter.Subject{Kind: limiter.SubjectAPIKey, Value: fmt.Sprintf("key %d", i)}
	}
	const n = 1000
	var ups []rebalancer.Update
	for i := range n {
		ups = append(ups, rebalancer.Update{Key: rebalancer.Key{PolicyID: "g", Subject: subj(i).Key()},
			Share: shares.Share{RateMilli: int64(1000 + i), BurstMilli: int64(2000 + i)}, ExpireAt: exp})
	}
	// Key 0 set, then deleted; key 1 deleted (no record), then set again.
	ups = append(ups, rebalancer.Update{Key: ups[0].Key, Delete: true})
	ups = append([]rebalancer.Update{{Key: ups[1].Key, Delete: true}}, ups...)
	require.NoError(t, sink.Write(ctx, ups))
	assert.Zero(t, sink.Skipped())
	n0, err := c.Exists(ctx, limiter.ShareKey(subj(0), "g")).Result()
	require.NoError(t, err)
	assert.Zero(t, n0, "key 0 was deleted after it was set")
	for i := 1; i < n; i++ {
		key := limiter.ShareKey(subj(i), "g")
		h, err := c.HGetAll(ctx, key).Result()
		require.NoError(t, err)
		require.Equal(t, map[string]string{"r": fmt.Sprint(1000 + i), "b": fmt.Sprint(2000 + i)}, h, key)
		at, err := c.PExpireTime(ctx, key).Result()
		require.NoError(t, err)
		require.Equal(t, exp.UnixMilli(), at.Milliseconds(), key)
	}
}
