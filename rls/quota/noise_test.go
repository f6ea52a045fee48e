package quota

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// poisson draws a Poisson count of mean lambda (Knuth; lambda is small).
func poisson(rng *rand.Rand, lambda float64) uint64 {
	l, k, p := math.Exp(-lambda), uint64(0), 1.0
	for {
		p *= rng.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

// countFresh counts, from the ledger's rule, the actions that start a new
// Envoy bucket (anything but an extension), recording them.
func countFresh(l *ledger, now time.Time, acts []Action) int {
	n := 0
	for _, a := range acts {
		gs := l.sent[a.Envoy]
		amt, _ := AmountOf(Strategy(a.Unlimited, a.Amount))
		if k := len(gs); k == 0 || gs[k-1].amt != amt || !now.Add(l.inFlight).Before(gs[k-1].sentAt.Add(gs[k-1].ttl)) {
			n++
		}
		l.record(now, []Action{a})
	}
	return n
}

// TestNoisyDemandKeepsAssignments: ten Envoys each demanding 15/s
// (Poisson counts, reported every second) against a fair part of 9.9/s,
// as in rlqs-many-envoys. A low one-second count is noise: it must not
// lower an assignment that is raised back a second later, since every
// new assignment is a full Envoy bucket (the simulator's trace of that
// scenario saw 167 new assignments in 100 s before the damping). From
// 20 s on (the start's assignments, cut to fit beside each other, have
// been raised by then) the server starts few new buckets over 100 s,
// and the rates and bursts held, every new bucket's counted until it
// runs out, stay within the share at every step.
func TestNoisyDemandKeepsAssignments(t *testing.T) {
	cfg := DefaultConfig()
	c, err := NewCore(cfg)
	require.NoError(t, err)
	const k = BucketKey("edge/key=acct")
	share := Amount{RateMilli: 99_000, BurstMilli: 198_000}
	rng := rand.New(rand.NewPCG(1, 2))
	l := newLedger(cfg)
	now := t0
	l.record(now, c.SetShare(now, k, share, false))
	const n = 10
	fresh := 0
	step := 50 * time.Millisecond
	for at := time.Duration(0); at < 120*time.Second; at += step {
		now = t0.Add(at)
		var acts []Action
		for e := EnvoyID(1); e <= n; e++ {
			if off := time.Duration(e) * 50 * time.Millisecond; at >= off && (at-off)%time.Second == 0 {
				if !c.Known(k) { // forgotten while nobody reported; the driver sets it again
					acts = append(acts, c.SetShare(now, k, share, false)...)
				}
				acts = append(acts, c.Report(now, e, k, noisyUsage(poisson(rng, 15)))...)
			}
		}
		if at%(250*time.Millisecond) == 0 {
			acts = append(acts, c.Tick(now)...)
		}
		if f := countFresh(l, now, acts); at >= 20*time.Second {
			fresh += f
		}
		require.True(t, l.total(now).fits(share), "at %v the Envoys may admit %+v, above the share %+v", at, l.total(now), share)
	}
	t.Logf("%d new buckets from 20 s to 120 s", fresh)
	assert.LessOrEqual(t, fresh, 5, "new buckets in 100 s of steady, noisy demand")
}

// TestSuddenDropLowersAtOnce: a count significantly below the assignment
// (the traffic left the Envoy) lowers it at the next decision, so that
// the shift to another Envoy is not delayed by the damping.
func TestSuddenDropLowersAtOnce(t *testing.T) {
	c, err := NewCore(DefaultConfig())
	require.NoError(t, err)
	const k = BucketKey("b")
	now := t0
	c.SetShare(now, k, Amount{RateMilli: 100_000, BurstMilli: 100_000}, false)
	c.Report(now, 1, k, Usage{Allowed: 200, Elapsed: time.Second})
	c.Report(now, 2, k, Usage{Allowed: 5, Elapsed: time.Second})
	now = now.Add(10 * time.Second) // every grant ran out
	acts := c.Tick(now)
	require.Len(t, acts, 2)
	require.Equal(t, int64(95_000), acts[0].Amount.RateMilli)
	// A count of 80 in a second against 95/s: within noise of a Poisson
	// count? No: 80 + 3*sqrt(80) + 4.5 = 111 > 95, so it is noise.
	acts = c.Report(now.Add(time.Second), 1, k, Usage{Allowed: 80, Elapsed: time.Second})
	assert.Empty(t, acts, "80 of 95 in one second does not show a lower demand")
	// No request at all: lowered at once.
	acts = c.Report(now.Add(2*time.Second), 1, k, Usage{Elapsed: time.Second})
	require.Len(t, acts, 1)
	assert.Less(t, acts[0].Amount.RateMilli, int64(95_000))
}

// noisyUsage reports m requests over a second, of which what exceeds the
// Envoy's fair part (9.9/s) was denied.
func noisyUsage(m uint64) Usage {
	allowed := min(m, 10)
	return Usage{Allowed: allowed, Denied: m - allowed, Elapsed: time.Second}
}

func TestConfigValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		field string
		set   func(*Config)
	}{
		{"BurstSparePermille", func(c *Config) { c.BurstSparePermille = -1 }},
		{"BurstSparePermille", func(c *Config) { c.BurstSparePermille = 1000 }},
		{"LowerReports", func(c *Config) { c.LowerReports = 0 }},
		{"LowerReports", func(c *Config) { c.LowerReports = 65 }},
	} {
		cfg := DefaultConfig()
		tc.set(&cfg)
		err := cfg.Validate()
		require.ErrorIs(t, err, ErrConfig)
		assert.Contains(t, err.Error(), tc.field)
	}
	require.NoError(t, DefaultConfig().Validate())
}

