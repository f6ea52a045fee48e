package shares

import (
	"math/rand/v2"
	"testing"
)

// benchViews returns varied three-region views of one key each.
func benchViews(n int) ([]Limit, [][]RegionInput) {
	r := rand.New(rand.NewPCG(7, 8))
	lims := make([]Limit, n)
	views := make([][]RegionInput, n)
	for k := range views {
		lim := Limit{RateMilli: 1000 + r.Int64N(1_000_000_000), Regions: 3}
		lim.BurstMilli = lim.RateMilli * 2
		claims := randClaims(r, lim)
		in := make([]RegionInput, 3)
		for i := range in {
			in[i] = RegionInput{DemandMilli: randDemand(r, lim), Claim: claims[i], Want: Share{RateMilli: r.Int64N(lim.RateMilli / 3), BurstMilli: r.Int64N(lim.BurstMilli / 3)}}
		}
		lims[k], views[k] = lim, in
	}
	return lims, views
}

// BenchmarkCompute1M is what one region computes per epoch for 1,000,000
// keys shared by 3 regions: the want it publishes and its next share, per
// key. One op is 1,000,000 keys; the target is at most 1 s per op on one
// core. (The views cycle through 4096 varied keys so the benchmark measures
// the computation, not memory bandwidth.)
func BenchmarkCompute1M(b *testing.B) {
	lims, views := benchViews(4096)
	c := DefaultConfig()
	b.ReportAllocs()
	for b.Loop() {
		for k := 0; k < 1_000_000; k++ {
			j := k & 4095
			if _, err := c.Want(lims[j], 0, views[j]); err != nil {
				b.Fatal(err)
			}
			if _, err := c.Next(lims[j], 0, views[j], Grow); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkNext is one call of Next for one key of 3 regions.
func BenchmarkNext(b *testing.B) {
	lims, views := benchViews(4096)
	c := DefaultConfig()
	b.ReportAllocs()
	k := 0
	for b.Loop() {
		j := k & 4095
		k++
		if _, err := c.Next(lims[j], 0, views[j], Grow); err != nil {
			b.Fatal(err)
		}
	}
}
