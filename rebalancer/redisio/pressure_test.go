package redisio_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/redisio"
)

// TestPressureSourceRates: the demand rates PressureSource returns are
// what the gateways' pressure marks gained since its last read, across an
// epoch boundary (a late flush of the old epoch and the new epoch's first
// both count); Demand reads the asked keys' current usage.
func TestPressureSourceRates(t *testing.T) {
	const epoch = 10 * time.Second
	for name, c := range clients(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			e := rebalancer.EpochOf(time.Now(), epoch)
			t0 := rebalancer.EpochStart(e, epoch).Add(3 * time.Second)
			gw := limiter.NewRedisUsageSink(c, 4, epoch, 3)
			a := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "a"}
			b := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "b"}
			ka, kb := rebalancer.Key{PolicyID: "g", Subject: a.Key()}, rebalancer.Key{PolicyID: "g", Subject: b.Key()}
			flush := func(counts ...limiter.UsageCount) {
				t.Helper()
				failed, err := gw.WriteUsage(ctx, counts)
				require.NoError(t, err)
				require.Empty(t, failed)
			}
			src := redisio.NewPressureSource(c, 4, epoch, 0)

			flush(limiter.UsageCount{Epoch: e, PolicyID: "g", Subject: a, Demand: 10, Admitted: 5})
			got, err := src.Pressure(ctx, t0)
			require.NoError(t, err)
			assert.Empty(t, got, "the first read only remembers the counts")

			flush(limiter.UsageCount{Epoch: e, PolicyID: "g", Subject: a, Demand: 20, Admitted: 10},
				limiter.UsageCount{Epoch: e, PolicyID: "g", Subject: b, Demand: 3, Admitted: 3})
			t1 := t0.Add(2 * time.Second)
			got, err = src.Pressure(ctx, t1)
			require.NoError(t, err)
			assert.Equal(t, []rebalancer.Pressure{{Key: ka, DemandMilli: 10_000}}, got, "20 units in 2 s; b rejected nothing")
			own, err := src.Demand(ctx, t1, []rebalancer.Key{ka, kb, {PolicyID: "g", Subject: "k:none"}})
			require.NoError(t, err)
			assert.ElementsMatch(t, []rebalancer.Pressure{{Key: ka, DemandMilli: 6_000}, {Key: kb, DemandMilli: 600}}, own, "5 s into the epoch: 30 and 3 units")

			// The next epoch: its first flush and a late one of the old.
			flush(limiter.UsageCount{Epoch: e + 1, PolicyID: "g", Subject: a, Demand: 6, Admitted: 0},
				limiter.UsageCount{Epoch: e, PolicyID: "g", Subject: a, Demand: 4, Admitted: 0})
			t2 := rebalancer.EpochStart(e+1, epoch).Add(500 * time.Millisecond)
			got, err = src.Pressure(ctx, t2)
			require.NoError(t, err)
			assert.Equal(t, []rebalancer.Pressure{{Key: ka, DemandMilli: 10 * 1_000_000 / t2.Sub(t1).Milliseconds()}}, got)
			own, err = src.Demand(ctx, t2, []rebalancer.Key{ka})
			require.NoError(t, err)
			assert.Equal(t, []rebalancer.Pressure{{Key: ka, DemandMilli: 40 * 1_000_000 / 10_500}}, own, "early in an epoch, the one before counts too")

			got, err = src.Pressure(ctx, t2.Add(time.Second))
			require.NoError(t, err)
			assert.Empty(t, got, "nothing rejected since the last read")
		})
	}
}
