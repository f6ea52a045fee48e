package rebalancer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/quotientlabs/quotient/shares"
	"github.com/stretchr/testify/require"
)

// Property tests of the partition rule (heard matrix, majority clique,
// silence over the matrix, fit under a silent region's default): the
// chaos bus of property_test.go plus cuts of single links, one way or
// both, symmetric minorities, splits, non-transitive cuts, healing and
// flapping, with loss, duplication, delay (reordering), late reports,
// missed decisions and crashes with restarts. The cluster checks the sum of
// what every region ENFORCES after every write.

// linkCut drops the reports from a to b (and b to a unless oneWay) in
// epochs [from, to); with period > 0 it flaps: on for period epochs, off
// for period epochs.
type linkCut struct {
	from, to int64
	a, b     int
	oneWay   bool
	period   int64
}

func (l linkCut) drops(from, to int, e int64) bool {
	if e < l.from || e >= l.to {
		return false
	}
	if l.period > 0 && ((e-l.from)/l.period)%2 == 1 {
		return false
	}
	return from == l.a && to == l.b || !l.oneWay && from == l.b && to == l.a
}

// heardNet is the chaos bus with link cuts on top.
type heardNet struct {
	base  *chaos
	cuts  []linkCut
	base0 int64 // absolute epoch of scenario epoch 0
}

func (h *heardNet) route(r *rand.Rand, from, to int, e int64) []int64 {
	for _, l := range h.cuts {
		if l.drops(from, to, e-h.base0) {
			return nil
		}
	}
	// The base's partitions are in scenario epochs too.
	return h.base.route(r, from, to, e-h.base0)
}

// cutKinds names the topologies heardScenario draws.
var cutKinds = []string{"minority", "split", "non-transitive", "one-way", "random-links", "isolate-in", "isolate-out", "isolate-late"}

