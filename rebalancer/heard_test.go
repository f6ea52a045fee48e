package rebalancer

import (
	"time"

	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/quotientlabs/quotient/shares"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Scripted cuts of the partition rule; the cluster checks the enforced sum
// after every write and every decision's mode against refMode.

// heardCluster is a cluster of names (sorted) with K = 3 and the warm-up
// the majority rule needs (2K-1 = 5), limit 3/s (burst 6) per key.
func heardCluster(t *testing.T, names []string, n net) *cluster {
	pol := PolicyMap{"api": {RateMilli: 3_000_000, BurstMilli: 6_000_000, Regions: len(names)}}
	cfg := DefaultConfig()
	cfg.SilenceEpochs, cfg.WarmupEpochs = 3, 5
	c := newCluster(t, rand.New(rand.NewPCG(1, 1)), names, cfg, pol, []Key{hot}, n)
	c.fixRegions()
	c.deliverFirst = true
	return c
}

// cutLinks drops reports on the links (from, to) given, both ways, in
// epochs [from, to).
func cutLinks(from, to int64, pairs ...[2]int) cut {
	return cut{drop: func(f, tt int, e int64) bool {
		if e < from || e >= to {
			return false
		}
		for _, p := range pairs {
			if f == p[0] && tt == p[1] || f == p[1] && tt == p[0] {
				return true
			}
		}
		return false
	}}
}

// modes returns region name's decision modes for epochs [from, to).
func modes(c *cluster, name string, from, to int64) []shares.Mode {
	var out []shares.Mode
	for _, d := range c.regs[c.index(name)].decisions {
		if d.Epoch >= from && d.Epoch < to && !d.Again {
			out = append(out, d.Mode)
		}
	}
	return out
}

func repeatMode(m shares.Mode, n int64) []shares.Mode {
	out := make([]shares.Mode, n)
	for i := range out {
		out[i] = m
	}
	return out
}

// TestMajorityKeepsServingThroughAPartition cuts ap off (both ways) for
// twelve epochs while eu has the demand. ap falls back K epochs after the
// cut. eu and us hear each other, two of three: a majority, so they never
// fall back; they hold while ap's reports are missing (from K-1 epochs,
// when ap's last report shows it heard nobody since K epochs, fitting
// under max(ap's last claim, its default)), count ap at the default once
// no region they know of heard it for K+R-1 epochs (2K-1 with K = R = 3), and eu grows again
// above the default. ap, having heard nobody for K+R epochs, rises from
// its low share to the default it is counted at (package doc, "Rise").
// Before the heard matrix eu and us fell back too
// (TestPartitionThenHeal).
func TestMajorityKeepsServingThroughAPartition(t *testing.T) {
	ap := 0 // sorted: ap, eu, us
	from, to := e0+12, e0+24
	c := heardCluster(t, three, cut{drop: func(f, tt int, e int64) bool {
		return e >= from && e < to && (f == ap || tt == ap)
	}})
	lim := c.policies["api"]
	def := lim.Default()
	demand := func(i int, _ Key) int64 {
		if i == c.index("eu") {
			return 40_000
		}
		return 500
	}
	for e := e0; e < from; e++ {
		c.step(e, demand)
	}
	require.GreaterOrEqual(t, c.share("eu", hot, from).RateMilli, lim.RateMilli*85/100)
	require.Less(t, c.share("ap", hot, from).RateMilli, def.RateMilli/2)
	const k, r, s = 3, 3, 4 // K, R = max(3, K-1) and the silence bound K+R-2
	var held, fitEU, fitUS, apLow int64
	for e := from; e < to; e++ {
		c.step(e, demand)
		if e == from+k+r-2 {
			apLow = c.share("ap", hot, e+1).RateMilli // before the rise
		}
		if e == from+k-3 {
			held = c.share("eu", hot, e+1).RateMilli
		}
		if e == from+s-1 {
			fitEU, fitUS = c.share("eu", hot, e+1).RateMilli, c.share("us", hot, e+1).RateMilli
		}
	}
	assert.Equal(t, repeatMode(shares.Fallback, to-from-k), modes(c, "ap", from+k, to))
	// ap's last report received is of from-1: it rises at the decision
	// of from-1+K+R, and not before.
	assertRises(t, c, "ap", from-1+k+r, to)
	assert.Less(t, apLow, def.RateMilli/2)
	assert.Equal(t, def, c.share("ap", hot, to))
	for _, name := range []string{"eu", "us"} {
		assert.NotContains(t, modes(c, name, from, to), shares.Fallback, name)
		for _, d := range c.regs[c.index(name)].decisions {
			switch {
			case d.Epoch >= from && d.Epoch < from+s:
				assert.Empty(t, d.Silent, "%s decision %d", name, d.Epoch-e0)
			case d.Epoch >= from+s && d.Epoch < to:
				assert.Equal(t, []string{"ap"}, d.Silent, "%s decision %d", name, d.Epoch-e0)
			}
		}
	}
	// Held while ap was missing for less than K-1 epochs: eu kept its share.
	assert.GreaterOrEqual(t, held, lim.RateMilli*85/100)
	// Missing for K-1 epochs, its last report saying it heard nobody in
	// the last K, not yet silent: ap is counted at max(its last claim,
	// the default), since it may rise to the default once it has heard
	// nobody for K+R epochs, and its store may have restarted empty and
	// enforce the default (TestBinariesRedisKilled), so eu and us fit
	// under what ap's default leaves.
	assert.LessOrEqual(t, fitEU+fitUS, lim.RateMilli-def.RateMilli)
	// Counted ap at the default: eu serves above the default, up to what
	// ap's default leaves.
	eu, us := c.share("eu", hot, to).RateMilli, c.share("us", hot, to).RateMilli
	assert.Greater(t, eu, def.RateMilli*3/2)
	assert.LessOrEqual(t, eu+us, lim.RateMilli-def.RateMilli)
	for e := to; e < to+8; e++ {
		c.step(e, demand)
	}
	for _, h := range c.regs {
		assert.Equal(t, shares.Grow, h.decisions[len(h.decisions)-1].Mode, h.name)
	}
	assert.GreaterOrEqual(t, c.share("eu", hot, to+8).RateMilli, lim.RateMilli*85/100)
}

// TestTwoRegionsFallBackAsBefore: with two regions no majority can form
// without both, so a cut makes both fall back, as before the heard
// matrix.
func TestTwoRegionsFallBackAsBefore(t *testing.T) {
	from, to := e0+12, e0+22
	c := heardCluster(t, []string{"eu", "us"}, cutLinks(from, to, [2]int{0, 1}))
	d := demandIn(c, "eu", 40_000)
	for e := e0; e < to; e++ {
		c.step(e, d)
	}
	for _, name := range []string{"eu", "us"} {
		assert.Equal(t, repeatMode(shares.Fallback, to-from-3), modes(c, name, from+3, to), name)
		assert.LessOrEqual(t, c.share(name, hot, to).RateMilli, c.policies["api"].Default().RateMilli, name)
	}
}

// TestNonTransitiveCutHolds: eu and us stop hearing each other while ap
// hears both. Each of eu and us is in a majority with ap, so neither falls
// back, but neither counts the other silent either: ap's heard vector says
// ap still hears it. So both hold (no growth; their claims bound them)
// for the whole cut, and ap, which has every report, keeps growing from
// their claims. (Had each counted the other silent at the default and
// grown, the sum could exceed L.)
func TestNonTransitiveCutHolds(t *testing.T) {
	from, to := e0+12, e0+26
	c := heardCluster(t, three, cutLinks(from, to, [2]int{1, 2})) // eu, us
	demand := func(i int, _ Key) int64 { return []int64{40_000, 500, 500}[i] }
	for e := e0; e < to; e++ {
		c.step(e, demand)
	}
	for _, name := range []string{"eu", "us"} {
		assert.Equal(t, repeatMode(shares.Hold, to-from), modes(c, name, from, to), name)
		for _, d := range c.regs[c.index(name)].decisions {
			if d.Epoch >= from && d.Epoch < to {
				assert.Empty(t, d.Silent, "%s decision %d", name, d.Epoch-e0)
			}
		}
	}
	assert.Equal(t, repeatMode(shares.Grow, to-from), modes(c, "ap", from, to))
	assert.GreaterOrEqual(t, c.share("ap", hot, to).RateMilli, c.policies["api"].RateMilli*85/100)
}

// TestFiveRegionsMinorityCut cuts two of five regions off from the other
// three: the three keep serving (never in fallback, growing with the two
// counted at the default), the two fall back.
func TestFiveRegionsMinorityCut(t *testing.T) {
	names := []string{"r0", "r1", "r2", "r3", "r4"}
	from, to := e0+12, e0+26
	var pairs [][2]int
	for _, a := range []int{3, 4} {
		for _, b := range []int{0, 1, 2} {
			pairs = append(pairs, [2]int{a, b})
		}
	}
	c := heardCluster(t, names, cutLinks(from, to, pairs...))
	d := demandIn(c, "r0", 40_000)
	for e := e0; e < to; e++ {
		c.step(e, d)
	}
	lim := c.policies["api"]
	for _, name := range []string{"r3", "r4"} {
		assert.Equal(t, repeatMode(shares.Fallback, to-from-3), modes(c, name, from+3, to), name)
	}
	for _, name := range []string{"r0", "r1", "r2"} {
		assert.NotContains(t, modes(c, name, from, to), shares.Fallback, name)
		last := c.regs[c.index(name)].decisions[len(c.regs[c.index(name)].decisions)-1]
		assert.Equal(t, []string{"r3", "r4"}, last.Silent, name)
		assert.Equal(t, shares.Grow, last.Mode, name)
	}
	assert.Greater(t, c.share("r0", hot, to).RateMilli, 2*lim.Default().RateMilli)
}

// TestAsymmetricLoss: when nobody hears ap (its reports are lost, it hears
// everyone), the others count it silent and keep serving, and ap, which
// their heard vectors show unheard, is in no majority and falls back. When
// ap hears nobody (everyone hears it), ap falls back and the others, a
// majority, keep deciding from its reports; since those show that ap heard
// nobody for K epochs, they count it at the default and do not grow
// (holding, fitted under its default), and ap, having heard nobody for K+R
// epochs, rises to the default (package doc, "Rise"). (Before the heard
// matrix both cases made every region fall back.)
func TestAsymmetricLoss(t *testing.T) {
	for _, out := range []bool{true, false} {
		t.Run(fmt.Sprintf("ap-unheard=%v", out), func(t *testing.T) {
			from, to := e0+12, e0+26
			c := heardCluster(t, three, cut{drop: func(f, tt int, e int64) bool {
				return e >= from && e < to && (out && f == 0 || !out && tt == 0)
			}})
			// ap and eu both busy: an unheard ap that kept growing (it hears
			// everyone, so its views are complete) while the others count it
			// at the default would push the sum above L.
			d := func(i int, _ Key) int64 { return []int64{40_000, 40_000, 500}[i] }
			for e := e0; e < to; e++ {
				c.step(e, d)
			}
			const k, r = 3, 3 // K and R = max(3, K-1)
			def := c.policies["api"].Default()
			assert.Equal(t, repeatMode(shares.Fallback, to-from-k), modes(c, "ap", from+k, to))
			for _, name := range []string{"eu", "us"} {
				assert.NotContains(t, modes(c, name, from, to), shares.Fallback, name)
			}
			if out {
				for _, name := range []string{"eu", "us"} {
					assert.Contains(t, modes(c, name, to-3, to), shares.Grow, name)
				}
				assert.Greater(t, c.share("eu", hot, to).RateMilli, def.RateMilli)
				assertRises(t, c, "ap", to, to) // it hears everyone: never
				return
			}
			// ap's reports of from-1+k on say it heard nobody since from-1.
			for _, name := range []string{"eu", "us"} {
				assert.Equal(t, repeatMode(shares.Hold, to-from-k), modes(c, name, from+k, to), name)
			}
			assertRises(t, c, "ap", from-1+k+r, to)
			assert.Equal(t, def, c.share("ap", hot, to))
			assert.LessOrEqual(t, c.share("eu", hot, to).RateMilli+c.share("us", hot, to).RateMilli, c.policies["api"].RateMilli-def.RateMilli)
		})
	}
}

// assertRises checks that region name's decisions rose to the default
// (Decision.Rose) exactly from epoch from on, until epoch to.
func assertRises(t *testing.T, c *cluster, name string, from, to int64) {
	t.Helper()
	for _, d := range c.regs[c.index(name)].decisions {
		if d.Epoch < to {
			assert.Equal(t, d.Epoch >= from, d.Rose, "%s decision of epoch %d: rose", name, d.Epoch-e0)
		}
	}
}

// TestRelayCarriesTheMatrix: a report relays, for each other region, the
// heard vector of the newest report of it the sender knows, with its epoch
// and Started; a receiver keeps the newest row per region whatever the
// order, and a report from an older sender (Started 0, no relay) is no
// evidence for the majority rule.
func TestRelayCarriesTheMatrix(t *testing.T) {
	cfg := testConfig("ap", three...)
	c, err := New(cfg, PolicyMap{})
	require.NoError(t, err)
	m := e0 + 20
	eu := &Report{Region: "eu", Epoch: m, Seq: m, Started: m - 10,
		Heard: []Heard{{"eu", m}, {"us", m - 1}, {"ap", m - 1}},
		Relay: []Relayed{{Region: "us", Epoch: m - 1, Started: m - 12, Heard: []Heard{{"us", m - 1}, {"eu", m - 2}}}}}
	us := &Report{Region: "us", Epoch: m - 3, Seq: m - 3, Heard: []Heard{{"us", m - 3}}} // older sender, older report
	for _, r := range []*Report{us, eu, us} {
		_, err := c.Receive(r)
		require.NoError(t, err)
	}
	q := c.remote[c.index["us"]].row
	assert.Equal(t, m-1, q.epoch, "the relayed row of us (newer) wins over its own older report")
	assert.Equal(t, m-12, q.started)
	assert.Equal(t, m-2, q.heard[c.index["eu"]])
	assert.Equal(t, int64(noEpoch), q.heard[c.index["ap"]])
	got := c.relay()
	require.Len(t, got, 2)
	assert.Equal(t, Relayed{Region: "eu", Epoch: m, Started: m - 10, Heard: []Heard{{"ap", m - 1}, {"eu", m}, {"us", m - 1}}}, got[0])
	assert.Equal(t, "us", got[1].Region)

	// Evidence: a row whose sender's Core is younger than K+1 epochs, or
	// did not say when it started, does not count.
	assert.True(t, c.usable(c.index["eu"], m))
	c.remote[c.index["eu"]].row.started = m - 3
	assert.False(t, c.usable(c.index["eu"], m))
	c.remote[c.index["eu"]].row.started = 0
	assert.False(t, c.usable(c.index["eu"], m))

	_, err = c.Receive(&Report{Region: "eu", Epoch: m + 1, Seq: m + 1, Relay: []Relayed{{Region: "us", Epoch: m + 5}}})
	require.ErrorIs(t, err, ErrReport)
	assert.ErrorContains(t, err, "relayed report 0")
	_, err = c.Receive(&Report{Region: "eu", Epoch: m + 1, Seq: m + 1, Started: m + 2})
	require.ErrorIs(t, err, ErrReport)
	assert.ErrorContains(t, err, "Started")
}

// TestClique checks the clique search on small graphs.
func TestClique(t *testing.T) {
	// 0-1, 1-2, 0-2 a triangle; 3 linked to 0 only.
	adj := []uint32{0b1110, 0b0101, 0b0011, 0b0001}
	assert.True(t, clique(adj, 0b1111, 3))
	assert.False(t, clique(adj, 0b1111, 4))
	assert.False(t, clique(adj, 0b1011, 3)) // without 2
	assert.True(t, clique(adj, 0b1001, 2))
	assert.True(t, clique(adj, 0, 0))
}

// TestDefaultWarmupAllowsTheMajorityRule: the default configuration's
// warm-up is 2K-1 epochs, at least the K+R-1 the majority rule needs.
func TestDefaultWarmupAllowsTheMajorityRule(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Region, cfg.Regions = "ap", three
	require.NoError(t, cfg.Validate())
	assert.Equal(t, 2*cfg.SilenceEpochs-1, cfg.WarmupEpochs)
	c, err := New(cfg, PolicyMap{})
	require.NoError(t, err)
	assert.True(t, c.majorityOn())
	// R = max(3, K-1) = 4: silent after K+R-1 = 8 epochs (9 before the
	// records' lifetime was R), rising after K+R = 9.
	assert.Equal(t, int64(4), cfg.RecordEpochs)
	assert.Equal(t, cfg.SilenceEpochs+cfg.RecordEpochs-2, c.silenceBound())
}

// TestUnheardRegionThatGrewThenCrashed: ap's reports stop reaching anyone
// while it still hears everyone, so it goes on growing (its views are
// complete) for a few epochs, then its coordinator dies with records above
// the default. eu and us must not count ap at the default before those
// records expire: silence takes K+R-1 epochs (5 here, 2K-1), not K+1
// (package doc, the lemma and (2)).
func TestUnheardRegionThatGrewThenCrashed(t *testing.T) {
	from := e0 + 12
	c := heardCluster(t, three, cut{drop: func(f, _ int, e int64) bool { return e >= from && f == 0 }})
	demand := func(e int64) func(int, Key) int64 {
		return func(i int, _ Key) int64 {
			switch {
			case i == 0:
				return 40_000
			case i == 1 && (e < from || e >= from+3):
				return 40_000
			}
			return 500
		}
	}
	lim := c.policies["api"]
	var before, after int64
	for e := e0; e < from+14; e++ {
		if e == from+2 {
			c.regs[0].up = false // ap's coordinator dies
		}
		c.step(e, demand(e))
		switch e {
		case from - 1:
			before = c.share("ap", hot, e+1).RateMilli
		case from + 1:
			after = c.share("ap", hot, e+1).RateMilli
		}
	}
	grew := after > before && after > lim.Default().RateMilli
	assert.True(t, grew, "ap grew while unheard")
	eu := c.regs[c.index("eu")]
	last := eu.decisions[len(eu.decisions)-1]
	assert.Equal(t, []string{"ap"}, last.Silent)
	assert.Greater(t, c.share("eu", hot, from+14).RateMilli, lim.Default().RateMilli)
}

// TestShortWarmupKeepsTheRuleBeforeTheMatrix: with K = 5 and a warm-up of
// K+1 (below the max(2K-1, K+R-1) the majority rule needs), a cut makes every region
// fall back as before the heard matrix. It has to: here ap, cut off with a
// small share, crashes and restarts while cut; its new coordinator rises
// to the default after its 6-epoch warm-up, before the others would count
// it silent (K+R-1 = 8 epochs), so a majority still holding shares sized for
// ap's small claim would push the sum above L.
func TestShortWarmupKeepsTheRuleBeforeTheMatrix(t *testing.T) {
	pol := PolicyMap{"api": {RateMilli: 3_000_000, BurstMilli: 6_000_000, Regions: 3}}
	cfg := DefaultConfig()
	cfg.WarmupEpochs = cfg.SilenceEpochs + 1
	c := newCluster(t, rand.New(rand.NewPCG(1, 1)), three, cfg, pol, []Key{hot}, nil)
	from, to := e0+14, e0+34
	c.net = cut{drop: func(f, tt int, e int64) bool { return e >= from && e < to && (f == 0 || tt == 0) }}
	c.fixRegions()
	c.deliverFirst = true
	demand := func(e int64) func(int, Key) int64 {
		return func(i int, _ Key) int64 {
			if i == 0 && e < from {
				return 200 // ap: a small share before the cut
			}
			return 40_000
		}
	}
	for e := e0; e < to; e++ {
		switch e {
		case from:
			c.regs[0].up = false
		case from + 1:
			c.regs[0].up = true
			c.regs[0].core = c.newCore("ap")
			c.regs[0].received = nil
		}
		c.step(e, demand(e))
	}
	for _, name := range []string{"eu", "us"} {
		assert.Contains(t, modes(c, name, from+5, to), shares.Fallback, name)
	}
}

// TestRiseWaitsForRecordsUnderClockSkew plays the worst case of the rise
// (package doc, "Rise"): ap hears nobody from epoch from on, but its
// report of from (which says it heard from-1 = h) still reaches eu and
// us, so they count it at the default only from their decisions of h+K+1
// on; eu, which has the demand and a share sized for ap's small claim,
// crashes after its decision of h+K, whose record lives until the start
// of h+K+R. ap's clock is 3 s ahead of the others (the clock assumption
// allows up to (Epoch-MaxWait)/2 = 4 s in the harness). ap rises at its
// decision of h+K+R, after that record expired; one epoch sooner its
// rise would take effect, in true time, while eu's record is still in
// force, and the enforced sum would exceed L.
func TestRiseWaitsForRecordsUnderClockSkew(t *testing.T) {
	ap, eu := 0, 1 // sorted: ap, eu, us
	from, to := e0+12, e0+24
	c := heardCluster(t, three, cut{drop: func(f, tt int, e int64) bool {
		return e >= from && tt == ap || e >= from+1 && f == ap
	}})
	c.setSkew(3*time.Second, 1)
	for i, h := range c.regs {
		h.offset = 0
		if i == ap {
			h.offset = 3 * time.Second
		}
	}
	lim := c.policies["api"]
	def := lim.Default()
	demand := func(i int, _ Key) int64 {
		if i == eu {
			return 40_000
		}
		return 500
	}
	const k, r = 3, 3 // K and R = max(3, K-1)
	h := from - 1     // the last epoch of a report ap receives
	for e := e0; e < to; e++ {
		if e == h+k+1 {
			c.regs[eu].up = false // its last decision is of h+K
		}
		c.step(e, demand)
		if e == h+k {
			require.Greater(t, c.share("eu", hot, e+2).RateMilli+c.share("us", hot, e+2).RateMilli+def.RateMilli, lim.RateMilli,
				"eu's record of its decision of h+K, with ap at the default, exceeds L")
		}
	}
	assertRises(t, c, "ap", h+k+r, to)
	assert.Equal(t, def, c.share("ap", hot, to))
}
