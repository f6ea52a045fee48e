package rebalancer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/quotientlabs/quotient/shares"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// expandReport is the naive reference of a receiver's expansion: the
// full report that delta d of the same sender stands for, given the
// sender's full report base.
func expandReport(base, d *Report) *Report {
	out := *d
	out.Base = 0
	byKey := map[Key]KeyReport{}
	for _, k := range base.Keys {
		byKey[k.Key] = k
	}
	for _, k := range d.Keys {
		if k.Removed {
			delete(byKey, k.Key)
		} else {
			byKey[k.Key] = k
		}
	}
	out.Keys = nil
	for _, k := range byKey {
		out.Keys = append(out.Keys, k)
	}
	slices.SortFunc(out.Keys, func(a, b KeyReport) int { return compareKeys(a.Key, b.Key) })
	return &out
}

// TestDeltasDecideAsFullReports: random scenarios on a bus that loses
// nothing and keeps each sender's order (duplicates, late reports, skipped
// decisions, unknown and incomplete usage, failed publications, skewed
// clocks included), played with exact deltas (tolerance 0) and with full
// reports only: every decision and every store write is the same, no
// delta misses its base, and every delta expands to exactly the full
// report the other run published.
func TestDeltasDecideAsFullReports(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	cases := raceCases(300)
	var deltas, keysFull, keysDelta int
	for i := 0; i < cases; i++ {
		seed := r.Uint64()
		s := randScenario(rand.New(rand.NewPCG(seed, 1)))
		s.crashes = nil
		s.bus.loss, s.bus.maxDelay, s.bus.partitions = 0, 0, nil
		run := func(on bool) *cluster {
			s := s
			s.withDeltas(on, seed)
			if on {
				s.cfg.DeltaDemandPermille, s.cfg.DeltaExact = 0, true
			}
			return s.run(t, rand.New(rand.NewPCG(seed, 2)))
		}
		full, delta := run(false), run(true)
		for j, h := range delta.regs {
			f := full.regs[j]
			require.Equal(t, f.decisions, h.decisions, "seed %d region %s", seed, h.name)
			require.Equal(t, f.store, h.store, "seed %d region %s", seed, h.name)
			require.Zero(t, h.core.Stats().Unbased, "seed %d region %s", seed, h.name)
			require.Len(t, h.reports, len(f.reports))
			var base *Report
			for n, rep := range h.reports {
				want := f.reports[n]
				keysFull += len(want.Keys)
				keysDelta += len(rep.Keys)
				if rep.Base == 0 {
					base = rep
					require.Equal(t, want, rep, "seed %d region %s epoch %d", seed, h.name, rep.Epoch)
					continue
				}
				deltas++
				require.NotNil(t, base)
				require.Equal(t, base.Epoch, rep.Base)
				got := expandReport(base, rep)
				if len(got.Keys) == 0 {
					got.Keys = nil
				}
				require.Equal(t, want, got, "seed %d region %s epoch %d", seed, h.name, rep.Epoch)
			}
		}
	}
	t.Logf("%d deltas; key lines %d full, %d with deltas", deltas, keysFull, keysDelta)
	require.Greater(t, deltas, cases)
	require.Less(t, keysDelta, keysFull)
}

// deltaPair is two regions' Cores, a and b, with a's reports delivered to b.
func deltaPair(t *testing.T, tweak func(*Config)) (a, b *Core, lim shares.Limit) {
	lim = shares.Limit{RateMilli: 100_000, BurstMilli: 200_000, Regions: 2}
	mk := func(name string) *Core {
		cfg := DefaultConfig()
		cfg.Region, cfg.Regions = name, []string{"a", "b"}
		cfg.Epoch, cfg.MaxWait = time.Second, 200*time.Millisecond
		cfg.WarmupEpochs = cfg.SilenceEpochs + 1
		if tweak != nil {
			tweak(&cfg)
		}
		c, err := New(cfg, PolicyMap{"p": lim})
		require.NoError(t, err)
		require.NoError(t, c.StartFresh())
		return c
	}
	return mk("a"), mk("b"), lim
}

