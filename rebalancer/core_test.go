package rebalancer

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/quotientlabs/quotient/shares"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	t0    = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) // a multiple of 10 s
	e0    = EpochOf(t0, 10*time.Second)
	hot   = Key{PolicyID: "api", Subject: "acct-1"}
	three = []string{"eu", "us", "ap"} // sorted: ap, eu, us
)

func testConfig(region string, regions ...string) Config {
	cfg := DefaultConfig()
	cfg.Region, cfg.Regions = region, regions
	// The timelines of these tests count a warm-up of K+1 epochs (the
	// default before the partition rule's majority, which needs 2K-1 and
	// is tested in heard_test.go).
	cfg.WarmupEpochs = cfg.SilenceEpochs + 1
	return cfg
}

func threeRegionCluster(t *testing.T, n net) *cluster {
	pol := PolicyMap{"api": {RateMilli: 3_000_000, BurstMilli: 6_000_000, Regions: 3}}
	cfg := DefaultConfig()
	// The tests on this cluster count epochs for K = 3.
	cfg.SilenceEpochs, cfg.WarmupEpochs = 3, 4
	c := newCluster(t, rand.New(rand.NewPCG(1, 1)), three, cfg, pol, []Key{hot}, n)
	c.fixRegions()
	c.deliverFirst = true
	return c
}

// demandIn returns a demand function: cost units per epoch in one region.
func demandIn(c *cluster, region string, units int64) func(int, Key) int64 {
	i := c.index(region)
	return func(j int, _ Key) int64 {
		if j == i {
			return units
		}
		return 0
	}
}

func TestEpochOf(t *testing.T) {
	for _, tc := range []struct {
		t    time.Time
		want int64
	}{
		{time.UnixMilli(0), 0},
		{time.UnixMilli(9_999), 0},
		{time.UnixMilli(10_000), 1},
		{time.UnixMilli(-1), -1},
		{time.UnixMilli(-10_000), -1},
		{time.UnixMilli(-10_001), -2},
	} {
		assert.Equal(t, tc.want, EpochOf(tc.t, 10*time.Second), "%v", tc.t)
	}
	assert.Equal(t, t0, EpochStart(e0, 10*time.Second).UTC())
}

func TestConfigValidate(t *testing.T) {
	cfg := Config{Region: "a", Regions: []string{"a", "b"}}
	require.NoError(t, cfg.Validate())
	assert.Equal(t, 10*time.Second, cfg.Epoch)
	assert.Equal(t, 2*time.Second, cfg.MaxWait)
	assert.Equal(t, int64(5), cfg.SilenceEpochs)
	assert.Equal(t, int64(9), cfg.WarmupEpochs)
	assert.Equal(t, int64(500), cfg.RiseSmoothingPermille)
	assert.False(t, cfg.ShrinkAtCollect)
	assert.Equal(t, int64(360), cfg.IdleTTLEpochs)
	for _, tc := range []struct {
		mut   func(*Config)
		field string
	}{
		{func(c *Config) { c.Region = "" }, "Region"},
		{func(c *Config) { c.Regions = nil }, "Regions"},
		{func(c *Config) { c.Region = "z" }, "does not contain"},
		{func(c *Config) { c.Regions = []string{"a", "a"} }, "twice"},
		{func(c *Config) { c.Regions = []string{"a", ""} }, "empty name"},
		{func(c *Config) { c.Epoch = 1500 * time.Microsecond }, "Epoch"},
		{func(c *Config) { c.MaxWait = 6 * time.Second }, "MaxWait"},
		{func(c *Config) { c.SilenceEpochs = 1 }, "SilenceEpochs"},
		{func(c *Config) { c.SmoothingPermille = 1001 }, "SmoothingPermille"},
		{func(c *Config) { c.RiseSmoothingPermille = 1001 }, "RiseSmoothingPermille"},
		{func(c *Config) { c.IdleTTLEpochs = 5 }, "IdleTTLEpochs"},
		{func(c *Config) { c.WarmupEpochs = 2 }, "WarmupEpochs"},
		{func(c *Config) { c.RecordEpochs = 2 }, "RecordEpochs 2 not in 3..SilenceEpochs+1 = 6"},
		{func(c *Config) { c.RecordEpochs = 7 }, "RecordEpochs 7 not in 3..SilenceEpochs+1 = 6"},
		{func(c *Config) { c.Shares.FloorPermille = -1 }, "FloorPermille"},
	} {
		cfg := testConfig("a", "a", "b")
		tc.mut(&cfg)
		err := cfg.Validate()
		require.ErrorIs(t, err, ErrConfig)
		assert.Contains(t, err.Error(), tc.field)
	}
	_, err := New(testConfig("a", "a"), nil)
	require.ErrorIs(t, err, ErrConfig)
}

