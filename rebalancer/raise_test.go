package rebalancer

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/shares"
)

// TestRaisedLimitMovesTheDefaultClaim: keys at the default share have no
// record, so their gateways enforce the default of the limit in force; a
// raise must raise those claims with it, or the others grow into slack the
// raised defaults already hold (the harness checks the enforced sum after
// every write, with the gateways on the new limit at once).
func TestRaisedLimitMovesTheDefaultClaim(t *testing.T) {
	for seed := range uint64(20) {
		for _, mid := range []bool{false, true} {
			t.Run(fmt.Sprintf("seed %d mid %v", seed, mid), func(t *testing.T) { raise(t, seed, mid) })
		}
	}
}

func raise(t *testing.T, seed uint64, mid bool) {
	pol := PolicyMap{"api": {RateMilli: 3_000_000, BurstMilli: 6_000_000, Regions: 3}}
	cfg := DefaultConfig()
	c := newCluster(t, rand.New(rand.NewPCG(seed, 1)), three, cfg, pol, []Key{hot}, perfect{})
	c.fixRegions()
	c.deliverFirst = true
	everywhere := func(units ...int64) func(int, Key) int64 {
		return func(i int, _ Key) int64 { return units[i] }
	}
	// Demand above the limit in every region: everyone at the default, no
	// record anywhere.
	for e := e0; e < e0+10; e++ {
		c.step(e, everywhere(100_000, 100_000, 100_000))
	}
	for _, h := range c.regs {
		_, ok := h.store[hot]
		require.False(t, ok, "%s holds a record at the default", h.name)
	}
	// Raise to 6/s between the collection of an epoch (reports claim the
	// old default) and its decisions; ap (sorted first) now wants less than
	// the new default but more than the old one.
	c.afterCollect = func(e int64) {
		if e == e0+10 && mid {
			pol["api"] = shares.Limit{RateMilli: 6_000_000, BurstMilli: 12_000_000, Regions: 3}
		}
	}
	if !mid {
		pol["api"] = shares.Limit{RateMilli: 6_000_000, BurstMilli: 12_000_000, Regions: 3}
	}
	for e := e0 + 10; e < e0+20; e++ {
		c.step(e, everywhere(15_000, 100_000, 100_000))
	}
	var sum int64
	for _, h := range c.regs {
		sum += c.enforced(h, hot, c.epochStart(e0+20)).RateMilli
	}
	assert.GreaterOrEqual(t, sum, int64(6_000_000)*9/10, "the raised limit is used")
}