// heardScenario draws a scenario of randScenario's kind with the
// partitions replaced by link cuts of one or two of cutKinds.
func heardScenario(r *rand.Rand) (scenario, []linkCut, []string) {
	s := randScenario(r)
	n := 2 + r.IntN(4)
	if r.IntN(3) == 0 {
		n = 3
	}
	// randScenario drew its own region count: redraw what depends on it.
	s.names = nil
	for i := 0; i < n; i++ {
		s.names = append(s.names, fmt.Sprintf("r%d", i))
	}
	for id, lim := range s.pol {
		lim.Regions = n
		s.pol[id] = lim
	}
	// Mostly the default warm-up, 2K-1, under which the majority rule
	// applies; sometimes K+1 (the rule before the heard matrix).
	s.cfg.WarmupEpochs = 2*s.cfg.SilenceEpochs - 1 + r.Int64N(2)
	if r.IntN(5) == 0 {
		s.cfg.WarmupEpochs = s.cfg.SilenceEpochs + 1
	}
	s.cfg.IdleTTLEpochs = max(s.cfg.IdleTTLEpochs, 2*(s.cfg.SilenceEpochs+2))
	s.bus.partitions = nil
	s.bus.loss *= 0.5 // the cuts are the point
	s.crashes = nil
	if r.IntN(3) == 0 {
		from := r.Int64N(s.epochs)
		s.crashes = append(s.crashes, crash{region: r.IntN(n), from: from, to: from + 1 + r.Int64N(10)})
	}
	s.demand = nil
	hot := r.IntN(n)
	hotAt := make([]int, s.epochs) // the region with most of the demand
	for e := int64(0); e < s.epochs; e++ {
		if r.IntN(8) == 0 {
			hot = r.IntN(n)
		}
		hotAt[e] = hot
		byRegion := make([][]int64, n)
		for i := range byRegion {
			byRegion[i] = make([]int64, len(s.keys))
			for k, key := range s.keys {
				rate := s.pol[key.PolicyID].RateMilli
				switch {
				case i == hot:
					byRegion[i][k] = r.Int64N(rate/500 + 2)
				case r.IntN(3) == 0:
					byRegion[i][k] = r.Int64N(rate/3000 + 2)
				}
			}
		}
		s.demand = append(s.demand, byRegion)
	}
	var cuts []linkCut
	var kinds []string
	var late *crash
	for range 1 + r.IntN(2) {
		kind := cutKinds[r.IntN(len(cutKinds))]
		kinds = append(kinds, kind)
		from := r.Int64N(s.epochs)
		to := from + 1 + r.Int64N(25)
		var period int64
		if r.IntN(4) == 0 {
			period = 1 + r.Int64N(4)
		}
		both := func(a, b int) { cuts = append(cuts, linkCut{from: from, to: to, a: a, b: b, period: period}) }
		perm := r.Perm(n)
		switch kind {
		case "minority", "split":
			size := 1 + r.IntN(max(1, (n-1)/2))
			if kind == "split" {
				size = 1 + r.IntN(n-1)
			}
			in := perm[:size]
			for _, a := range in {
				for b := 0; b < n; b++ {
					if !slices.Contains(in, b) {
						both(a, b)
					}
				}
			}
		case "non-transitive":
			if n >= 3 {
				both(perm[1], perm[2]) // perm[0] hears both
			} else {
				both(perm[0], perm[1])
			}
		case "one-way":
			cuts = append(cuts, linkCut{from: from, to: to, a: perm[0], b: perm[1%n], oneWay: true, period: period})
		case "random-links":
			for a := 0; a < n; a++ {
				for b := 0; b < n; b++ {
					if a != b && r.IntN(3) == 0 {
						cuts = append(cuts, linkCut{from: from, to: to, a: a, b: b, oneWay: true, period: period})
					}
				}
			}
		case "isolate-late":
			// The rise's worst case (TestRiseWaitsForRecordsUnderClockSkew):
			// perm[0] hears nobody from `from` on, but its next report (which
			// says it heard from-1) still reaches the others; the region with
			// the demand crashes after its decision of from-1+K, with a share
			// sized for perm[0]'s claim; clocks apart.
			k := s.cfg.SilenceEpochs
			rr := s.cfg.RecordEpochs
			if rr == 0 {
				rr = max(3, k-1) // Validate's default
			}
			to = from + k + rr + 2 + r.Int64N(10)
			for b := 0; b < n; b++ {
				if b != perm[0] {
					cuts = append(cuts, linkCut{from: from, to: to, a: b, b: perm[0], oneWay: true},
						linkCut{from: from + 1, to: to, a: perm[0], b: b, oneWay: true})
				}
			}
			if at := from + k; at < s.epochs && hotAt[at-1] != perm[0] {
				late = &crash{region: hotAt[at-1], from: at, to: at + 1 + r.Int64N(4)}
			}
			if s.skew == 0 {
				s.skew, s.skewSeed = (s.cfg.Epoch-s.cfg.MaxWait)/2-time.Millisecond, r.Uint64()
			}
		case "isolate-in", "isolate-out":
			for b := 0; b < n; b++ {
				if b == perm[0] {
					continue
				}
				if kind == "isolate-in" {
					cuts = append(cuts, linkCut{from: from, to: to, a: b, b: perm[0], oneWay: true, period: period})
				} else {
					cuts = append(cuts, linkCut{from: from, to: to, a: perm[0], b: b, oneWay: true, period: period})
				}
			}
		}
	}
	// A region that crashes while it is cut off, and restarts (a cold Core,
	// which rises to the default after its warm-up) while the cut lasts:
	// the others must have fit under its default by then.
	if len(cuts) > 0 && r.IntN(2) == 0 {
		l := cuts[0]
		from := l.from + r.Int64N(3)
		s.crashes = []crash{{region: l.a, from: from, to: from + 1 + r.Int64N(4)}}
	}
	if late != nil {
		s.crashes = []crash{*late}
	}
	return s, cuts, kinds
}

// runHeard plays a heardScenario; ref says whether each decision's mode
// is compared with the naive reference (refMode).
func runHeard(t testing.TB, s scenario, cuts []linkCut, seed uint64, ref bool) *cluster {
	var c *cluster
	return runHeardInto(t, &c, s, cuts, seed, ref)
}

