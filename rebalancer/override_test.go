package rebalancer

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/shares"
)

// overrideLookup is a SubjectPolicies: a PolicyMap plus one override of
// one key's limit over [from, to).
type overrideLookup struct {
	PolicyMap
	key      Key
	lim      shares.Limit
	from, to time.Time
}

var _ SubjectPolicies = (*overrideLookup)(nil)

func (o *overrideLookup) SubjectLimit(policyID, subject string, now time.Time) (shares.Limit, bool) {
	if (Key{PolicyID: policyID, Subject: subject}) != o.key || now.Before(o.from) || !now.Before(o.to) {
		return shares.Limit{}, false
	}
	return o.lim, true
}

// limitAt is what the gateways enforce for k at t (they apply the same
// override).
func (o *overrideLookup) limitAt(k Key, t time.Time) shares.Limit {
	if l, ok := o.SubjectLimit(k.PolicyID, k.Subject, t); ok {
		return l
	}
	return o.PolicyMap[k.PolicyID]
}

// TestOverrideLimitsTheShares: a lowering override of a busy key's global
// limit is what the shares follow from the first decision after it starts
// (before, the coordinators computed shares from the policy's limit, so
// the next share records undid the override); a raising one lets the
// shares grow beyond the policy's limit; when the override expires the
// policy's limit is restored. The enforced sum never exceeds the limit in
// force (or, within one epoch of a change, the one before it).
func TestOverrideLimitsTheShares(t *testing.T) {
	base := shares.Limit{RateMilli: 3_000_000, BurstMilli: 6_000_000, Regions: 3}
	for _, tc := range []struct {
		name string
		lim  shares.Limit
	}{
		{"lower", shares.Limit{RateMilli: 600_000, BurstMilli: 1_200_000, Regions: 3}},
		{"raise", shares.Limit{RateMilli: 6_000_000, BurstMilli: 9_000_000, Regions: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol := PolicyMap{"api": base}
			warm := DefaultConfig().WarmupEpochs
			start, end := e0+warm+4, e0+warm+12
			look := &overrideLookup{PolicyMap: pol, key: hot, lim: tc.lim,
				from: EpochStart(start, 10*time.Second), to: EpochStart(end, 10*time.Second)}
			c := newCluster(t, rand.New(rand.NewPCG(1, 1)), three, DefaultConfig(), pol, []Key{hot}, perfect{})
			c.lookup, c.limitAt = look, look.limitAt
			c.fixRegions()
			c.deliverFirst = true
			// The demand exceeds both limits.
			demand := demandIn(c, "eu", 100_000)
			// After step(e) the stores hold what is enforced in epoch e+1
			// once e is decided: look at its last instant.
			enforced := func(e int64) (eu, sum shares.Share) {
				at := c.epochStart(e + 2).Add(-time.Millisecond)
				for _, h := range c.regs {
					x := c.enforced(h, hot, at)
					sum.RateMilli += x.RateMilli
					sum.BurstMilli += x.BurstMilli
				}
				return c.enforced(c.regs[c.index("eu")], hot, at), sum
			}
			for e := e0; e < start-1; e++ {
				c.step(e, demand)
			}
			eu, _ := enforced(start - 2)
			require.GreaterOrEqual(t, eu.RateMilli, base.RateMilli*9/10, "before the override")
			for e := start - 1; e < end-1; e++ {
				c.step(e, demand) // e's collection, at the override's start, and decision
				eu, sum := enforced(e)
				assert.LessOrEqual(t, sum.RateMilli, tc.lim.RateMilli, "epoch %d of the override", e+1-start)
				assert.LessOrEqual(t, sum.BurstMilli, tc.lim.BurstMilli, "epoch %d of the override", e+1-start)
				if e >= start+2 {
					assert.GreaterOrEqual(t, eu.RateMilli, tc.lim.RateMilli*9/10, "eu holds most of the override's limit: %+v", eu)
				}
			}
			for e := end - 1; e < end+3; e++ {
				c.step(e, demand)
			}
			eu, sum := enforced(end + 2)
			assert.LessOrEqual(t, sum.RateMilli, base.RateMilli, "expired: the policy's limit again")
			assert.GreaterOrEqual(t, eu.RateMilli, base.RateMilli*9/10, "expired: eu back at most of the policy's limit: %+v", eu)
		})
	}
}