// TestFairShareLowersAboveItsPart: an Envoy whose assignment is above its
// max-min fair part because the others asked little is lowered to its
// part once the others need more, even though its own demand is not
// significantly below its assignment (the damping of noise is for a
// target that fell with the Envoy's own demand, not with fairness).
// Before, a split of 18/8/8/8/8 on a share of 50 with every Envoy
// demanding 15 stayed so for good (rlqs-many-envoys with two replicas: a
// replica's five Envoys held 16.7 and 4 x 8.2, 2.3 to 2.8 % under).
func TestFairShareLowersAboveItsPart(t *testing.T) {
	cfg := DefaultConfig()
	c, err := NewCore(cfg)
	require.NoError(t, err)
	const k = BucketKey("b")
	share := Amount{RateMilli: 50_000, BurstMilli: 100_000}
	now := t0
	l := newLedger(cfg)
	l.record(now, c.SetShare(now, k, share, false))
	last := map[EnvoyID]Amount{}
	run := func(from, to time.Duration, demand func(EnvoyID) uint64) {
		for at := from; at < to; at += 250 * time.Millisecond {
			now = t0.Add(at)
			var acts []Action
			if at%time.Second == 0 {
				for e := EnvoyID(1); e <= 5; e++ {
					d := demand(e)
					allowed := min(d, uint64(last[e].RateMilli/1000))
					acts = append(acts, c.Report(now, e, k, Usage{Allowed: allowed, Denied: d - allowed, Elapsed: time.Second})...)
				}
			}
			acts = append(acts, c.Tick(now)...)
			l.record(now, acts)
			for _, a := range acts {
				last[a.Envoy] = a.Amount
			}
			require.True(t, l.total(now).fits(share), "at %v: %+v above the share", at, l.total(now))
		}
	}
	run(0, 30*time.Second, func(e EnvoyID) uint64 {
		if e == 1 {
			return 15
		}
		return 5
	})
	require.Equal(t, int64(18_000), last[1].RateMilli, "Envoy 1 holds 15 + its part of the spare")
	run(30*time.Second, 60*time.Second, func(EnvoyID) uint64 { return 15 })
	for e := EnvoyID(1); e <= 5; e++ {
		assert.InDelta(t, 10_000, last[e].RateMilli, 1_000, "Envoy %d holds %d milli/s of a fair 10/s", e, last[e].RateMilli)
	}
}