// TestDeltaReports follows one sender's reports: the first is full, then
// deltas that list only what changed (claims exactly, demand beyond the
// tolerance) and the keys gone, every FullEvery-th full again; a receiver
// without the base answers Unbased and counts the epoch as not heard,
// and applies the later deltas once the base arrived.
func TestDeltaReports(t *testing.T) {
	a, b, _ := deltaPair(t, func(c *Config) { c.FullEvery = 3 })
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e0 := EpochOf(t0, time.Second)
	keys := []Key{{"p", "k1"}, {"p", "k2"}, {"p", "k3"}}
	collect := func(c *Core, e int64, demand ...int64) *Report {
		var u []Usage
		for i, d := range demand {
			if d > 0 {
				u = append(u, Usage{Key: keys[i], Demand: d, Admitted: d})
			}
		}
		pub, err := c.Collect(EpochStart(e+1, time.Second), u)
		require.NoError(t, err)
		require.NotNil(t, pub.Report)
		return pub.Report
	}
	lines := func(r *Report) (out []string) {
		for _, k := range r.Keys {
			out = append(out, fmt.Sprintf("%s removed=%v", k.Subject, k.Removed))
		}
		return out
	}
	r0 := collect(a, e0, 10, 10, 10)
	assert.Zero(t, r0.Base, "the first report is full")
	assert.True(t, r0.AcceptsDelta)
	assert.Len(t, r0.Keys, 3)
	// Same demand: the smoothed demand still moves, so the keys are listed.
	r1 := collect(a, e0+1, 10, 10, 10)
	assert.Equal(t, e0, r1.Base)
	assert.Len(t, r1.Keys, 3)
	// A steady state: the next full report, then deltas that list nothing.
	var full *Report
	for e := e0 + 40; ; e++ {
		if r := collect(a, e, 10, 10, 0); r.Base == 0 && e > e0+45 {
			full = r
			break
		}
	}
	e := full.Epoch + 1
	d1 := collect(a, e, 10, 10, 0)
	assert.Equal(t, full.Epoch, d1.Base)
	assert.Empty(t, d1.Keys, "nothing changed: %v", lines(d1))
	// k2 idle (its smoothed demand falls to 0 at once, by the headroom
	// cap): removed in the delta; k1 unchanged, left out.
	d2 := collect(a, e+1, 10, 0, 0)
	assert.Equal(t, full.Epoch, d2.Base)
	assert.Equal(t, []string{"k2 removed=true"}, lines(d2))
	r3 := collect(a, e+2, 10, 0, 0)
	require.Zero(t, r3.Base, "FullEvery 3: every third report is full")

	// Receiver: a delta without its base is Unbased and not heard; after
	// the base, deltas apply.
	rc, err := b.Receive(d1)
	require.NoError(t, err)
	assert.Equal(t, Unbased, rc)
	assert.Equal(t, int64(1), b.Stats().Unbased)
	assert.False(t, b.remote[b.index["a"]].heard, "an unbased delta is not heard")
	rc, err = b.Receive(full)
	require.NoError(t, err)
	assert.Equal(t, Accepted, rc)
	rc, err = b.Receive(d2)
	require.NoError(t, err)
	assert.Equal(t, Accepted, rc)
	rc, err = b.Receive(d2)
	require.NoError(t, err)
	assert.Equal(t, Duplicate, rc)
	s := b.remote[b.index["a"]].reports[d2.Epoch]
	want := expandReport(full, d2)
	require.Len(t, slices.Collect(s.mentions()), len(want.Keys))
	for n, k := range want.Keys {
		j, ok := b.tab.find(k.Key)
		require.True(t, ok)
		l, ok := b.lineOf(s, j)
		require.True(t, ok, "line %d", n)
		assert.Equal(t, lineView{smoothed: k.SmoothedDemandMilli, share: k.Share, want: k.Want}, l)
	}
	// Stored as an overlay of the base, which it does not copy: the key it
	// removed is neither mentioned nor read through to the base.
	require.NotNil(t, s.base, "a delta is stored against its base")
	assert.Empty(t, s.lines, "d2 lists only a removal")
	j2, ok := b.tab.find(keys[1])
	require.True(t, ok)
	_, ok = b.lineOf(s, j2)
	assert.False(t, ok, "removed by the delta")
	assert.NotContains(t, slices.Collect(s.mentions()), j2)
	// A delta naming another base (a base the receiver does not hold).
	other := *d2
	other.Epoch, other.Seq, other.Base = d2.Epoch+1, d2.Seq+1, full.Epoch-1
	rc, err = b.Receive(&other)
	require.NoError(t, err)
	assert.Equal(t, Unbased, rc)
	// Malformed: Removed in a full report; a base not before the epoch.
	bad := *full
	bad.Epoch, bad.Seq = full.Epoch+10, full.Seq+10
	bad.Keys = []KeyReport{{Key: keys[0], Removed: true}}
	_, err = b.Receive(&bad)
	require.ErrorIs(t, err, ErrReport)
	bad.Base = bad.Epoch
	_, err = b.Receive(&bad)
	require.ErrorIs(t, err, ErrReport)
}

// TestDeltaOnlyToRegionsThatAcceptThem: a region that does not advertise
// AcceptsDelta (an older version) gets full reports only, from the
// first report of it heard; once it says it accepts them, deltas resume.
func TestDeltaOnlyToRegionsThatAcceptThem(t *testing.T) {
	a, _, lim := deltaPair(t, nil)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e0 := EpochOf(t0, time.Second)
	k := Key{"p", "k"}
	collect := func(e int64) *Report {
		pub, err := a.Collect(EpochStart(e+1, time.Second), []Usage{{Key: k, Demand: 10, Admitted: 10}})
		require.NoError(t, err)
		return pub.Report
	}
	from := func(e int64, accepts bool) {
		rc, err := a.Receive(&Report{Region: "b", Epoch: e, Seq: e, Heard: []Heard{{"a", e}, {"b", e}}, AcceptsDelta: accepts,
			Keys: []KeyReport{{Key: k, Share: lim.Default()}}})
		require.NoError(t, err)
		require.Equal(t, Accepted, rc)
	}
	require.Zero(t, collect(e0).Base)
	require.NotZero(t, collect(e0+1).Base, "no region heard: deltas")
	from(e0+1, false)
	for e := e0 + 2; e < e0+10; e++ {
		require.Zero(t, collect(e).Base, "epoch %d: b does not accept deltas", e)
		from(e, false)
	}
	from(e0+10, true)
	require.NotZero(t, collect(e0+10).Base, "b accepts deltas again")
	// A failed publication: the next report is full.
	a.NotPublished(e0 + 10)
	require.Zero(t, collect(e0+11).Base)
	// b not heard since before that base: it may lack it, so full.
	require.Zero(t, collect(e0+12).Base)
	from(e0+12, true) // b applied a's report of e0+12 (a full one)
	require.NotZero(t, collect(e0+13).Base)
}