// TestTimeline walks three regions through warm-up, the first reports and
// growth on a fixed timeline, checking what is published and written.
func TestTimeline(t *testing.T) {
	c := threeRegionCluster(t, perfect{})
	lim := c.policies["api"]
	eu := c.regs[c.index("eu")]
	demand := demandIn(c, "eu", 50_000) // 5,000 units/s: far above L = 3,000/s
	// Epochs 0..3: warm-up. Nothing is published or written.
	for e := e0; e < e0+4; e++ {
		c.step(e, demand)
	}
	for _, h := range c.regs {
		assert.Empty(t, h.reports, h.name)
		assert.Empty(t, h.store, h.name)
		for _, d := range h.decisions {
			assert.Equal(t, shares.Fallback, d.Mode)
			assert.Empty(t, d.Updates)
		}
	}
	// Epoch 4: first reports; nobody has heard anybody yet: fallback.
	c.step(e0+4, demand)
	rep := eu.reports[0]
	assert.Equal(t, "eu", rep.Region)
	assert.Equal(t, e0+4, rep.Epoch)
	assert.Equal(t, e0+4, rep.Seq)
	assert.Equal(t, []Heard{{Region: "eu", Epoch: e0 + 4}}, rep.Heard)
	require.Len(t, rep.Keys, 1)
	assert.Equal(t, int64(50_000), rep.Keys[0].Demand)
	assert.Equal(t, int64(25_000), rep.Keys[0].Admitted)
	assert.Equal(t, lim.Default(), rep.Keys[0].Share)
	assert.Equal(t, shares.Share{}, rep.Keys[0].Want, "in fallback nobody asks to grow")
	assert.Equal(t, shares.Fallback, eu.decisions[4].Mode)
	// The first decision after warm-up writes the key once (a record of a
	// previous coordinator may exist): here the default, so a delete.
	assert.Equal(t, []Update{{Key: hot, Share: lim.Default(), Delete: true}}, eu.decisions[4].Updates)
	for _, name := range []string{"ap", "us"} {
		d := c.regs[c.index(name)].decisions[4]
		require.Len(t, d.Updates, 1, name)
		assert.Less(t, d.Updates[0].Share.RateMilli, lim.Default().RateMilli, "%s shrinks at once", name)
		assert.Equal(t, EpochStart(e0+4+360, 10*time.Second), d.Updates[0].ExpireAt, "below default: long lifetime")
	}
	// Epoch 5: every region heard every other: complete views. eu's report
	// of epoch 5 still asks for nothing (it was in fallback when it
	// published), so nobody grows yet.
	c.step(e0+5, demand)
	rep = eu.reports[1]
	assert.Equal(t, []Heard{{"ap", e0 + 4}, {"eu", e0 + 5}, {"us", e0 + 4}}, rep.Heard)
	assert.Equal(t, shares.Share{}, rep.Keys[0].Want)
	assert.Equal(t, shares.Grow, eu.decisions[5].Mode)
	assert.Empty(t, eu.decisions[5].Updates)
	// Epoch 6: eu asks and grows into the slack the others' claims prove.
	c.step(e0+6, demand)
	assert.Positive(t, eu.reports[2].Keys[0].Want.RateMilli)
	d := eu.decisions[6]
	assert.Equal(t, shares.Grow, d.Mode)
	assert.True(t, d.Complete)
	require.Len(t, d.Updates, 1)
	assert.Greater(t, d.Updates[0].Share.RateMilli, lim.Default().RateMilli)
	assert.Equal(t, EpochStart(e0+6+3, 10*time.Second), d.Updates[0].ExpireAt, "above default: until the start of the decided epoch + K")
	// A region with all the demand gets >= 90% of L within a few epochs.
	c.step(e0+7, demand)
	s := c.share("eu", hot, e0+8)
	assert.GreaterOrEqual(t, s.RateMilli, lim.RateMilli*9/10, "%+v", s)
	assert.GreaterOrEqual(t, s.BurstMilli, lim.BurstMilli*9/10, "%+v", s)
	// Unchanged shares are not rewritten, but records above the default
	// are refreshed every K-2 epochs before they expire: with K = 3, at
	// every decision.
	for e := e0 + 8; e < e0+14; e++ {
		c.step(e, demand)
	}
	var writes int
	for _, d := range eu.decisions[10:14] {
		writes += len(d.Updates)
	}
	assert.Equal(t, 4, writes, "refreshes only: %+v", eu.decisions[10:14])
	for _, d := range eu.decisions[10:14] {
		for _, u := range d.Updates {
			assert.Equal(t, s, u.Share, "a refresh writes the same share")
		}
	}
	assert.Equal(t, s, c.share("eu", hot, e0+14))
}

