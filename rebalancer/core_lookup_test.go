package rebalancer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/shares"
)

// TestLookupHintsChangeNothing: a Core that finds keys in reports through
// its hints and binary search, fed sorted reports, publishes and decides
// exactly what a Core that looks every key up in a map does, fed the same
// reports with their keys shuffled. Reports leave keys out, regions miss
// epochs (the latest report stands in), keys go idle and are forgotten and
// come back, one policy is unknown, and half the reports are deltas.
func TestLookupHintsChangeNothing(t *testing.T) {
	forgot, sparseDeltas, denseDeltas := 0, 0, 0
	defer func() {
		require.Greater(t, forgot, 20, "the scenarios must forget keys")
		require.Greater(t, sparseDeltas, 100, "deltas whose lines are indexed sparsely")
		require.Greater(t, denseDeltas, 50, "deltas whose lines are indexed densely")
	}()
	for seed := range uint64(40) {
		t.Run(fmt.Sprint("seed-", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			cfg := DefaultConfig()
			cfg.Region, cfg.Regions, cfg.Epoch, cfg.MaxWait = "a", []string{"a", "b", "c"}, time.Second, 200*time.Millisecond
			cfg.SilenceEpochs, cfg.WarmupEpochs, cfg.IdleTTLEpochs = 3, 4, 10
			lim := shares.Limit{RateMilli: 300_000, BurstMilli: 30_000, Regions: 3}
			pol := PolicyMap{"g": lim, "h": {RateMilli: 90_000, BurstMilli: 9_000, Regions: 3}}
			hinted, err := New(cfg, pol)
			require.NoError(t, err)
			plain, err := New(cfg, pol)
			require.NoError(t, err)
			plain.lookup = true

			fulls := map[string]*Report{} // by region: the last full report sent
			var keys []Key
			for i := range 60 {
				keys = append(keys, Key{PolicyID: []string{"g", "h", "unknown"}[i%3], Subject: fmt.Sprintf("k:%02d", i)})
			}
			slices.SortFunc(keys, compareKeys)
			base := EpochOf(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), cfg.Epoch)
			for e := base; e < base+40; e++ {
				var usage []Usage
				for i, k := range keys {
					// Keys go quiet for a few epochs, so that some are
					// forgotten while others still list them.
					if (int(e-base)/4+i)%2 == 0 && r.IntN(3) != 0 {
						d := r.Int64N(500)
						usage = append(usage, Usage{Key: k, Demand: d, Admitted: d / 2})
					}
				}
				now := EpochStart(e+1, cfg.Epoch)
				p1, err := hinted.Collect(now, usage)
				require.NoError(t, err)
				p2, err := plain.Collect(now, usage)
				require.NoError(t, err)
				require.Equal(t, p2, p1, "collect of epoch %d", e)
				require.True(t, slices.IsSortedFunc(p1.Updates, func(a, b Update) int { return compareKeys(a.Key, b.Key) }))
				if p1.Report != nil {
					require.True(t, slices.IsSortedFunc(p1.Report.Keys, func(a, b KeyReport) int { return compareKeys(a.Key, b.Key) }))
				}
				for _, region := range []string{"b", "c"} {
					if r.IntN(4) == 0 {
						continue // missed: the latest report stands in
					}
					rep := &Report{Region: region, Epoch: e, Seq: e,
						Heard: []Heard{{Region: "a", Epoch: e - 1}, {Region: region, Epoch: e}}}
					// Half the reports are deltas against the region's
					// last full one: they list a few keys, removed or
					// changed, or new (their lines indexed sparsely, or
					// densely when they list many).
					base, delta := fulls[region], fulls[region] != nil && r.IntN(2) == 0
					if delta {
						rep.Base = base.Epoch
					} else {
						fulls[region] = rep
					}
					inBase := map[Key]bool{}
					if delta {
						for _, k := range base.Keys {
							inBase[k.Key] = true
						}
					}
					many := r.IntN(3) == 0
					for _, k := range keys {
						if delta {
							switch {
							case inBase[k] && r.IntN(6) == 0:
								rep.Keys = append(rep.Keys, KeyReport{Key: k, Removed: true})
								continue
							case !many && r.IntN(5) != 0:
								continue // unchanged, or still absent
							}
						} else if r.IntN(2) == 0 {
							continue
						}
						switch l := pol[k.PolicyID]; r.IntN(3) {
						case 0: // listed idle at the default
							rep.Keys = append(rep.Keys, KeyReport{Key: k, Share: l.Default()})
							continue
						case 1: // busy at the default
							rep.Keys = append(rep.Keys, KeyReport{Key: k, Demand: 10, SmoothedDemandMilli: r.Int64N(300_000), Share: l.Default()})
							continue
						}
						rep.Keys = append(rep.Keys, KeyReport{Key: k, Demand: r.Int64N(900), SmoothedDemandMilli: r.Int64N(100_000),
							Share: shares.Share{RateMilli: r.Int64N(120_000), BurstMilli: r.Int64N(12_000)},
							Want:  shares.Share{RateMilli: r.Int64N(20_000), BurstMilli: r.Int64N(2_000)}})
					}
					shuffled := *rep
					shuffled.Keys = slices.Clone(rep.Keys)
					r.Shuffle(len(shuffled.Keys), func(i, j int) { shuffled.Keys[i], shuffled.Keys[j] = shuffled.Keys[j], shuffled.Keys[i] })
					rc1, err := hinted.Receive(rep)
					require.NoError(t, err)
					rc2, err := plain.Receive(&shuffled)
					require.NoError(t, err)
					require.Equal(t, rc2, rc1)
					if delta && rc1 == Accepted {
						if st := hinted.remote[hinted.index[region]].reports[e]; st.pos == nil && len(st.lines) > 0 {
							sparseDeltas++
						} else if st.pos != nil {
							denseDeltas++
						}
					}
				}
				at := now.Add(cfg.MaxWait)
				d1, err := hinted.Decide(at)
				require.NoError(t, err)
				d2, err := plain.Decide(at)
				require.NoError(t, err)
				require.Equal(t, d2, d1, "decision of epoch %d", e)
				require.True(t, slices.IsSortedFunc(d1.Updates, func(a, b Update) int { return compareKeys(a.Key, b.Key) }))
				require.Len(t, hinted.tidy(), hinted.Keys())
			}
			require.Equal(t, plain.Stats(), hinted.Stats())
			require.Positive(t, hinted.Stats().GrowDecisions, "the scenario must reach growth")
			if hinted.Keys() < 40 {
				forgot++
			}
		})
	}
}

