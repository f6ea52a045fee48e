package shares

import (
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func live(demand int64, claim Share) RegionInput {
	return RegionInput{DemandMilli: demand, Claim: claim}
}

func TestDefault(t *testing.T) {
	assert.Equal(t, Share{RateMilli: 333, BurstMilli: 666}, Limit{RateMilli: 1000, BurstMilli: 2000, Regions: 3}.Default())
	assert.Equal(t, Share{}, Limit{}.Default())
}

func TestLimitValidate(t *testing.T) {
	for _, tc := range []struct {
		lim   Limit
		field string
	}{
		{Limit{RateMilli: 0, BurstMilli: 1, Regions: 1}, "RateMilli"},
		{Limit{RateMilli: MaxLimitMilli + 1, BurstMilli: 1, Regions: 1}, "RateMilli"},
		{Limit{RateMilli: 1, BurstMilli: -1, Regions: 1}, "BurstMilli"},
		{Limit{RateMilli: 1, BurstMilli: 1, Regions: 0}, "Regions"},
		{Limit{RateMilli: 1, BurstMilli: 1, Regions: MaxRegions + 1}, "Regions"},
	} {
		err := tc.lim.Validate()
		require.ErrorIs(t, err, ErrLimit)
		assert.Contains(t, err.Error(), tc.field)
	}
	require.NoError(t, Limit{RateMilli: 1, BurstMilli: 0, Regions: 1}.Validate())
}

func TestConfigValidate(t *testing.T) {
	c := Config{}
	require.NoError(t, c.Validate())
	assert.Equal(t, int64(1000), c.DampingPermille, "zero damping is filled")
	assert.Equal(t, int64(1250), c.HeadroomPermille, "zero headroom is filled")
	for _, tc := range []struct {
		mut   func(*Config)
		field string
	}{
		{func(c *Config) { c.FloorPermille = 1001 }, "FloorPermille"},
		{func(c *Config) { c.ReservePermille = 501 }, "ReservePermille"},
		{func(c *Config) { c.SpreadPermille = -1 }, "SpreadPermille"},
		{func(c *Config) { c.ProportionalPermille = 1001 }, "ProportionalPermille"},
		{func(c *Config) { c.DampingPermille = 1001 }, "DampingPermille"},
		{func(c *Config) { c.HeadroomPermille = 999 }, "HeadroomPermille"},
	} {
		c := DefaultConfig()
		tc.mut(&c)
		err := c.Validate()
		require.ErrorIs(t, err, ErrConfig)
		assert.Contains(t, err.Error(), tc.field)
	}
}

func TestInputErrorsNameTheField(t *testing.T) {
	lim := Limit{RateMilli: 900, BurstMilli: 900, Regions: 3}
	c := DefaultConfig()
	base := func() []RegionInput {
		return []RegionInput{live(0, lim.Default()), live(0, lim.Default()), live(0, lim.Default())}
	}
	for _, tc := range []struct {
		mut   func([]RegionInput)
		self  int
		field string
	}{
		{func(in []RegionInput) { in[1].DemandMilli = -1 }, 0, "DemandMilli"},
		{func(in []RegionInput) { in[2].Claim.RateMilli = 901 }, 0, "Claim.RateMilli"},
		{func(in []RegionInput) { in[2].Claim.BurstMilli = -5 }, 0, "Claim.BurstMilli"},
		{func(in []RegionInput) { in[0].Want.RateMilli = -1 }, 0, "Want.RateMilli"},
		{func(in []RegionInput) { in[0].Want.BurstMilli = 1000 }, 0, "Want.BurstMilli"},
		{func(in []RegionInput) {}, 3, "self"},
		{func(in []RegionInput) { in[1].Silent = true }, 1, "Silent"},
	} {
		in := base()
		tc.mut(in)
		_, err := c.Next(lim, tc.self, in, Grow)
		require.ErrorIs(t, err, ErrInput)
		assert.Contains(t, err.Error(), tc.field)
	}
	_, err := c.Next(lim, 0, base()[:2], Grow)
	require.ErrorIs(t, err, ErrInput)
	_, err = c.Next(lim, 0, base(), Mode(9))
	require.ErrorIs(t, err, ErrInput)
	require.ErrorIs(t, c.Targets(lim, base(), make([]Share, 2)), ErrInput)
}

func TestTargetsTable(t *testing.T) {
	lim := Limit{RateMilli: 300_000, BurstMilli: 600_000, Regions: 3}
	def := lim.Default() // 100_000, 200_000
	floor := Share{RateMilli: 10_000, BurstMilli: 20_000}
	for _, tc := range []struct {
		name string
		cfg  func(*Config)
		in   []RegionInput
		want []Share
	}{
		{
			name: "no demand gives exactly the default",
			in:   []RegionInput{{}, {}, {}},
			want: []Share{def, def, def},
		},
		{
			name: "one saturating region gets all but the floors and its part of nothing",
			in:   []RegionInput{{DemandMilli: 10_000_000}, {}, {}},
			want: []Share{{280_000, 560_000}, floor, floor},
		},
		{
			name: "max-min fair: the small demand is met, the big ones share the rest",
			cfg:  func(c *Config) { c.ProportionalPermille = 0 },
			in:   []RegionInput{{DemandMilli: 50_000}, {DemandMilli: 500_000}, {DemandMilli: 500_000}},
			want: []Share{{50_000, 100_000}, {125_000, 250_000}, {125_000, 250_000}},
		},
		{
			name: "over the limit, the default blend: 70% water-filled, 30% in proportion to demand",
			// Floors 10k; 270k to share; demand capped at L, so excess 40k,
			// 290k, 290k (620k). Water-filled: 40k, 115k, 115k; in
			// proportion: 270k*40/620 = 17,419 and 270k*290/620 = 126,290.
			// 0.7*40k + 0.3*17,419 = 28,000 + 5,225; 0.7*115k + 0.3*126,290
			// = 80,500 + 37,887. The burst is the same at twice the scale
			// (rounded on its own). The small region gets less than its
			// demand: it runs over its share as the others do.
			in:   []RegionInput{{DemandMilli: 50_000}, {DemandMilli: 500_000}, {DemandMilli: 500_000}},
			want: []Share{{10_000 + 33_225, 20_000 + 66_451}, {10_000 + 118_387, 20_000 + 236_774}, {10_000 + 118_387, 20_000 + 236_774}},
		},
		{
			name: "over the limit, pure proportion",
			cfg:  func(c *Config) { c.ProportionalPermille = 1000 },
			in:   []RegionInput{{DemandMilli: 50_000}, {DemandMilli: 500_000}, {DemandMilli: 500_000}},
			want: []Share{{10_000 + 17_419, 20_000 + 34_838}, {10_000 + 126_290, 20_000 + 252_580}, {10_000 + 126_290, 20_000 + 252_580}},
		},
		{
			name: "leftover: a quarter equally, the rest in proportion",
			// Floors 10k each; demand 0 and 100k (excess 90k) met; leftover
			// 300k-30k-90k = 180k: 45k spread equally (15k each), 135k in
			// proportion to 10k, 100k, 10k.
			in:   []RegionInput{{}, {DemandMilli: 100_000}, {}},
			want: []Share{{25_000 + 11_250, 50_000 + 22_500}, {115_000 + 112_500, 230_000 + 225_000}, {25_000 + 11_250, 50_000 + 22_500}},
		},
		{
			name: "a silent region is at exactly the default, the rest is shared",
			in:   []RegionInput{{DemandMilli: 10_000_000}, {Silent: true}, {}},
			want: []Share{{190_000, 380_000}, def, floor},
		},
		{
			name: "reserve is left unallocated",
			cfg:  func(c *Config) { c.ReservePermille = 100 },
			in:   []RegionInput{{}, {}, {}},
			want: []Share{{90_000, 180_000}, {90_000, 180_000}, {90_000, 180_000}},
		},
		{
			name: "headroom caps the leftover at max(default, demand*H)",
			// As the leftover case, then the 100k demand is capped at
			// 125k (H = 1.25) and the others at the default (not reached).
			cfg:  func(c *Config) { c.HeadroomPermille = 1250 },
			in:   []RegionInput{{}, {DemandMilli: 100_000}, {}},
			want: []Share{{25_000 + 11_250, 50_000 + 22_500}, {125_000, 250_000}, {25_000 + 11_250, 50_000 + 22_500}},
		},
		{
			name: "headroom never caps below the default",
			cfg:  func(c *Config) { c.HeadroomPermille = 1250 },
			in:   []RegionInput{{DemandMilli: 1_000}, {DemandMilli: 1_000}, {DemandMilli: 1_000}},
			want: []Share{def, def, def},
		},
		{
			name: "full spread splits the leftover equally",
			cfg:  func(c *Config) { c.SpreadPermille = 1000 },
			in:   []RegionInput{{DemandMilli: 40_000}, {}, {}},
			want: []Share{{40_000 + 80_000, 80_000 + 160_000}, {10_000 + 80_000, 20_000 + 160_000}, {10_000 + 80_000, 20_000 + 160_000}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.FloorPermille, c.HeadroomPermille = 100, 100_000 // no cap unless a case sets one
			if tc.cfg != nil {
				tc.cfg(&c)
			}
			out := make([]Share, 3)
			require.NoError(t, c.Targets(lim, tc.in, out))
			assert.Equal(t, tc.want, out)
		})
	}
}

func TestNextTable(t *testing.T) {
	lim := Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 3}
	def := lim.Default()
	c := DefaultConfig()
	c.FloorPermille, c.HeadroomPermille = 100, 100_000
	hot := int64(10_000_000)
	for _, tc := range []struct {
		name string
		in   []RegionInput
		mode Mode
		want Share
	}{
		{
			name: "a region with no demand shrinks at once to its target",
			in:   []RegionInput{live(0, def), live(hot, def), live(0, def)},
			mode: Hold,
			want: Share{RateMilli: 10_000, BurstMilli: 10_000},
		},
		{
			name: "hold never grows",
			in:   []RegionInput{{DemandMilli: hot, Claim: def, Want: def}, live(0, Share{10_000, 10_000}), live(0, Share{10_000, 10_000})},
			mode: Hold,
			want: def,
		},
		{
			name: "grow takes all proven slack when it is the only one that wants",
			in:   []RegionInput{{DemandMilli: hot, Claim: def, Want: Share{180_000, 180_000}}, live(0, Share{10_000, 10_000}), live(0, Share{10_000, 10_000})},
			mode: Grow,
			want: Share{RateMilli: 280_000, BurstMilli: 280_000},
		},
		{
			name: "grow without a published want stays",
			in:   []RegionInput{{DemandMilli: hot, Claim: def}, live(0, Share{10_000, 10_000}), live(0, Share{10_000, 10_000})},
			mode: Grow,
			want: def,
		},
		{
			name: "two growers split the slack in proportion to their wants",
			// slack = 300k - 100k - 50k - 50k = 100k; wants 150k and 50k.
			in: []RegionInput{
				{DemandMilli: hot, Claim: def, Want: Share{150_000, 150_000}},
				{DemandMilli: 60_000, Claim: Share{50_000, 50_000}, Want: Share{50_000, 50_000}},
				live(0, Share{50_000, 50_000}),
			},
			mode: Grow,
			want: Share{RateMilli: 175_000, BurstMilli: 175_000},
		},
		{
			name: "needs come first: a want of a region using less than its claim waits",
			// slack 100k; region 0 (demand above its claim) and region 1
			// (demand below its claim, asking to return to the default)
			// both want: the need takes all the slack it can use.
			in: []RegionInput{
				{DemandMilli: hot, Claim: def, Want: Share{150_000, 150_000}},
				{DemandMilli: 0, Claim: Share{50_000, 50_000}, Want: Share{50_000, 50_000}},
				live(0, Share{50_000, 50_000}),
			},
			mode: Grow,
			want: Share{RateMilli: 200_000, BurstMilli: 200_000},
		},
		{
			name: "a silent region counts as the default in the slack",
			in:   []RegionInput{{DemandMilli: hot, Claim: Share{10_000, 10_000}, Want: Share{190_000, 190_000}}, {Silent: true}, live(0, Share{10_000, 10_000})},
			mode: Grow,
			want: Share{RateMilli: 190_000, BurstMilli: 190_000},
		},
		{
			name: "fallback caps at the default",
			in:   []RegionInput{{DemandMilli: hot, Claim: Share{250_000, 250_000}}, live(0, def), live(0, def)},
			mode: Fallback,
			want: def,
		},
		{
			name: "fallback keeps a share below the default",
			in:   []RegionInput{{DemandMilli: hot, Claim: Share{20_000, 30_000}}, live(0, def), live(0, def)},
			mode: Fallback,
			want: Share{20_000, 30_000},
		},
		{
			name: "a mixed share is clamped to the default in the dimension above it",
			in:   []RegionInput{{DemandMilli: hot, Claim: Share{150_000, 50_000}}, live(0, def), live(0, def)},
			mode: Hold,
			want: Share{100_000, 50_000},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := c.Next(lim, 0, tc.in, tc.mode)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestKeep(t *testing.T) {
	lim := Limit{RateMilli: 300_000, BurstMilli: 600_000, Regions: 3}
	def := lim.Default() // 100_000, 200_000
	c := DefaultConfig()
	c.FloorPermille, c.HeadroomPermille = 100, 1500
	for _, tc := range []struct {
		name   string
		claim  Share
		demand int64
		want   Share
	}{
		{"demand gone: shrink to the floor", Share{280_000, 560_000}, 0, Share{10_000, 20_000}},
		{"demand fell: keep headroom over it", Share{280_000, 560_000}, 100_000, Share{150_000, 300_000}},
		{"demand still uses the claim: keep it", Share{280_000, 560_000}, 200_000, Share{280_000, 560_000}},
		{"at or below the default: keep it", def, 0, def},
		{"below the default: keep it", Share{40_000, 80_000}, 0, Share{40_000, 80_000}},
		{"headroom just above the default: shrink to it", Share{280_000, 560_000}, 70_000, Share{105_000, 210_000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := c.Keep(lim, tc.claim, tc.demand)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	_, err := c.Keep(lim, Share{RateMilli: 400_000}, 0)
	require.ErrorIs(t, err, ErrInput)
	assert.Contains(t, err.Error(), "Claim.RateMilli")
	_, err = c.Keep(lim, def, -1)
	require.ErrorIs(t, err, ErrInput)
	assert.Contains(t, err.Error(), "DemandMilli")

	// Properties: never above the claim, never mixed, never below what
	// the demand needs (with headroom) unless the claim was.
	r := rand.New(rand.NewPCG(7, 8))
	for iter := 0; iter < 20_000; iter++ {
		lim := randLimit(r)
		c := randConfig(r)
		claim := randClaims(r, lim)[0]
		if lim.Mixed(claim) {
			continue
		}
		dm := randDemand(r, lim)
		got, err := c.Keep(lim, claim, dm)
		require.NoError(t, err)
		require.LessOrEqual(t, got.RateMilli, claim.RateMilli, "iter %d", iter)
		require.LessOrEqual(t, got.BurstMilli, claim.BurstMilli, "iter %d", iter)
		require.False(t, lim.Mixed(got), "iter %d", iter)
		need := min(mulDiv(min(dm, lim.RateMilli), c.HeadroomPermille, 1000), claim.RateMilli)
		require.GreaterOrEqual(t, got.RateMilli, min(need, lim.Default().RateMilli), "iter %d", iter)
	}
}

func TestWant(t *testing.T) {
	lim := Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 3}
	c := DefaultConfig()
	c.FloorPermille = 100
	w, err := c.Want(lim, 0, []RegionInput{live(10_000_000, lim.Default()), live(0, lim.Default()), live(0, lim.Default())})
	require.NoError(t, err)
	assert.Equal(t, Share{RateMilli: 180_000, BurstMilli: 180_000}, w)
	w, err = c.Want(lim, 1, []RegionInput{live(10_000_000, lim.Default()), live(0, lim.Default()), live(0, lim.Default())})
	require.NoError(t, err)
	assert.Equal(t, Share{}, w, "a region above its target wants nothing")

	c.DampingPermille = 500
	w, err = c.Want(lim, 0, []RegionInput{live(10_000_000, lim.Default()), live(0, lim.Default()), live(0, lim.Default())})
	require.NoError(t, err)
	assert.Equal(t, Share{RateMilli: 90_000, BurstMilli: 90_000}, w, "damping halves the step")
}

// refTargets is a naive reference for Targets: the water level found by
// binary search and the leftover split with big rationals.
func refTargets(c Config, lim Limit, in []RegionInput) []Share {
	out := make([]Share, len(in))
	def := lim.Default()
	for d := 0; d < 2; d++ {
		limit := []int64{lim.RateMilli, lim.BurstMilli}[d]
		dflt := []int64{def.RateMilli, def.BurstMilli}[d]
		total := limit
		var idx []int
		for i, r := range in {
			if r.Silent {
				total -= dflt
				continue
			}
			idx = append(idx, i)
		}
		if len(idx) == 0 {
			for i := range in {
				set(&out[i], d, dflt)
			}
			continue
		}
		total -= limit * c.ReservePermille / 1000
		total = max(total, 0)
		n := int64(len(idx))
		floor := dflt * c.FloorPermille / 1000
		if floor*n > total {
			floor = total / n
		}
		rest := total - floor*n
		excess := make([]int64, len(idx))
		for k, i := range idx {
			dm := in[i].DemandMilli
			if d == 1 {
				x := new(big.Int).Mul(big.NewInt(min(dm, lim.RateMilli)), big.NewInt(lim.BurstMilli))
				dm = x.Quo(x, big.NewInt(lim.RateMilli)).Int64()
			}
			excess[k] = max(min(dm, total)-floor, 0)
		}
		sumAt := func(level int64) int64 {
			var s int64
			for _, e := range excess {
				s += min(e, level)
			}
			return s
		}
		lo, hi := int64(0), total+1 // sumAt(lo) <= rest < sumAt(hi) or hi unreachable
		for lo+1 < hi {
			mid := lo + (hi-lo)/2
			if sumAt(mid) <= rest {
				lo = mid
			} else {
				hi = mid
			}
		}
		given := make([]int64, len(idx))
		var ex int64
		for k := range idx {
			given[k] = min(excess[k], lo)
			ex += excess[k]
		}
		left := rest - sumAt(lo)
		if c.ProportionalPermille > 0 && ex > rest {
			// Over-subscribed: the blend of water-filling and the split in
			// proportion to the excess demand.
			left = rest
			for k := range idx {
				prop := new(big.Int).Quo(new(big.Int).Mul(big.NewInt(rest), big.NewInt(excess[k])), big.NewInt(ex))
				prop.Quo(prop.Mul(prop, big.NewInt(c.ProportionalPermille)), big.NewInt(1000))
				mm := new(big.Int).Quo(new(big.Int).Mul(big.NewInt(given[k]), big.NewInt(1000-c.ProportionalPermille)), big.NewInt(1000))
				given[k] = mm.Int64() + prop.Int64()
				left -= given[k]
			}
		}
		var sum int64
		for k := range idx {
			sum += floor + given[k]
		}
		for k, i := range idx {
			a := floor + given[k]
			// The headroom cap: max(default, demand*H), demand as above.
			dm := in[i].DemandMilli
			if d == 1 {
				x := new(big.Int).Mul(big.NewInt(min(dm, lim.RateMilli)), big.NewInt(lim.BurstMilli))
				dm = x.Quo(x, big.NewInt(lim.RateMilli)).Int64()
			}
			x := new(big.Int).Mul(big.NewInt(min(dm, total)), big.NewInt(c.HeadroomPermille))
			capped := max(dflt, x.Quo(x, big.NewInt(1000)).Int64())
			var extra int64
			if sum == 0 {
				extra = left / n
			} else {
				share := new(big.Rat).SetFrac(
					new(big.Int).Add(
						new(big.Int).Mul(big.NewInt(c.SpreadPermille), big.NewInt(sum)),
						new(big.Int).Mul(big.NewInt((1000-c.SpreadPermille)*n), big.NewInt(a))),
					new(big.Int).Mul(big.NewInt(1000*n), big.NewInt(sum)))
				x := new(big.Rat).Mul(share, new(big.Rat).SetInt64(left))
				extra = new(big.Int).Quo(x.Num(), x.Denom()).Int64()
			}
			set(&out[i], d, min(a+extra, capped))
		}
		for i, r := range in {
			if r.Silent {
				set(&out[i], d, dflt)
			}
		}
	}
	return out
}

func set(s *Share, d int, v int64) {
	if d == 0 {
		s.RateMilli = v
	} else {
		s.BurstMilli = v
	}
}

func randLimit(r *rand.Rand) Limit {
	n := 1 + r.IntN(6)
	var rate int64
	switch r.IntN(3) {
	case 0:
		rate = 1 + r.Int64N(100)
	case 1:
		rate = 1 + r.Int64N(10_000_000)
	default:
		rate = 1 + r.Int64N(MaxLimitMilli)
	}
	return Limit{RateMilli: rate, BurstMilli: r.Int64N(min(rate*3, MaxLimitMilli) + 1), Regions: n}
}

func randConfig(r *rand.Rand) Config {
	return Config{
		FloorPermille:   r.Int64N(1001),
		ReservePermille: r.Int64N(3) * r.Int64N(501) / 2,
		SpreadPermille:  r.Int64N(1001),
		DampingPermille: 1 + r.Int64N(1000),
		// A third of the time pure max-min.
		ProportionalPermille: []int64{0, r.Int64N(1001), 1000}[r.IntN(3)],
		// Half the time no cap in practice.
		HeadroomPermille: []int64{1000 + r.Int64N(3000), 100_000}[r.IntN(2)],
	}
}

// randClaims returns claims whose sums are within (L, B).
func randClaims(r *rand.Rand, lim Limit) []Share {
	out := make([]Share, lim.Regions)
	remR, remB := lim.RateMilli, lim.BurstMilli
	for _, i := range r.Perm(lim.Regions) {
		out[i] = Share{RateMilli: r.Int64N(remR + 1), BurstMilli: r.Int64N(remB + 1)}
		if r.IntN(3) == 0 {
			out[i] = Share{RateMilli: min(lim.Default().RateMilli, remR), BurstMilli: min(lim.Default().BurstMilli, remB)}
		}
		remR -= out[i].RateMilli
		remB -= out[i].BurstMilli
	}
	return out
}

func randDemand(r *rand.Rand, lim Limit) int64 {
	switch r.IntN(4) {
	case 0:
		return 0
	case 1:
		return r.Int64N(lim.RateMilli/int64(lim.Regions) + 1)
	case 2:
		return r.Int64N(lim.RateMilli*2 + 1)
	default:
		return r.Int64N(1 << 62)
	}
}

func TestTargetsProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 20_000; iter++ {
		lim := randLimit(r)
		c := randConfig(r)
		in := make([]RegionInput, lim.Regions)
		for i := range in {
			in[i] = RegionInput{DemandMilli: randDemand(r, lim), Silent: r.IntN(5) == 0}
		}
		out := make([]Share, lim.Regions)
		require.NoError(t, c.Targets(lim, in, out))
		require.Equal(t, refTargets(c, lim, in), out, "iter %d: %+v %+v %+v", iter, c, lim, in)
		var sr, sb int64
		for _, s := range out {
			require.GreaterOrEqual(t, s.RateMilli, int64(0))
			require.GreaterOrEqual(t, s.BurstMilli, int64(0))
			sr += s.RateMilli
			sb += s.BurstMilli
		}
		require.LessOrEqual(t, sr, lim.RateMilli, "iter %d", iter)
		require.LessOrEqual(t, sb, lim.BurstMilli, "iter %d", iter)

		// Permuting the regions permutes the targets.
		perm := r.Perm(lim.Regions)
		pin := make([]RegionInput, lim.Regions)
		for i, p := range perm {
			pin[p] = in[i]
		}
		pout := make([]Share, lim.Regions)
		require.NoError(t, c.Targets(lim, pin, pout))
		for i, p := range perm {
			require.Equal(t, out[i], pout[p])
		}
	}
}

// TestGrowthIsSafeAcrossViews is the core safety property: regions compute
// their next share from their own views of the same epoch; a region absent
// from some views is Silent there (and then, by the partition rule, it
// published want 0 and a claim at most the default, and is in fallback).
// The sum of the next shares never exceeds L (B).
func TestGrowthIsSafeAcrossViews(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for iter := 0; iter < 20_000; iter++ {
		lim := randLimit(r)
		c := randConfig(r)
		n := lim.Regions
		claims := randClaims(r, lim)
		def := lim.Default()
		cutOff := make([]bool, n) // regions in fallback: published want 0, claim <= default
		published := make([]RegionInput, n)
		for i := range published {
			published[i] = RegionInput{DemandMilli: randDemand(r, lim), Claim: claims[i]}
			if n > 1 && r.IntN(4) == 0 {
				cutOff[i] = true
				published[i].Claim = Share{RateMilli: min(claims[i].RateMilli, def.RateMilli), BurstMilli: min(claims[i].BurstMilli, def.BurstMilli)}
			}
		}
		for i := range published {
			if cutOff[i] {
				continue
			}
			w, err := c.Want(lim, i, published)
			require.NoError(t, err)
			published[i].Want = w
			if r.IntN(3) == 0 {
				// Wants are published from an older view than the
				// decision's: any want must be safe.
				published[i].Want = Share{RateMilli: r.Int64N(lim.RateMilli + 1), BurstMilli: r.Int64N(lim.BurstMilli + 1)}
			}
		}
		var sumR, sumB int64
		for self := 0; self < n; self++ {
			view := slices.Clone(published)
			mode := Grow
			if cutOff[self] {
				mode = Fallback
			}
			for q := range view {
				if q != self && cutOff[q] && r.IntN(2) == 0 {
					view[q] = RegionInput{Silent: true}
				}
			}
			if mode == Grow && r.IntN(4) == 0 {
				mode = Hold
			}
			next, err := c.Next(lim, self, view, mode)
			require.NoError(t, err)
			require.False(t, lim.Mixed(next), "iter %d: mixed share %+v", iter, next)
			if mode == Fallback {
				require.LessOrEqual(t, next.RateMilli, def.RateMilli)
				require.LessOrEqual(t, next.BurstMilli, def.BurstMilli)
			}
			if mode != Grow {
				require.LessOrEqual(t, next.RateMilli, published[self].Claim.RateMilli)
				require.LessOrEqual(t, next.BurstMilli, published[self].Claim.BurstMilli)
			}
			sumR += next.RateMilli
			sumB += next.BurstMilli
		}
		require.LessOrEqual(t, sumR, lim.RateMilli, "iter %d: %+v %+v", iter, lim, published)
		require.LessOrEqual(t, sumB, lim.BurstMilli, "iter %d: %+v %+v", iter, lim, published)
	}
}

func TestNextPermutationInvariant(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for iter := 0; iter < 10_000; iter++ {
		lim := randLimit(r)
		c := randConfig(r)
		claims := randClaims(r, lim)
		in := make([]RegionInput, lim.Regions)
		for i := range in {
			in[i] = RegionInput{DemandMilli: randDemand(r, lim), Claim: claims[i], Want: Share{r.Int64N(lim.RateMilli + 1), r.Int64N(lim.BurstMilli + 1)}}
			if i > 0 && r.IntN(5) == 0 {
				in[i] = RegionInput{Silent: true}
			}
		}
		mode := Mode(r.IntN(3))
		want, err := c.Next(lim, 0, in, mode)
		require.NoError(t, err)
		perm := r.Perm(lim.Regions)
		pin := make([]RegionInput, lim.Regions)
		for i, p := range perm {
			pin[p] = in[i]
		}
		got, err := c.Next(lim, perm[0], pin, mode)
		require.NoError(t, err)
		require.Equal(t, want, got, "iter %d", iter)
	}
}

// round runs one epoch of complete views at the shares level: every region
// publishes its want from the claims, then every region grows or shrinks.
func round(t *testing.T, c Config, lim Limit, demand []int64, claims []Share) []Share {
	t.Helper()
	in := make([]RegionInput, lim.Regions)
	for i := range in {
		in[i] = RegionInput{DemandMilli: demand[i], Claim: claims[i]}
	}
	for i := range in {
		w, err := c.Want(lim, i, in)
		require.NoError(t, err)
		in[i].Want = w
	}
	next := make([]Share, lim.Regions)
	for i := range in {
		s, err := c.Next(lim, i, in, Grow)
		require.NoError(t, err)
		next[i] = s
	}
	return next
}

func sum(s []Share) Share {
	var out Share
	for _, x := range s {
		out.RateMilli += x.RateMilli
		out.BurstMilli += x.BurstMilli
	}
	return out
}

func TestHotRegionGetsMostWithinAFewEpochs(t *testing.T) {
	lim := Limit{RateMilli: 1_000_000, BurstMilli: 2_000_000, Regions: 3}
	c := DefaultConfig()
	claims := []Share{lim.Default(), lim.Default(), lim.Default()}
	demand := []int64{5_000_000, 0, 0}
	for e := 0; e < 3; e++ {
		claims = round(t, c, lim, demand, claims)
		require.LessOrEqual(t, sum(claims).RateMilli, lim.RateMilli)
		require.LessOrEqual(t, sum(claims).BurstMilli, lim.BurstMilli)
	}
	assert.GreaterOrEqual(t, claims[0].RateMilli, lim.RateMilli*90/100, "after 3 epochs: %+v", claims)
	assert.GreaterOrEqual(t, claims[0].BurstMilli, lim.BurstMilli*90/100)
}

func TestIdleKeysReturnToDefault(t *testing.T) {
	lim := Limit{RateMilli: 1_000_003, BurstMilli: 500_001, Regions: 3}
	c := DefaultConfig()
	claims := []Share{{RateMilli: 900_000, BurstMilli: 450_000}, {RateMilli: 50_000, BurstMilli: 25_000}, {RateMilli: 50_003, BurstMilli: 25_001}}
	def := lim.Default()
	for e := 0; e < 4; e++ {
		prev := claims
		claims = round(t, c, lim, []int64{0, 0, 0}, claims)
		require.LessOrEqual(t, sum(claims).RateMilli, lim.RateMilli)
		if e == 0 {
			// Regions above the default shrink first; those below wait
			// for the slack to show in the claims.
			assert.Equal(t, def, claims[0])
			assert.Equal(t, prev[1], claims[1])
		}
	}
	assert.Equal(t, []Share{def, def, def}, claims)
}

func TestAllocationFree(t *testing.T) {
	lim := Limit{RateMilli: 1_000_000, BurstMilli: 2_000_000, Regions: 3}
	c := DefaultConfig()
	in := []RegionInput{
		{DemandMilli: 700_000, Claim: lim.Default(), Want: Share{RateMilli: 100, BurstMilli: 100}},
		live(200_000, lim.Default()), live(5, lim.Default()),
	}
	out := make([]Share, 3)
	allocs := testing.AllocsPerRun(100, func() {
		_, _ = c.Next(lim, 0, in, Grow)
		_, _ = c.Want(lim, 1, in)
		_ = c.Targets(lim, in, out)
	})
	assert.Zero(t, allocs)
}

func TestMulDiv(t *testing.T) {
	assert.Equal(t, int64(6), MulDiv(4, 3, 2))
	assert.Equal(t, int64(1<<62), MulDiv(1<<62, 1<<62, 1<<62), "128-bit intermediate")
	assert.Equal(t, int64(1<<63-1), MulDiv(1<<62, 1<<62, 1), "saturates")
	assert.Zero(t, MulDiv(5, 5, 0))
	assert.Zero(t, MulDiv(-5, 5, 1))
}

func TestModeString(t *testing.T) {
	assert.Equal(t, "grow", Grow.String())
	assert.Equal(t, "hold", Hold.String())
	assert.Equal(t, "fallback", Fallback.String())
	assert.Equal(t, "Mode(7)", Mode(7).String())
}

// TestFloorAdmitsOneRequest: the README's pro policy (100/s, burst 200,
// three regions) gave an idle region a burst floor of 0.999 tokens (1.5%
// of 66.666), which admits no request of cost 1 until the next decision;
// with MinCostMilli the floor is one request.
func TestFloorAdmitsOneRequest(t *testing.T) {
	lim := Limit{RateMilli: 100_000, BurstMilli: 200_000, Regions: 3, MinCostMilli: 1000}
	c := DefaultConfig()
	in := []RegionInput{live(150_000, lim.Default()), live(0, lim.Default()), live(0, lim.Default())}
	out := make([]Share, 3)
	require.NoError(t, c.Targets(lim, in, out))
	for i := 1; i < 3; i++ {
		assert.Equal(t, int64(1000), out[i].BurstMilli, "idle region %d: one request of cost 1", i)
	}
	assert.LessOrEqual(t, sum(out).BurstMilli, lim.BurstMilli)
	kept, err := c.Keep(lim, Share{RateMilli: 90_000, BurstMilli: 180_000}, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(1000), kept.BurstMilli, "a region whose demand stopped keeps one request at collection")
	// The shares of three rounds of a region with all the demand.
	claims := []Share{lim.Default(), lim.Default(), lim.Default()}
	for e := 0; e < 3; e++ {
		claims = round(t, c, lim, []int64{150_000, 0, 0}, claims)
	}
	assert.Equal(t, int64(1000), claims[1].BurstMilli)
	assert.Equal(t, int64(1000), claims[2].BurstMilli)
	assert.Equal(t, int64(198_000), claims[0].BurstMilli, "the busy region gets the rest")
}

// TestLimitRefusesBurstBelowOneRequestPerRegion: B < n x MinCostMilli
// cannot give every region one request; the error says what to change.
func TestLimitRefusesBurstBelowOneRequestPerRegion(t *testing.T) {
	err := Limit{RateMilli: 10_000, BurstMilli: 2_000, Regions: 3, MinCostMilli: 1000}.Validate()
	require.ErrorIs(t, err, ErrLimit)
	assert.ErrorContains(t, err, "burst 2 over 3 regions gives each less than one request of cost 1: raise the burst to at least 3")
	require.NoError(t, Limit{RateMilli: 10_000, BurstMilli: 3_000, Regions: 3, MinCostMilli: 1000}.Validate())
	require.ErrorContains(t, Limit{RateMilli: 1, BurstMilli: 1, Regions: 1, MinCostMilli: -1}.Validate(), "MinCostMilli")
}

// TestSharesKeepOneRequestProperty: over random limits, tunings, demands
// and rounds of complete views (growth, holds, fallbacks, shrinks at
// collection), every live region's share admits one request of
// MinCostMilli, and the shares sum within L and B.
func TestSharesKeepOneRequestProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for iter := 0; iter < 5_000; iter++ {
		lim := randLimit(r)
		lim.MinCostMilli = r.Int64N(lim.BurstMilli/int64(lim.Regions) + 1)
		c := randConfig(r)
		claims := make([]Share, lim.Regions)
		for i := range claims {
			claims[i] = lim.Default()
		}
		for e := 0; e < 6; e++ {
			in := make([]RegionInput, lim.Regions)
			for i := range in {
				in[i] = RegionInput{DemandMilli: randDemand(r, lim), Claim: claims[i]}
				if r.IntN(4) == 0 {
					k, err := c.Keep(lim, claims[i], in[i].DemandMilli)
					require.NoError(t, err)
					require.GreaterOrEqual(t, k.BurstMilli, lim.MinCostMilli, "iter %d: Keep %+v of %+v", iter, k, lim)
					in[i].Claim, claims[i] = k, k
				}
			}
			out := make([]Share, lim.Regions)
			require.NoError(t, c.Targets(lim, in, out))
			for i := range out {
				require.GreaterOrEqual(t, out[i].BurstMilli, lim.MinCostMilli, "iter %d: target %d %+v of %+v %+v", iter, i, out[i], lim, c)
			}
			for i := range in {
				w, err := c.Want(lim, i, in)
				require.NoError(t, err)
				in[i].Want = w
			}
			mode := []Mode{Grow, Hold, Fallback}[r.IntN(3)]
			for i := range in {
				s, err := c.Next(lim, i, in, mode)
				require.NoError(t, err)
				require.GreaterOrEqual(t, s.BurstMilli, lim.MinCostMilli, "iter %d: next %d %+v of %+v in %v", iter, i, s, lim, mode)
				claims[i] = s
			}
			require.LessOrEqual(t, sum(claims).RateMilli, lim.RateMilli, "iter %d", iter)
			require.LessOrEqual(t, sum(claims).BurstMilli, lim.BurstMilli, "iter %d", iter)
		}
	}
}