// TestShrinkAtCollectFollowsAShiftInOneEpoch: with ShrinkAtCollect the old
// region gives up its share in the report of the epoch the demand moved,
// so the new region takes nearly all of the limit at the decision of that
// same epoch (the harness checks the enforced sum after every write, the
// collection's writes included).
func TestShrinkAtCollectFollowsAShiftInOneEpoch(t *testing.T) {
	pol := PolicyMap{"api": {RateMilli: 3_000_000, BurstMilli: 6_000_000, Regions: 3}}
	cfg := DefaultConfig()
	cfg.ShrinkAtCollect = true
	cfg.WarmupEpochs = cfg.SilenceEpochs + 1 // the timeline counts K+1 (see testConfig)
	c := newCluster(t, rand.New(rand.NewPCG(1, 1)), three, cfg, pol, []Key{hot}, perfect{})
	c.fixRegions()
	c.deliverFirst = true
	lim := c.policies["api"]
	for e := e0; e < e0+10; e++ {
		c.step(e, demandIn(c, "eu", 50_000))
	}
	require.GreaterOrEqual(t, c.share("eu", hot, e0+10).RateMilli, lim.RateMilli*9/10)
	c.step(e0+10, demandIn(c, "us", 50_000))
	us, eu := c.share("us", hot, e0+11), c.share("eu", hot, e0+11)
	assert.GreaterOrEqual(t, us.RateMilli, lim.RateMilli*9/10, "one epoch: us %+v eu %+v", us, eu)
	assert.LessOrEqual(t, eu.RateMilli, lim.Default().RateMilli/10, "eu gave its share up at collection")
	var kept int64
	for _, h := range c.regs {
		kept += h.core.Stats().Kept
	}
	assert.Positive(t, kept)
}