// TestReceiveFindsDuplicatesSortedOrNot: a key twice is rejected whether
// the report's keys are sorted (neighbours) or not (anywhere).
func TestReceiveFindsDuplicatesSortedOrNot(t *testing.T) {
	cfg := testConfig("a", "a", "b")
	c, err := New(cfg, PolicyMap{"g": {RateMilli: 1000, BurstMilli: 1000, Regions: 2}})
	require.NoError(t, err)
	k := func(s string) KeyReport { return KeyReport{Key: Key{PolicyID: "g", Subject: s}} }
	for _, keys := range [][]KeyReport{
		{k("k:1"), k("k:2"), k("k:2"), k("k:3")},
		{k("k:3"), k("k:1"), k("k:2"), k("k:1")},
		{k("k:1"), k("k:3"), k("k:2"), k("k:3")},
	} {
		_, err := c.Receive(&Report{Region: "b", Epoch: 5, Seq: 5, Keys: keys})
		require.ErrorIs(t, err, ErrReport)
		require.ErrorContains(t, err, "twice")
	}
	rc, err := c.Receive(&Report{Region: "b", Epoch: 5, Seq: 5, Keys: []KeyReport{k("k:2"), k("k:1"), k("k:3")}})
	require.NoError(t, err)
	require.Equal(t, Accepted, rc)
}
