package redisio_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/redisio"
	"github.com/quotientlabs/quotient/shares"
)

// testClock is a settable limiter.Clock.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }

// TestDroppedUsageKeepsShare: a gateway whose usage counts are full
// (UsageMaxKeys) drops the usage of a busy key in one epoch. The region's
// share of that key, grown above the default, does not shrink: the
// gateway marks the epoch in Redis, the Source returns its usage as
// incomplete, and the Core collects it as a lower bound. (Before, the key
// read as idle, and its share shrank at that very collection.) Real
// limiter, redis-server (standalone and cluster), Source and Core; the
// other two regions' reports are written by hand (idle, at the floor).
func TestDroppedUsageKeepsShare(t *testing.T) {
	for name, c := range clients(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			const epoch = time.Second
			pols, err := limiter.ParsePolicies([]byte(`[{"id":"g","algorithm":"token_bucket","rate_per_sec":30,"burst":30,"scope":"global"}]`))
			require.NoError(t, err)
			clock := &testClock{}
			gw, err := limiter.New(limiter.Config{Clock: clock, Regions: 3, UsageEpoch: epoch, UsageMaxKeys: 2}, pols)
			require.NoError(t, err)
			flusher := limiter.NewUsageFlusher(gw, limiter.NewRedisUsageSink(c, 4, epoch, 3), limiter.UsageFlusherConfig{})
			src := redisio.NewSource(c, 4)

			lim := shares.Limit{RateMilli: 30_000, BurstMilli: 30_000, Regions: 3}
			cfg := rebalancer.DefaultConfig()
			cfg.Region, cfg.Regions, cfg.Epoch, cfg.MaxWait = "a", []string{"a", "b", "c"}, epoch, 200*time.Millisecond
			core, err := rebalancer.New(cfg, rebalancer.PolicyMap{"g": lim})
			require.NoError(t, err)
			busy := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "busy"}
			key := rebalancer.Key{PolicyID: "g", Subject: busy.Key()}
			floor := shares.Share{RateMilli: 1000, BurstMilli: 1000}
			// shareOf is the share region a enforces (the default when
			// the Core has none).
			shareOf := func() shares.Share {
				if s, ok := core.Share(key); ok {
					return s
				}
				return lim.Default()
			}

			// Usage keys expire at absolute times: epochs from now on.
			first := rebalancer.EpochOf(time.Now(), epoch) + 1
			check := func(subject string, n int) {
				for range n {
					_, err := gw.Check(ctx, limiter.Request{Identity: limiter.Identity{APIKey: subject}, Method: "GET", Path: "/"})
					require.NoError(t, err)
				}
			}
			// run plays epoch m: the gateway's traffic, its flush, then the
			// coordinator's cycle as the driver runs it.
			run := func(m int64, traffic func()) (incomplete bool) {
				clock.set(rebalancer.EpochStart(m, epoch).Add(epoch / 2))
				traffic()
				require.NoError(t, flusher.Flush(ctx, clock.Now()))
				now := rebalancer.EpochStart(m+1, epoch).Add(epoch / 10)
				usage, err := src.Usage(ctx, m)
				var pub rebalancer.Published
				if errors.Is(err, rebalancer.ErrUsageIncomplete) {
					incomplete = true
					pub, err = core.CollectIncomplete(now, usage)
				} else {
					require.NoError(t, err)
					pub, err = core.Collect(now, usage)
				}
				require.NoError(t, err)
				for _, u := range pub.Updates {
					if u.Key == key {
						t.Logf("epoch %d: share given up at collection: %+v", m, u.Share)
					}
				}
				for _, r := range []string{"b", "c"} {
					_, err := core.Receive(&rebalancer.Report{Region: r, Epoch: m, Seq: m,
						Heard: []rebalancer.Heard{{Region: "a", Epoch: m - 1}, {Region: "b", Epoch: m}, {Region: "c", Epoch: m}},
						Keys:  []rebalancer.KeyReport{{Key: key, Share: floor}}})
					require.NoError(t, err)
				}
				_, err = core.Decide(now)
				require.NoError(t, err)
				return incomplete
			}

			m := first
			for ; m < first+int64(cfg.WarmupEpochs)+12; m++ {
				assert.False(t, run(m, func() { check("busy", 25) }), "epoch %d: nothing dropped", m)
			}
			before := shareOf()
			require.Greater(t, before.RateMilli, lim.Default().RateMilli, "the busy region grew into the idle ones' shares")

			// Two other keys fill the gateway's counts first: busy's
			// usage of this epoch is dropped.
			assert.True(t, run(m, func() { check("other-1", 1); check("other-2", 1); check("busy", 25) }), "the epoch is marked incomplete")
			after := shareOf()
			assert.GreaterOrEqual(t, after.RateMilli, before.RateMilli, "busy's share did not shrink because its usage was dropped")
			assert.GreaterOrEqual(t, after.BurstMilli, before.BurstMilli)
			assert.Equal(t, int64(1), core.Stats().IncompleteUsage)

			// The next epoch counts busy again: complete, and the share
			// still where it was.
			m++
			assert.False(t, run(m, func() { check("busy", 25) }))
			again := shareOf()
			assert.GreaterOrEqual(t, again.RateMilli, before.RateMilli, fmt.Sprintf("share %+v after the dropped epoch", again))
		})
	}
}