// TestLateReportsDelayGrowthWithoutFreezingIt: every report arrives after
// MaxWait (but within the next epoch). Each decision first holds at the
// deadline, then decides the epoch again with growth once the view is
// complete, so shares follow a shift as they do with timely reports, one
// part of an epoch later. (Before, every decision held: the region with
// the demand stayed at the default for as long as the latency lasted.)
func TestLateReportsDelayGrowthWithoutFreezingIt(t *testing.T) {
	pol := PolicyMap{"api": {RateMilli: 3_000_000, BurstMilli: 6_000_000, Regions: 3}}
	c := newCluster(t, rand.New(rand.NewPCG(1, 1)), three, DefaultConfig(), pol, []Key{hot}, perfect{})
	c.fixRegions()
	c.deliverFirst = true
	c.late = 1
	lim := c.policies["api"]
	var warm int64 = DefaultConfig().WarmupEpochs
	for e := e0; e < e0+warm+4; e++ {
		c.step(e, demandIn(c, "eu", 50_000))
	}
	require.GreaterOrEqual(t, c.share("eu", hot, e0+warm+4).RateMilli, lim.RateMilli*9/10)
	shift := e0 + warm + 4
	c.step(shift, demandIn(c, "us", 50_000))
	c.step(shift+1, demandIn(c, "us", 50_000))
	us := c.share("us", hot, shift+2)
	assert.GreaterOrEqual(t, us.RateMilli, lim.RateMilli*9/10, "us took the limit within the epoch after the shift")
	eu := c.regs[c.index("eu")]
	var again, grow int
	for _, d := range eu.decisions {
		if d.Again {
			again++
			assert.Equal(t, shares.Grow, d.Mode)
		}
		if d.Mode == shares.Grow {
			grow++
		}
	}
	assert.Equal(t, grow, again, "every growth came from a second decision")
	assert.Positive(t, again)
}

func TestDemandMovesAndSharesFollowWithinTwoEpochs(t *testing.T) {
	c := threeRegionCluster(t, perfect{})
	lim := c.policies["api"]
	for e := e0; e < e0+10; e++ {
		c.step(e, demandIn(c, "eu", 50_000))
	}
	require.GreaterOrEqual(t, c.share("eu", hot, e0+10).RateMilli, lim.RateMilli*9/10)
	// The demand moves to us in epoch 10; decisions 10 and 11 follow.
	for e := e0 + 10; e < e0+12; e++ {
		c.step(e, demandIn(c, "us", 50_000))
	}
	us, eu := c.share("us", hot, e0+12), c.share("eu", hot, e0+12)
	assert.Greater(t, us.RateMilli, eu.RateMilli, "within two epochs: us %+v eu %+v", us, eu)
	assert.GreaterOrEqual(t, us.RateMilli, lim.RateMilli*4/10)
	// The rest follows the old region's smoothed demand as it decays
	// (SmoothingPermille 500 halves it every epoch).
	for e := e0 + 12; e < e0+17; e++ {
		c.step(e, demandIn(c, "us", 50_000))
	}
	assert.GreaterOrEqual(t, c.share("us", hot, e0+17).RateMilli, lim.RateMilli*9/10)
}

// TestRejectedDemandCounts: a region whose requests are all rejected still
// gets a bigger share, because demand counts attempts, not admissions.
func TestRejectedDemandCounts(t *testing.T) {
	pol := PolicyMap{"api": {RateMilli: 3_000_000, BurstMilli: 3_000_000, Regions: 2}}
	cfg := testConfig("", "a", "b")
	a, err := New(testConfig("a", "a", "b"), pol)
	require.NoError(t, err)
	b, err := New(func() Config { c := cfg; c.Region, c.Regions = "b", []string{"a", "b"}; return c }(), pol)
	require.NoError(t, err)
	for e := e0; e < e0+10; e++ {
		end := EpochStart(e+1, 10*time.Second)
		pa, err := a.Collect(end, []Usage{{Key: hot, Demand: 40_000, Admitted: 0}})
		require.NoError(t, err)
		pb, err := b.Collect(end, nil)
		require.NoError(t, err)
		if pa.Report != nil {
			_, err = b.Receive(pa.Report)
			require.NoError(t, err)
			_, err = a.Receive(pb.Report)
			require.NoError(t, err)
		}
		_, err = a.Decide(end.Add(time.Second))
		require.NoError(t, err)
		_, err = b.Decide(end.Add(time.Second))
		require.NoError(t, err)
	}
	s, ok := a.Share(hot)
	require.True(t, ok)
	assert.GreaterOrEqual(t, s.RateMilli, int64(2_700_000))
}

