package redisio_test

import (
	"context"
	"fmt"
	"strconv"
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

// TestSinkExactAtCallAndBatchBoundaries: a Write of n updates, n at, just
// under and just over one script call (DefaultKeysPerCall) and one
// pipeline (the Sink's batch), leaves exactly the records it names, with
// their share and expiry, on a standalone Redis and a cluster.
func TestSinkExactAtCallAndBatchBoundaries(t *testing.T) {
	per := redisio.DefaultKeysPerCall
	for name, c := range clients(t) {
		for _, batch := range []int{per, 2*per + 1} {
			for _, n := range []int{1, per - 1, per, per + 1, 2 * per, 2*per + 1, 2*per + 2, 5*per + 3} {
				t.Run(fmt.Sprintf("%s/batch=%d/n=%d", name, batch, n), func(t *testing.T) {
					ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
					defer cancel()
					sink := redisio.NewSink(c, batch)
					exp := time.Now().Add(time.Hour).Truncate(time.Millisecond)
					subj := func(i int) limiter.Subject {
						return limiter.Subject{Kind: limiter.SubjectAPIKey, Value: fmt.Sprintf("b%d-n%d-%d", batch, n, i)}
					}
					ups := make([]rebalancer.Update, n)
					for i := range ups {
						ups[i] = rebalancer.Update{Key: rebalancer.Key{PolicyID: "g", Subject: subj(i).Key()},
							Share: shares.Share{RateMilli: int64(1000 + i), BurstMilli: int64(3 + i)}, ExpireAt: exp}
					}
					require.NoError(t, sink.Write(ctx, ups))
					for i := range n {
						key := limiter.ShareKey(subj(i), "g")
						h, err := c.HGetAll(ctx, key).Result()
						require.NoError(t, err)
						require.Equal(t, map[string]string{"r": strconv.Itoa(1000 + i), "b": strconv.Itoa(3 + i)}, h, key)
						at, err := c.PExpireTime(ctx, key).Result()
						require.NoError(t, err)
						require.Equal(t, exp.UnixMilli(), at.Milliseconds(), key)
					}
					n1, err := c.Exists(ctx, limiter.ShareKey(subj(n), "g")).Result()
					require.NoError(t, err)
					assert.Zero(t, n1, "no record past the last update")
				})
			}
		}
	}
}

// TestSourceUnlinksCollectedUsage: reading epoch E deletes the usage
// hashes and overflow marker of E-UnlinkLagEpochs, a 125,000-field shard
// (a million-key epoch's) among them, with UNLINK, which frees a hash on
// a background thread (about 0.09 ms of redis-server's main thread for
// that shard, where a DEL, or the expiry redis-server 7.0 runs in the
// foreground, takes about 27 ms), and leaves the other epochs' usage
// alone; on a standalone Redis and a cluster. The test checks the
// commands sent (on the standalone server, through a hook), not their
// time, which depends on the machine's load.
func TestSourceUnlinksCollectedUsage(t *testing.T) {
	srv := redistest.StartServer(t)
	targets := map[string]redis.UniversalClient{
		"standalone": redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true}),
		"cluster":    redistest.StartCluster(t).Client(),
	}
	for name, c := range targets {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			epoch := rebalancer.EpochOf(time.Now(), 10*time.Second)
			old := epoch - redisio.UnlinkLagEpochs
			gw := limiter.NewRedisUsageSink(c, 4, 10*time.Second, 10) // kept epochs outlive the test, even across epoch boundaries
			var counts []limiter.UsageCount
			for e := old - 1; e <= epoch; e++ {
				for i := range 40 {
					counts = append(counts, limiter.UsageCount{Epoch: e, PolicyID: "g",
						Subject: limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "k" + strconv.Itoa(i)}, Demand: 3, Admitted: 1})
				}
			}
			failed, err := gw.WriteUsage(ctx, counts)
			require.NoError(t, err)
			require.Empty(t, failed)
			require.NoError(t, gw.WriteUsageOverflow(ctx, []limiter.UsageOverflow{{Epoch: old, Keys: 1, Requests: 1}}))
			// One big shard of the old epoch (it keeps its expiry).
			big := limiter.UsageKey(old, 0)
			args := make([]any, 0, 4000)
			pipe := c.Pipeline()
			for i := range 62_500 {
				args = append(args, "d:g:k:big-"+strconv.Itoa(i), 2, "a:g:k:big-"+strconv.Itoa(i), 1)
				if len(args) == cap(args) || i == 62_499 {
					pipe.HSet(ctx, big, args...)
					args = make([]any, 0, 4000)
				}
			}
			_, err = pipe.Exec(ctx)
			require.NoError(t, err)
			require.GreaterOrEqual(t, c.HLen(ctx, big).Val(), int64(125_000))

			var log *redistest.PipelineLog
			if cl, ok := c.(*redis.Client); ok {
				log = &redistest.PipelineLog{}
				cl.AddHook(log)
				defer cl.Close()
			}
			got, err := redisio.NewSource(c, 4).Usage(ctx, epoch)
			require.NoError(t, err)
			assert.Len(t, got, 40)
			for s := range 4 {
				for e := old - 1; e <= epoch; e++ {
					n, err := c.Exists(ctx, limiter.UsageKey(e, s)).Result()
					require.NoError(t, err)
					if e == old {
						assert.Zero(t, n, "epoch %d shard %d unlinked", e, s)
					} else {
						assert.Equal(t, int64(1), n, "epoch %d shard %d kept", e, s)
					}
				}
			}
			n, err := c.Exists(ctx, limiter.UsageOverflowKey(old)).Result()
			require.NoError(t, err)
			assert.Zero(t, n, "the old epoch's overflow marker unlinked")
			if log != nil {
				unlinked := map[string]bool{}
				for _, round := range log.Rounds() {
					for _, cmd := range round {
						args := cmd.Args()
						assert.NotEqual(t, "del", args[0], "no foreground delete: %v", args)
						if args[0] == "unlink" {
							for _, k := range args[1:] {
								unlinked[k.(string)] = true
							}
						}
					}
				}
				for s := range 4 {
					assert.True(t, unlinked[limiter.UsageKey(old, s)], "shard %d of epoch %d deleted by UNLINK", s, old)
				}
				assert.True(t, unlinked[limiter.UsageOverflowKey(old)], "the overflow marker deleted by UNLINK")
			}
		})
	}
}
