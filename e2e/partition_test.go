package e2e

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestBinariesRegionCutOff runs each region as its own host (a network
// namespace with its redis-server, quotient coordinator and quotient
// gateway) and the broker on a host of its own, then cuts one region off
// from every other host with nftables (its gateway keeps serving its
// clients) for faultFor (40 s; 10 min under make e2e-faults) and heals it.
// The partition rule must keep the enforced sum within the global limit at
// every 100 ms sample; the test reports, per window, the over-admission of
// the global limit and the under-service of each side of the cut.
func TestBinariesRegionCutOff(t *testing.T) {
	inTurn(t)
	const (
		rate    = 30.0
		cutFrom = 25 * time.Second
	)
	cutFor := faultFor(t, 40*time.Second)
	cutTo := cutFrom + cutFor
	runTo := cutTo + 35*time.Second
	d := deployLab(t, fmt.Sprintf(`[{"id":"g","algorithm":"token_bucket","rate_per_sec":%v,"burst":%v,"scope":"global"}]`, rate, rate), `{"k":{"tier":"pro"}}`)

	cut := d.regions["ap-south"].host
	t0 := time.Now().Add(200 * time.Millisecond)
	shares := d.sampleShares(t0, "k", "g", rate)
	out := newOutcome(runTo)
	var wg sync.WaitGroup
	sendFlows(t0, []flow{
		{"k", "/x", "us-east", 35, 0, runTo},
		{"k", "/x", "eu-west", 5, 0, runTo},
		{"k", "/x", "ap-south", 20, 0, runTo},
	}, d.gateways(), out, &wg)
	wg.Go(func() {
		time.Sleep(time.Until(t0.Add(cutFrom))) // the schedule
		cut.Cut(d.broker, d.regions["us-east"].host, d.regions["eu-west"].host)
		time.Sleep(time.Until(t0.Add(cutTo))) // the schedule
		cut.Heal()
	})
	wg.Wait()
	shares.stop()

	assert.Positive(t, shares.samples.Load())
	assert.Zero(t, shares.violations.Load(), "Σ shares > L in %d of %d samples; first %v", shares.violations.Load(), shares.samples.Load(), shares.first.Load())
	t.Logf("Σ shares ≤ L: %d violations of %d samples (%d incomplete)", shares.violations.Load(), shares.samples.Load(), shares.incomplete.Load())
	step := 60
	if cutFor < 2*time.Minute {
		step = 20 // two overlapping windows over a short cut
	}
	sides := [][]string{{"ap-south"}, {"us-east", "eu-west"}}
	for _, w := range windowsOf(20, int(runTo/time.Second), 60, step) {
		e, under := sideErrors(out, "k", rate, w, sides)
		t.Logf("cut off %v-%v: window [%ds, %ds): global error %+.1f%%; under-service ap-south %.1f%%, us-east+eu-west %.1f%% (of L)",
			cutFrom, cutTo, w[0], w[1], 100*e, 100*under[0], 100*under[1])
		assert.LessOrEqual(t, e, 0.05, "over-admission beyond 5%% in window [%ds, %ds)", w[0], w[1])
	}
	t.Logf("per region admitted: us-east %d eu-west %d ap-south %d", out.perReg["k/us-east"], out.perReg["k/eu-west"], out.perReg["k/ap-south"])
}

// windowsOf lists the windows [from+i*step, from+i*step+length) that end
// by to (seconds).
func windowsOf(from, to, length, step int) [][2]int {
	var ws [][2]int
	for s := from; s+length <= to; s += step {
		ws = append(ws, [2]int{s, s + length})
	}
	return ws
}

// sideErrors scores one window of key against FORMAT.md's ideal global
// limiter (burst = rate): e is (admitted - ideal) / (rate x window), so
// positive is over-admission of the global limit. under[i] is the
// under-service of side i (a set of regions): how far its admitted total
// falls short of the max-min fair split of the rate over the regions'
// demand, second by second, as a fraction of rate x window (0 when it got
// its fair split or more).
func sideErrors(out *outcome, key string, rate float64, w [2]int, sides [][]string) (e float64, under []float64) {
	ideal := idealBucket(out.demand[key], func(int) float64 { return rate }, func(int) float64 { return rate })
	allowance := rate * float64(w[1]-w[0])
	var adm, id float64
	for s := w[0]; s < w[1]; s++ {
		adm += float64(out.admitted[key][s])
		id += ideal[s]
	}
	for _, side := range sides {
		var got, fair float64
		for s := w[0]; s < w[1]; s++ {
			demand := map[string]float64{}
			for _, r := range regions {
				demand[r] = float64(out.regSecs[key+"/"+r][0][s])
			}
			split := maxMinFair(rate, demand)
			for _, r := range side {
				got += float64(out.regSecs[key+"/"+r][1][s])
				fair += split[r]
			}
		}
		under = append(under, math.Max(0, fair-got)/allowance)
	}
	return (adm - id) / allowance, under
}

// maxMinFair splits capacity over demands by water-filling: every region
// gets min(demand, level), the level chosen so the split uses the whole
// capacity (or meets every demand).
func maxMinFair(capacity float64, demand map[string]float64) map[string]float64 {
	names := make([]string, 0, len(demand))
	for n := range demand {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		return demand[names[i]] < demand[names[j]] || demand[names[i]] == demand[names[j]] && strings.Compare(names[i], names[j]) < 0
	})
	out := map[string]float64{}
	left := capacity
	for i, n := range names {
		level := left / float64(len(names)-i)
		out[n] = math.Min(demand[n], level)
		left -= out[n]
	}
	return out
}