// TestPartitionThenHeal cuts ap off (both ways) for ten epochs while eu has
// the demand. Every region that misses a region's reports for K epochs
// falls back to at most the default (ap, and eu and us too: they cannot
// tell whether ap still hears them); after K+1 epochs eu and us assume ap
// at exactly the default. The harness checks after every write that the
// enforced sum stays within L. After the heal, shares follow the demand
// again. This cluster's warm-up (K+1) is too short for the majority rule
// (it needs 2K-1; see TestMajorityKeepsServingThroughAPartition).
func TestPartitionThenHeal(t *testing.T) {
	ap := 0 // regions are sorted: ap, eu, us
	from, to := e0+10, e0+20
	c := threeRegionCluster(t, cut{drop: func(f, tt int, e int64) bool {
		return e >= from && e < to && (f == ap || tt == ap)
	}})
	lim := c.policies["api"]
	def := lim.Default()
	demand := func(i int, _ Key) int64 {
		if i == c.index("eu") {
			return 40_000
		}
		return 500 // ap and us: a little
	}
	for e := e0; e < from; e++ {
		c.step(e, demand)
	}
	require.GreaterOrEqual(t, c.share("eu", hot, from).RateMilli, lim.RateMilli*85/100)
	for e := from; e < to; e++ {
		c.step(e, demand)
	}
	const k = 3
	for _, name := range []string{"ap", "eu", "us"} {
		h := c.regs[c.index(name)]
		for _, d := range h.decisions[from-e0+k : to-e0] {
			assert.Equal(t, shares.Fallback, d.Mode, "%s decision %d", name, d.Epoch-e0)
		}
		assert.LessOrEqual(t, c.share(name, hot, to).RateMilli, def.RateMilli, name)
	}
	for _, name := range []string{"eu", "us"} {
		h := c.regs[c.index(name)]
		for _, d := range h.decisions[from-e0+k+1 : to-e0] {
			assert.Equal(t, []string{"ap"}, d.Silent, "%s decision %d", name, d.Epoch-e0)
		}
	}
	for e := to; e < to+8; e++ {
		c.step(e, demand)
	}
	for _, h := range c.regs {
		assert.Equal(t, shares.Grow, h.decisions[len(h.decisions)-1].Mode, h.name)
	}
	assert.GreaterOrEqual(t, c.share("eu", hot, to+8).RateMilli, lim.RateMilli*85/100)
}

// TestCrashedCoordinatorRecordsExpire: when a coordinator dies, records
// above the default expire before the others assume it at the default.
func TestCrashedCoordinatorRecordsExpire(t *testing.T) {
	c := threeRegionCluster(t, perfect{})
	lim := c.policies["api"]
	for e := e0; e < e0+10; e++ {
		c.step(e, demandIn(c, "eu", 50_000))
	}
	eu := c.regs[c.index("eu")]
	require.Greater(t, c.share("eu", hot, e0+10).RateMilli, lim.Default().RateMilli)
	eu.up = false
	for e := e0 + 10; e < e0+16; e++ {
		c.step(e, demandIn(c, "us", 50_000))
	}
	assert.Equal(t, lim.Default(), c.share("eu", hot, e0+14), "eu's record expired")
	us := c.regs[c.index("us")]
	assert.Equal(t, []string{"eu"}, us.decisions[len(us.decisions)-1].Silent)
	// Restart eu with a fresh Core: it stays silent during warm-up, then
	// takes part again.
	eu.up, eu.core = true, c.newCore("eu")
	for e := e0 + 16; e < e0+24; e++ {
		c.step(e, demandIn(c, "us", 50_000))
	}
	assert.Equal(t, shares.Grow, eu.decisions[len(eu.decisions)-1].Mode)
	assert.GreaterOrEqual(t, c.share("us", hot, e0+24).RateMilli, lim.RateMilli*85/100)
}