// runHeardInto is runHeard that sets *out to the cluster before it runs
// (so that a failing run's state can be inspected).
func runHeardInto(t testing.TB, out **cluster, s scenario, cuts []linkCut, seed uint64, ref bool) *cluster {
	base := EpochOf(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), s.cfg.Epoch)
	net := &heardNet{base: s.bus, cuts: cuts, base0: base}
	c := newCluster(t, rand.New(rand.NewPCG(seed, 2)), s.names, s.cfg, s.pol, s.keys, net)
	*out = c
	c.fresh, c.pubFail = s.fresh, s.pubFail
	c.fixRegionsAt(base)
	if s.skew > 0 {
		c.setSkew(s.skew, s.skewSeed)
	}
	c.checkRef = ref
	c.skip, c.late, c.unknown, c.incomplete = s.skip, s.late, s.unknown, s.incomplete
	for e := int64(0); e < s.epochs; e++ {
		for _, cr := range s.crashes {
			h := c.regs[cr.region]
			if e == cr.from {
				h.up = false
			}
			if e == cr.to {
				h.up = true
				c.startCore(h, base+e)
			}
		}
		ep := base + e
		c.step(ep, func(i int, k Key) int64 { return s.demand[e][i][slices.Index(s.keys, k)] })
		c.check(c.epochStart(ep + 2))
	}
	return c
}

// heardCases is how many scenarios each property test plays: 3000, a
// twentieth in a race build (make test plays them all again without the
// race detector), 300 with -short.
func heardCases() int {
	if testing.Short() {
		return 300
	}
	return raceCases(3000)
}

// TestMajorityRuleKeepsSumWithinLimit plays thousands of random cut
// topologies with the safety check alone (no mode reference, so that a
// broken rule shows as an enforced sum above L, not as a mode mismatch)
// and requires the scenarios to exercise the rule: majorities that grow
// while a region is counted silent, regions kept out of fallback by the
// majority rule, fits under a silent region's default, and cut-off
// regions that rise to the default.
func TestMajorityRuleKeepsSumWithinLimit(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	var total, growSilent, capped, fallback, majority, aboveSilent, rose int
	for i := 0; i < heardCases(); i++ {
		seed := r.Uint64()
		s, cuts, kinds := heardScenario(rand.New(rand.NewPCG(seed, 1)))
		ok := t.Run(fmt.Sprintf("seed-%d-%v", seed, kinds), func(t *testing.T) {
			c := runHeard(t, s, cuts, seed, false)
			for _, h := range c.regs {
				for _, d := range h.decisions {
					total++
					capped += d.Capped
					switch {
					case d.Mode == shares.Fallback:
						fallback++
						if d.Rose {
							rose++
						}
					case len(d.Silent) > 0:
						majority++
						if d.Mode == shares.Grow {
							growSilent++
						}
						for _, u := range d.Updates {
							if s.pol[u.PolicyID].AboveDefault(u.Share) {
								aboveSilent++
							}
						}
					}
				}
			}
		})
		if !ok {
			return
		}
	}
	t.Logf("decisions %d: fallback %d (risen to the default %d), out of fallback with a silent region %d (growing %d, updates above the default %d), keys capped %d", total, fallback, rose, majority, growSilent, aboveSilent, capped)
	// Regions that heard nobody for K+R epochs rose to the default
	// (package doc, "Rise"): rising one epoch sooner (K+R-1; the
	// "isolate-late" cuts with clocks apart), or others counting such a
	// region at its claim, pushes the sum above L here.
	require.Greater(t, rose, total/500)
	require.Greater(t, majority, total/50)
	require.Greater(t, growSilent, total/100)
	require.Greater(t, aboveSilent, total/200)
	require.Greater(t, capped, total/200)
	require.Greater(t, fallback, total/20)
}

// TestMajorityRuleMatchesReference plays the same kind of scenarios with
// every decision's mode compared with the naive reference (refMode), which
// recomputes the rule from every report delivered.
func TestMajorityRuleMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for i := 0; i < heardCases()/3; i++ {
		seed := r.Uint64()
		s, cuts, kinds := heardScenario(rand.New(rand.NewPCG(seed, 1)))
		if !t.Run(fmt.Sprintf("seed-%d-%v", seed, kinds), func(t *testing.T) { runHeard(t, s, cuts, seed, true) }) {
			return
		}
	}
}
