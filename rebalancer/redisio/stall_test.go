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
// hashes of both layouts and the overflow marker of E-UnlinkLagEpochs, a
// 125,000-field hash among them (a million-key epoch's in the split
// layout, or in a packed layout of too few shards), with UNLINK, which
// frees a big hash on a background thread (about 0.09 ms of redis-server's
// main thread for that hash, where a DEL, or the expiry redis-server 7.0
// runs in the foreground, takes about 27 ms), in pipelines of at most
// UnlinkPipeline commands, and leaves the other epochs' usage alone; on a
// standalone Redis and a cluster. The test checks the commands sent (on
// the standalone server, through a hook), not their time, which depends on
// the machine's load.
func TestSourceUnlinksCollectedUsage(t *testing.T) {
	srv := redistest.StartServer(t)
	targets := map[string]redis.UniversalClient{
		"standalone": redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true}),
		"cluster":    redistest.StartCluster(t).Client(),
	}
	for name, c := range targets {
		for _, readBefore := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/old epoch read before=%v", name, readBefore), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
				defer cancel()
				epoch := rebalancer.EpochOf(time.Now(), 10*time.Second)
				if readBefore {
					epoch += 10 // epochs of their own
					if _, ok := c.(*redis.Client); ok {
						c = redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true}) // a hook of its own
					}
				}
				old := epoch - redisio.UnlinkLagEpochs
				const shards = 2*redisio.UnlinkPipeline + 1 // packed hashes: three UNLINK pipelines
				// kept epochs outlive the test, even across epoch boundaries
				gw := limiter.NewRedisUsageSink(c, shards, 10*time.Second, 10)
				split := limiter.NewSplitUsageSink(c, 4, 10*time.Second, 10)
				var counts []limiter.UsageCount
				for e := old - 1; e <= epoch; e++ {
					for i := range 40 {
						counts = append(counts, limiter.UsageCount{Epoch: e, PolicyID: "g",
							Subject: limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "k" + strconv.Itoa(i)}, Demand: 3, Admitted: 1})
					}
				}
				for _, sink := range []*limiter.RedisUsageSink{gw, split} {
					failed, err := sink.WriteUsage(ctx, counts)
					require.NoError(t, err)
					require.Empty(t, failed)
				}
				require.NoError(t, gw.WriteUsageOverflow(ctx, []limiter.UsageOverflow{{Epoch: old, Keys: 1, Requests: 1}}))
				// One big hash of the old epoch (it keeps its expiry).
				big := limiter.UsageKey(old, 0)
				args := make([]any, 0, 4000)
				pipe := c.Pipeline()
				for i := range 125_000 {
					args = append(args, "g:k:big-"+strconv.Itoa(i), 2<<32+1)
					if len(args) == cap(args) || i == 124_999 {
						pipe.HSet(ctx, big, args...)
						args = make([]any, 0, 4000)
					}
				}
				_, err := pipe.Exec(ctx)
				require.NoError(t, err)
				require.GreaterOrEqual(t, c.HLen(ctx, big).Val(), int64(125_000))

				var log *redistest.PipelineLog
				src := redisio.NewLayoutSource(c, limiter.UsageLayout{Shards: shards, SplitShards: 4})
				if readBefore {
					// The Source read the old epoch: it knows which of its
					// packed hashes were big, and unlinks only those.
					_, err := src.Usage(ctx, old)
					require.ErrorIs(t, err, rebalancer.ErrUsageIncomplete, "the old epoch has an overflow marker")
				}
				if cl, ok := c.(*redis.Client); ok {
					log = &redistest.PipelineLog{}
					cl.AddHook(log)
					defer cl.Close()
				}
				got, err := src.Usage(ctx, epoch)
				require.NoError(t, err)
				assert.Len(t, got, 40)
				for _, u := range got {
					assert.Equal(t, int64(6), u.Demand, "both layouts added: %v", u.Key)
				}
				type hash struct {
					key   func(int64, int) string
					shard int
				}
				var hashes []hash
				for s := range 4 {
					hashes = append(hashes, hash{limiter.SplitUsageKey, s})
				}
				for s := range shards {
					hashes = append(hashes, hash{limiter.UsageKey, s})
				}
				left := 0
				for _, h := range hashes {
					n, err := c.Exists(ctx, h.key(old, h.shard)).Result()
					require.NoError(t, err)
					key := h.key(old, h.shard)
					if readBefore && key != big && key == limiter.UsageKey(old, h.shard) {
						left += int(n) // small packed hashes: left to expire
						continue
					}
					assert.Zero(t, n, "%s unlinked", h.key(old, h.shard))
				}
				if readBefore {
					assert.Positive(t, left, "the old epoch's small packed hashes are left to expire")
				}
				for e := old - 1; e <= epoch; e++ {
					if e == old {
						continue
					}
					kept, err := limiter.CollectUsageLayout(ctx, c, e, limiter.UsageLayout{Shards: shards, SplitShards: 4})
					require.NoError(t, err)
					assert.Len(t, kept, 40, "epoch %d kept", e)
					for _, u := range kept {
						assert.Equal(t, int64(6), u.Demand, "epoch %d kept in both layouts", e)
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
					for _, h := range hashes {
						key := h.key(old, h.shard)
						small := readBefore && key != big && key == limiter.UsageKey(old, h.shard)
						assert.Equal(t, !small, unlinked[key], "%s deleted by UNLINK", key)
					}
					assert.True(t, unlinked[limiter.UsageOverflowKey(old)], "the overflow marker deleted by UNLINK")
					for r, round := range log.Rounds() {
						assert.LessOrEqual(t, len(round), max(redisio.UnlinkPipeline, limiter.UsageScanRoundCommands), "round %d: commands", r)
					}
				}
			})
		}
	}
}