func TestIdleKeyReturnsToDefaultAndIsForgotten(t *testing.T) {
	c := threeRegionCluster(t, perfect{})
	for e := e0; e < e0+10; e++ {
		c.step(e, demandIn(c, "eu", 50_000))
	}
	for e := e0 + 10; e < e0+40; e++ {
		c.step(e, func(int, Key) int64 { return 0 })
	}
	for _, h := range c.regs {
		assert.Empty(t, h.store, "%s: every record deleted (the default applies)", h.name)
		assert.Zero(t, h.core.Keys(), "%s: no state kept", h.name)
		assert.Empty(t, h.reports[len(h.reports)-1].Keys, "%s: nothing to report", h.name)
	}
}

func newPair(t *testing.T, pol PolicyMap) (*Core, *Core) {
	a, err := New(testConfig("a", "b", "a"), pol)
	require.NoError(t, err)
	b, err := New(testConfig("b", "a", "b"), pol)
	require.NoError(t, err)
	return a, b
}

func TestReceive(t *testing.T) {
	pol := PolicyMap{"api": {RateMilli: 1000, BurstMilli: 1000, Regions: 2}}
	a, _ := newPair(t, pol)
	_, err := a.Collect(EpochStart(e0+1, 10*time.Second), nil)
	require.NoError(t, err)
	rep := func(e, seq int64) *Report {
		return &Report{Region: "b", Epoch: e, Seq: seq, Keys: []KeyReport{{Key: hot, Demand: 1}}}
	}
	for _, tc := range []struct {
		r    *Report
		want Receipt
	}{
		{rep(e0, e0), Accepted},
		{rep(e0, e0), Duplicate},
		{rep(e0, e0+7), Conflict},
		{rep(e0+2, e0+2), Accepted},
		{rep(e0+1, e0+1), Accepted}, // reordered but not yet decided
		{&Report{Region: "a", Epoch: e0, Seq: e0}, Own},
	} {
		got, err := a.Receive(tc.r)
		require.NoError(t, err)
		assert.Equal(t, tc.want.String(), got.String(), "%+v", tc.r)
	}
	_, err = a.Decide(EpochStart(e0+1, 10*time.Second))
	require.NoError(t, err)
	got, err := a.Receive(rep(e0-1, e0-1))
	require.NoError(t, err)
	assert.Equal(t, Stale, got, "older than the decided epoch and the latest")
	st := a.Stats()
	assert.Equal(t, Stats{Reports: 3, Duplicates: 1, Conflicts: 1, Stale: 1, Decisions: 1, FallbackEpochs: 1}, st)

	for _, tc := range []struct {
		r     *Report
		field string
	}{
		{nil, "nil"},
		{&Report{Region: "x", Epoch: 1, Seq: 1}, "Region"},
		{&Report{Region: "b", Epoch: -1, Seq: 1}, "Epoch"},
		{&Report{Region: "b", Epoch: 1, Seq: 0}, "Seq"},
		{&Report{Region: "b", Epoch: 9, Seq: 9, Keys: []KeyReport{{Key: Key{Subject: "s"}}}}, "PolicyID"},
		{&Report{Region: "b", Epoch: 9, Seq: 9, Keys: []KeyReport{{Key: hot, Demand: -1}}}, "negative Demand"},
		{&Report{Region: "b", Epoch: 9, Seq: 9, Keys: []KeyReport{{Key: hot, Share: shares.Share{RateMilli: -1}}}}, "Share"},
		{&Report{Region: "b", Epoch: 9, Seq: 9, Keys: []KeyReport{{Key: hot, Want: shares.Share{BurstMilli: -1}}}}, "Want"},
		{&Report{Region: "b", Epoch: 9, Seq: 9, Keys: []KeyReport{{Key: hot}, {Key: hot}}}, "twice"},
	} {
		_, err := a.Receive(tc.r)
		require.ErrorIs(t, err, ErrReport, tc.field)
		assert.Contains(t, err.Error(), tc.field)
	}
	assert.Equal(t, st, a.Stats(), "rejected reports change nothing")
}

