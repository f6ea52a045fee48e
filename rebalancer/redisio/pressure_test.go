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

// TestPressureSourceDemandFollowsRecentUsage: a key read again between
// epoch/10 (1 s, the default window) and epoch/2 after its last Demand
// read gets the rate of what its usage gained since (across an epoch
// boundary too), so a giver whose traffic just left reads as idle at the
// asker's next ask instead of at its epoch-to-date average; a read sooner
// than epoch/10 repeats the last rate, and an old baseline falls back to
// the epoch-to-date estimate.
func TestPressureSourceDemandFollowsRecentUsage(t *testing.T) {
	const epoch = 10 * time.Second
	for name, c := range clients(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			e := rebalancer.EpochOf(time.Now(), epoch) + 2
			gw := limiter.NewRedisUsageSink(c, 4, epoch, 3)
			a := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "left"}
			ka := rebalancer.Key{PolicyID: "g", Subject: a.Key()}
			flush := func(ep, demand int64) {
				t.Helper()
				failed, err := gw.WriteUsage(ctx, []limiter.UsageCount{{Epoch: ep, PolicyID: "g", Subject: a, Demand: demand, Admitted: demand}})
				require.NoError(t, err)
				require.Empty(t, failed)
			}
			src := redisio.NewPressureSource(c, 4, epoch, 0)

			// 6 s of 150/s, then the traffic leaves.
			flush(e, 900)
			t0 := rebalancer.EpochStart(e, epoch).Add(6 * time.Second)
			own, err := src.Demand(ctx, t0, []rebalancer.Key{ka})
			require.NoError(t, err)
			assert.Equal(t, []rebalancer.Pressure{{Key: ka, DemandMilli: 150_000}}, own, "a first read: the epoch so far")

			own, err = src.Demand(ctx, t0.Add(300*time.Millisecond), []rebalancer.Key{ka})
			require.NoError(t, err)
			assert.Equal(t, []rebalancer.Pressure{{Key: ka, DemandMilli: 900 * 1_000_000 / 6_300}}, own, "sooner than a flush after a first read: the epoch so far again")

			t1 := t0.Add(time.Second)
			own, err = src.Demand(ctx, t1, []rebalancer.Key{ka})
			require.NoError(t, err)
			assert.Empty(t, own, "nothing used since the last read: idle, though the epoch's average is 136/s")

			own, err = src.Demand(ctx, t1.Add(200*time.Millisecond), []rebalancer.Key{ka})
			require.NoError(t, err)
			assert.Empty(t, own, "sooner than a flush after a measured rate: that rate again")

			// Across the boundary: 20 units in the old epoch's last flush
			// and 30 in the new one's first, 4 s after t1.
			flush(e, 20)
			flush(e+1, 30)
			t2 := t1.Add(4 * time.Second)
			own, err = src.Demand(ctx, t2, []rebalancer.Key{ka})
			require.NoError(t, err)
			assert.Equal(t, []rebalancer.Pressure{{Key: ka, DemandMilli: 50 * 1_000_000 / 4_000}}, own, "50 units in 4 s")

			// A baseline older than epoch/2 is not used.
			t3 := t2.Add(6 * time.Second)
			own, err = src.Demand(ctx, t3, []rebalancer.Key{ka})
			require.NoError(t, err)
			assert.Equal(t, []rebalancer.Pressure{{Key: ka, DemandMilli: 30 * 1_000_000 / t3.Sub(rebalancer.EpochStart(e+1, epoch)).Milliseconds()}}, own, "the new epoch so far")
		})
	}
}

// TestPressureSourceDemandWindowIsTheFlushInterval: with a flush interval
// (SetWindow) shorter than epoch/10, a read one window after the first
// measures the usage since it, so the giver of a key whose traffic left
// reads idle within a window, not an epoch tenth.
func TestPressureSourceDemandWindowIsTheFlushInterval(t *testing.T) {
	const epoch = 4 * time.Second
	for name, c := range clients(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			e := rebalancer.EpochOf(time.Now(), epoch) + 2
			gw := limiter.NewRedisUsageSink(c, 4, epoch, 3)
			a := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "short"}
			ka := rebalancer.Key{PolicyID: "g", Subject: a.Key()}
			failed, err := gw.WriteUsage(ctx, []limiter.UsageCount{{Epoch: e, PolicyID: "g", Subject: a, Demand: 600, Admitted: 600}})
			require.NoError(t, err)
			require.Empty(t, failed)
			src := redisio.NewPressureSource(c, 4, epoch, 0)
			src.SetWindow(250 * time.Millisecond)

			t0 := rebalancer.EpochStart(e, epoch).Add(2 * time.Second)
			own, err := src.Demand(ctx, t0, []rebalancer.Key{ka})
			require.NoError(t, err)
			assert.Equal(t, []rebalancer.Pressure{{Key: ka, DemandMilli: 300_000}}, own, "a first read: the epoch so far")

			own, err = src.Demand(ctx, t0.Add(200*time.Millisecond), []rebalancer.Key{ka})
			require.NoError(t, err)
			assert.Equal(t, []rebalancer.Pressure{{Key: ka, DemandMilli: 600 * 1_000_000 / 2_200}}, own, "sooner than the window: the epoch so far again")

			own, err = src.Demand(ctx, t0.Add(300*time.Millisecond), []rebalancer.Key{ka})
			require.NoError(t, err)
			assert.Empty(t, own, "a window after the first read, nothing used since: idle (epoch/10 is 400 ms)")
		})
	}
}

// TestPressureSourceWindow: a read soon after another (woken by a flush)
// measures a rate over the window, not the time since that read, and
// lists only what grew since it; a gateway's flush that marks new
// pressure leaves the wake token, which WaitPressure pops once.
func TestPressureSourceWindow(t *testing.T) {
	const epoch = 10 * time.Second
	for name, c := range clients(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			e := rebalancer.EpochOf(time.Now(), epoch)
			t0 := rebalancer.EpochStart(e, epoch).Add(2 * time.Second)
			gw := limiter.NewRedisUsageSink(c, 4, epoch, 3)
			a := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "a"}
			ka := rebalancer.Key{PolicyID: "g", Subject: a.Key()}
			src := redisio.NewPressureSource(c, 4, epoch, 0)
			src.SetWindow(time.Second)
			read := func(at time.Time) []rebalancer.Pressure {
				t.Helper()
				got, err := src.Pressure(ctx, at)
				require.NoError(t, err)
				return got
			}

			woken, err := src.WaitPressure(ctx, time.Second)
			require.NoError(t, err)
			assert.False(t, woken, "no flush marked anything")
			assert.Empty(t, read(t0))
			failed, err := gw.WriteUsage(ctx, []limiter.UsageCount{{Epoch: e, PolicyID: "g", Subject: a, Demand: 40, Admitted: 10}})
			require.NoError(t, err)
			require.Empty(t, failed)
			woken, err = src.WaitPressure(ctx, time.Second)
			require.NoError(t, err)
			assert.True(t, woken, "the flush marked new pressure")
			woken, err = src.WaitPressure(ctx, time.Second)
			require.NoError(t, err)
			assert.False(t, woken, "one token per flush, popped once")
			// Woken 200 ms after the last read: 40 units over the 1 s
			// window, not over 200 ms.
			assert.Equal(t, []rebalancer.Pressure{{Key: ka, DemandMilli: 40_000}}, read(t0.Add(200*time.Millisecond)))
			assert.Empty(t, read(t0.Add(400*time.Millisecond)), "nothing grew since the last read")
		})
	}
}
