package simulations

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/quotientlabs/quotient/limiter"
)

// BenchmarkOracleSplit measures what splitting a bucket between regions
// costs by itself, with nothing for the protocol to get wrong: Poisson
// arrivals of one key in three regions (half, 30% and 20% of the demand, as
// zipf-many-keys mixes them) against the scenario's `free` policy (10/s,
// burst 20), each region enforcing a static share computed from the true
// mean demand (in proportion to it, or max-min fair), scored per 60 s
// window against the simulator's ideal (one global bucket, fed second by
// second: trackedKey.idealMilli) as (admitted - ideal) / allowance. It
// reports the mean, 90th percentile and worst under-service over 300
// windows per demand. Near the limit even this oracle loses several
// percent per window, and the worst of a few hundred windows is above 5%:
// the floor under zipf-many-keys' keys that run at the limit (README,
// "zipf-many-keys").
func BenchmarkOracleSplit(b *testing.B) {
	const (
		rate, burst = 10.0, 20.0
		windowSec   = 60
		windows     = 300
	)
	mix := []float64{0.5, 0.3, 0.2}
	pol := &limiter.Policy{ID: "free", Scope: limiter.ScopeGlobal, Algorithm: limiter.TokenBucket, RatePerSec: rate, Burst: burst}
	if err := pol.Validate(); err != nil {
		b.Fatal(err)
	}
	for _, demand := range []float64{9, 10, 10.5, 11, 12} {
		for _, split := range []string{"proportional", "maxmin"} {
			shares := make([]float64, len(mix))
			if split == "proportional" {
				for i, m := range mix {
					shares[i] = rate * m
				}
			} else {
				shares = maxMinSplit(demand, mix, rate)
			}
			b.Run(fmt.Sprintf("demand=%g/%s", demand, split), func(b *testing.B) {
				var losses []float64
				for b.Loop() {
					losses = losses[:0]
					r := rand.New(rand.NewPCG(1, uint64(demand*10)))
					for w := 0; w < windows; w++ {
						losses = append(losses, oracleWindow(r, pol, demand, mix, shares, rate, burst, windowSec))
					}
				}
				slices.Sort(losses)
				var sum float64
				for _, l := range losses {
					sum += l
				}
				b.ReportMetric(100*sum/float64(len(losses)), "mean_under_%")
				b.ReportMetric(100*losses[len(losses)*9/10], "p90_under_%")
				b.ReportMetric(100*losses[len(losses)-1], "worst_under_%")
			})
		}
	}
}

// oracleWindow plays one window: Poisson arrivals per region, per-request
// regional buckets (full at the start, burst in proportion to the share)
// and the ideal; it returns (ideal - admitted) / allowance.
func oracleWindow(r *rand.Rand, pol *limiter.Policy, demand float64, mix, shares []float64, rate, burst float64, windowSec int) float64 {
	type arrival struct {
		t      float64
		region int
	}
	var arr []arrival
	for i, m := range mix {
		for t := r.ExpFloat64() / (demand * m); t < float64(windowSec); t += r.ExpFloat64() / (demand * m) {
			arr = append(arr, arrival{t, i})
		}
	}
	slices.SortFunc(arr, func(a, b arrival) int {
		switch {
		case a.t < b.t:
			return -1
		case a.t > b.t:
			return 1
		}
		return 0
	})
	tk := &trackedKey{policy: pol, secDemand: make([]int64, windowSec)}
	tokens := make([]float64, len(mix))
	last := make([]float64, len(mix))
	for i := range tokens {
		tokens[i] = burst * shares[i] / rate
	}
	var admitted int64
	for _, a := range arr {
		tk.secDemand[int(a.t)]++
		i := a.region
		tokens[i] = min(burst*shares[i]/rate, tokens[i]+(a.t-last[i])*shares[i])
		last[i] = a.t
		if tokens[i] >= 1 {
			tokens[i]--
			admitted++
		}
	}
	var ideal int64
	for _, v := range tk.idealMilli(0) {
		ideal += v
	}
	allowance := tk.allowanceMilli(int64(windowSec))
	return float64(ideal-admitted*1000) / float64(allowance)
}

// maxMinSplit water-fills rate over the regions' mean demands and spreads
// what is left in proportion (no floors: the oracle knows the demand).
func maxMinSplit(demand float64, mix []float64, rate float64) []float64 {
	lo, hi := 0.0, rate
	for range 100 {
		mid := (lo + hi) / 2
		var s float64
		for _, m := range mix {
			s += min(demand*m, mid)
		}
		if s <= rate {
			lo = mid
		} else {
			hi = mid
		}
	}
	out := make([]float64, len(mix))
	var sum float64
	for i, m := range mix {
		out[i] = min(demand*m, lo)
		sum += out[i]
	}
	for i := range out {
		out[i] += (rate - sum) * out[i] / sum
	}
	return out
}