func TestCollectErrorsChangeNothing(t *testing.T) {
	pol := PolicyMap{"api": {RateMilli: 1000, BurstMilli: 1000, Regions: 2}}
	a, _ := newPair(t, pol)
	end := EpochStart(e0+1, 10*time.Second)
	for _, tc := range []struct {
		u     Usage
		field string
	}{
		{Usage{Key: Key{Subject: "s"}}, "PolicyID"},
		{Usage{Key: hot, Demand: -1}, "Demand"},
		{Usage{Key: hot, Demand: 1, Admitted: 2}, "Admitted"},
	} {
		_, err := a.Collect(end, []Usage{{Key: hot, Demand: 5}, tc.u})
		require.ErrorIs(t, err, ErrUsage)
		assert.Contains(t, err.Error(), tc.field)
		assert.Contains(t, err.Error(), "entry 1")
	}
	assert.Zero(t, a.Keys())
	_, ok := a.Pending()
	assert.False(t, ok)
	p, err := a.Collect(end, []Usage{{Key: hot, Demand: 5}, {Key: hot, Demand: 5, Admitted: 5}})
	require.NoError(t, err)
	assert.Equal(t, e0, p.Epoch)
	_, err = a.Collect(end.Add(9*time.Second), nil)
	require.ErrorIs(t, err, ErrEpochNotOver)
	_, err = a.Collect(end.Add(-time.Minute), nil)
	require.ErrorIs(t, err, ErrEpochNotOver, "time going backwards")
	// A missed decision is made late, without growth, by the next Collect.
	p, err = a.Collect(end.Add(10*time.Second), nil)
	require.NoError(t, err)
	require.NotNil(t, p.Late)
	assert.Equal(t, e0, p.Late.Epoch)
	assert.Equal(t, int64(1), a.Stats().LateDecisions)
	_, err = a.Decide(end.Add(11 * time.Second))
	require.NoError(t, err)
	_, err = a.Decide(end.Add(12 * time.Second))
	require.ErrorIs(t, err, ErrNothingPending)
}

func TestUnknownAndMisfitPoliciesAreSkippedAndCounted(t *testing.T) {
	pol := PolicyMap{
		"api":   {RateMilli: 1000, BurstMilli: 1000, Regions: 2},
		"three": {RateMilli: 1000, BurstMilli: 1000, Regions: 3}, // deployment has 2 regions
	}
	a, _ := newPair(t, pol)
	cfg := a.Config()
	cfg.WarmupEpochs = cfg.SilenceEpochs + 1
	var last Published
	for e := e0; e < e0+cfg.WarmupEpochs+1; e++ {
		p, err := a.Collect(EpochStart(e+1, 10*time.Second), []Usage{
			{Key: Key{PolicyID: "gone", Subject: "s"}, Demand: 3},
			{Key: Key{PolicyID: "three", Subject: "s"}, Demand: 3},
			{Key: hot, Demand: 3},
		})
		require.NoError(t, err)
		last = p
		_, err = a.Receive(&Report{Region: "b", Epoch: e, Seq: e, Keys: []KeyReport{{Key: Key{PolicyID: "gone2", Subject: "s"}, Demand: 1}}})
		require.NoError(t, err)
		_, err = a.Decide(EpochStart(e+1, 10*time.Second))
		require.NoError(t, err)
	}
	require.NotNil(t, last.Report)
	require.Len(t, last.Report.Keys, 1)
	assert.Equal(t, hot, last.Report.Keys[0].Key)
	assert.Positive(t, a.Stats().UnknownPolicy)
	assert.Positive(t, a.Stats().InvalidPolicy)
	assert.Equal(t, 1, a.Keys())
}

func TestDueAndDeadline(t *testing.T) {
	pol := PolicyMap{"api": {RateMilli: 1000, BurstMilli: 1000, Regions: 2}}
	a, _ := newPair(t, pol)
	assert.False(t, a.Due(t0))
	assert.True(t, a.Deadline().IsZero())
	end := EpochStart(e0+1, 10*time.Second)
	_, err := a.Receive(&Report{Region: "b", Epoch: e0 - 1, Seq: e0 - 1})
	require.NoError(t, err)
	_, err = a.Collect(end, nil)
	require.NoError(t, err)
	assert.Equal(t, end.Add(2*time.Second), a.Deadline())
	assert.False(t, a.Due(end.Add(time.Second)), "b's report missing, wait not over")
	assert.True(t, a.Due(end.Add(2*time.Second)))
	_, err = a.Receive(&Report{Region: "b", Epoch: e0, Seq: e0})
	require.NoError(t, err)
	assert.True(t, a.Due(end.Add(time.Second)), "complete view")
}

// BenchmarkStep100k is one epoch of one region's core for 100,000 active
// keys of 3 regions: Collect (usage of every key), Receive of the two other
// regions' reports (100,000 keys each), Decide.
func BenchmarkStep100k(b *testing.B) { benchStep(b, 100_000) }

// BenchmarkStep1M is BenchmarkStep100k at a million keys (no Redis, about
// 2 GB of heap), run only with QUOTIENT_BENCH_1M=1. Its time follows the
// garbage collector's phase against the step's large short-lived slices
// (README, "The quiet epoch"): compare binaries in turns, and with
// GOGC=off for the code alone.
func BenchmarkStep1M(b *testing.B) {
	if os.Getenv("QUOTIENT_BENCH_1M") != "1" {
		b.Skip("needs about 1.5 GB of memory and a minute for its million keys; opt in with QUOTIENT_BENCH_1M=1")
	}
	benchStep(b, 1_000_000)
}

func benchStep(b *testing.B, n int) {
	pol := PolicyMap{"api": {RateMilli: 3_000_000, BurstMilli: 6_000_000, Regions: 3}}
	core, err := New(testConfig("eu", three...), pol)
	require.NoError(b, err)
	usage := make([]Usage, n)
	remoteKeys := make([]KeyReport, n)
	for i := range usage {
		k := Key{PolicyID: "api", Subject: fmt.Sprintf("acct-%06d", i)}
		usage[i] = Usage{Key: k, Demand: int64(i%5000) + 1, Admitted: int64(i%5000) / 2}
		remoteKeys[i] = KeyReport{Key: k, Demand: int64(i % 700), SmoothedDemandMilli: int64(i%700) * 100, Share: shares.Share{RateMilli: 900_000, BurstMilli: 1_800_000}}
	}
	e := e0
	step := func() {
		end := EpochStart(e+1, 10*time.Second)
		if _, err := core.Collect(end, usage); err != nil {
			b.Fatal(err)
		}
		for _, r := range []string{"ap", "us"} {
			heard := []Heard{{Region: "eu", Epoch: e - 1}, {Region: r, Epoch: e}}
			if _, err := core.Receive(&Report{Region: r, Epoch: e, Seq: e, Heard: heard, Keys: remoteKeys}); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := core.Decide(end.Add(time.Second)); err != nil {
			b.Fatal(err)
		}
		e++
	}
	for range 6 { // past warm-up
		step()
	}
	b.ReportAllocs()
	for b.Loop() {
		step()
	}
}
