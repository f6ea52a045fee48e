package shares

import (
	"errors"
	"fmt"
	"math/bits"
)

// MaxRegions is the largest number of regions one limit can be shared by.
// Computation uses fixed-size arrays of this length on the stack.
const MaxRegions = 16

// MaxLimitMilli is the largest rate (milli-tokens per second) or burst
// (milli-tokens) a Limit may have: 2^46, about 7e10 tokens per second. The
// bound keeps every intermediate product within 64 bits.
const MaxLimitMilli = int64(1) << 46

// Errors that callers branch on. Returned errors wrap one of them and name
// the offending field.
var (
	// ErrLimit means the Limit is out of range.
	ErrLimit = errors.New("shares: invalid limit")
	// ErrInput means a RegionInput, the region index or the slice lengths
	// are out of range.
	ErrInput = errors.New("shares: invalid input")
	// ErrConfig means a Config field is out of range.
	ErrConfig = errors.New("shares: invalid config")
)

// Share is what one region may enforce for one key. The zero value is an
// empty share (nothing admitted).
type Share struct {
	RateMilli  int64 // refill rate, milli-tokens per second
	BurstMilli int64 // bucket capacity, milli-tokens
}

// Limit is one key's global limit, shared by Regions regions.
type Limit struct {
	RateMilli  int64 // L: global rate, milli-tokens per second, 1..MaxLimitMilli
	BurstMilli int64 // B: global burst, milli-tokens, 0..MaxLimitMilli
	Regions    int   // n: number of regions sharing the limit, 1..MaxRegions
	// MinCostMilli is the cost of the policy's cheapest request, milli
	// cost units (1000 for a request of cost 1), 0..B/n: every share a
	// live region gets from Targets, Keep or Next has a burst of at least
	// MinCostMilli, so a region that receives its first request admits it
	// (see the package doc, Floors). 0: no such bound.
	MinCostMilli int64
}

// Validate reports whether l is in range; the error wraps ErrLimit. A
// burst that cannot give every region one request of MinCostMilli
// (B < n x MinCostMilli) is refused: with it some region would enforce a
// share that admits nothing.
func (l Limit) Validate() error {
	switch {
	case l.RateMilli <= 0 || l.RateMilli > MaxLimitMilli:
		return fmt.Errorf("%w: RateMilli %d not in 1..%d", ErrLimit, l.RateMilli, MaxLimitMilli)
	case l.BurstMilli < 0 || l.BurstMilli > MaxLimitMilli:
		return fmt.Errorf("%w: BurstMilli %d not in 0..%d", ErrLimit, l.BurstMilli, MaxLimitMilli)
	case l.Regions < 1 || l.Regions > MaxRegions:
		return fmt.Errorf("%w: Regions %d not in 1..%d", ErrLimit, l.Regions, MaxRegions)
	case l.MinCostMilli < 0 || l.MinCostMilli > MaxLimitMilli:
		return fmt.Errorf("%w: MinCostMilli %d not in 0..%d", ErrLimit, l.MinCostMilli, MaxLimitMilli)
	case l.MinCostMilli > l.BurstMilli/int64(l.Regions):
		return fmt.Errorf("%w: burst %s over %d regions gives each less than one request of cost %s: raise the burst to at least %s (regions x cost) or make the policy regional",
			ErrLimit, milliString(l.BurstMilli), l.Regions, milliString(l.MinCostMilli), milliString(l.MinCostMilli*int64(l.Regions)))
	}
	return nil
}

// milliString formats milli units as a decimal number.
func milliString(v int64) string {
	if v%1000 == 0 {
		return fmt.Sprintf("%d", v/1000)
	}
	return fmt.Sprintf("%.3f", float64(v)/1000)
}

// floors returns the floor of a live region per dimension: Default() x
// FloorPermille/1000, and for the burst at least MinCostMilli (never above
// Default(), since a valid Limit has B/n >= MinCostMilli).
func (c Config) floors(lim Limit) dims {
	def := lim.defaultDims()
	f := dims{def[0] * c.FloorPermille / 1000, def[1] * c.FloorPermille / 1000}
	f[1] = min(max(f[1], lim.MinCostMilli), def[1])
	return f
}

// Default is the share a region enforces for a key it has no share record
// for: (floor(L/n), floor(B/n)). It is also the safe share of the partition
// rule. Default of an invalid Limit is the zero Share.
func (l Limit) Default() Share {
	if l.Regions < 1 {
		return Share{}
	}
	return Share{RateMilli: l.RateMilli / int64(l.Regions), BurstMilli: l.BurstMilli / int64(l.Regions)}
}

// RegionInput is what one region's view holds about one region for one key
// and epoch. For a Silent region every other field is ignored.
type RegionInput struct {
	// DemandMilli is the region's smoothed demand, milli cost units per
	// second, >= 0, as the region itself published it.
	DemandMilli int64
	// Claim is the share the region enforced when it published its report:
	// 0 <= Claim <= (L, B). A region absent from a report it sent is at
	// Default().
	Claim Share
	// Want is how much the region asked to grow in that report, >= 0 (see
	// Config.Want). Only regions that published a positive want may grow.
	Want Share
	// Silent means the view has had no report from the region for long
	// enough (package rebalancer: K+1 epochs, or 2K-1 with its partition
	// rule's majority): it is assumed at exactly Default(), with no demand
	// and no want.
	Silent bool
}

// Mode says what the view allows region self to do in Config.Next.
type Mode uint8

const (
	// Hold: the view of the epoch is incomplete (or late); shrink only.
	Hold Mode = iota
	// Grow: the view is complete and timely; shrink, or grow into slack.
	Grow
	// Fallback: the region is cut off from some region; shrink to at most
	// Default().
	Fallback
)

// String returns the mode's name.
func (m Mode) String() string {
	switch m {
	case Hold:
		return "hold"
	case Grow:
		return "grow"
	case Fallback:
		return "fallback"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// dims holds one value per dimension: 0 is rate, 1 is burst.
type dims [2]int64

func (s Share) dims() dims        { return dims{s.RateMilli, s.BurstMilli} }
func fromDims(d dims) Share       { return Share{RateMilli: d[0], BurstMilli: d[1]} }
func (l Limit) dims() dims        { return dims{l.RateMilli, l.BurstMilli} }
func (l Limit) defaultDims() dims { return l.Default().dims() }

// checkView validates the limit and every non-silent input.
func checkView(lim Limit, in []RegionInput) error {
	if err := lim.Validate(); err != nil {
		return err
	}
	if len(in) != lim.Regions {
		return fmt.Errorf("%w: %d region inputs for a limit of %d regions", ErrInput, len(in), lim.Regions)
	}
	for i := range in {
		r := &in[i]
		if r.Silent {
			continue
		}
		switch {
		case r.DemandMilli < 0:
			return fmt.Errorf("%w: region %d: DemandMilli %d is negative", ErrInput, i, r.DemandMilli)
		case r.Claim.RateMilli < 0 || r.Claim.RateMilli > lim.RateMilli:
			return fmt.Errorf("%w: region %d: Claim.RateMilli %d not in 0..%d", ErrInput, i, r.Claim.RateMilli, lim.RateMilli)
		case r.Claim.BurstMilli < 0 || r.Claim.BurstMilli > lim.BurstMilli:
			return fmt.Errorf("%w: region %d: Claim.BurstMilli %d not in 0..%d", ErrInput, i, r.Claim.BurstMilli, lim.BurstMilli)
		case r.Want.RateMilli < 0 || r.Want.RateMilli > lim.RateMilli:
			return fmt.Errorf("%w: region %d: Want.RateMilli %d not in 0..%d", ErrInput, i, r.Want.RateMilli, lim.RateMilli)
		case r.Want.BurstMilli < 0 || r.Want.BurstMilli > lim.BurstMilli:
			return fmt.Errorf("%w: region %d: Want.BurstMilli %d not in 0..%d", ErrInput, i, r.Want.BurstMilli, lim.BurstMilli)
		}
	}
	return nil
}

// check validates the view and the index of region self.
func check(lim Limit, self int, in []RegionInput) error {
	if err := checkView(lim, in); err != nil {
		return err
	}
	if self < 0 || self >= len(in) {
		return fmt.Errorf("%w: self %d not in 0..%d", ErrInput, self, len(in)-1)
	}
	if in[self].Silent {
		return fmt.Errorf("%w: self %d is Silent", ErrInput, self)
	}
	return nil
}

// Targets writes into out[i] the target share V_i of every region: the
// water-filling described in the package doc. len(out) must be
// lim.Regions. Σ out <= (L, B). It does not allocate. The error wraps
// ErrLimit, ErrInput or ErrConfig; out is then unchanged.
func (c Config) Targets(lim Limit, in []RegionInput, out []Share) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if err := checkView(lim, in); err != nil {
		return err
	}
	if len(out) != len(in) {
		return fmt.Errorf("%w: len(out) %d != %d regions", ErrInput, len(out), len(in))
	}
	var v [2][MaxRegions]int64
	c.targets(lim, in, &v)
	for i := range out {
		out[i] = Share{RateMilli: v[0][i], BurstMilli: v[1][i]}
	}
	return nil
}

// targets computes the targets of both dimensions into v; inputs are valid.
func (c Config) targets(lim Limit, in []RegionInput, v *[2][MaxRegions]int64) {
	total := lim.dims()
	def := lim.defaultDims()
	var demand [MaxRegions]int64
	var live [MaxRegions]int
	nl := 0
	for i := range in {
		if in[i].Silent {
			v[0][i], v[1][i] = def[0], def[1]
			total[0] -= def[0]
			total[1] -= def[1]
			continue
		}
		live[nl] = i
		nl++
	}
	if nl == 0 {
		return
	}
	floors := c.floors(lim)
	for d := 0; d < 2; d++ {
		t := total[d] - mulDiv(lim.dims()[d], c.ReservePermille, 1000)
		if d == 1 {
			// The reserve never cuts a burst floor below one request
			// (nl of them fit: MinCostMilli <= Default(), and total
			// holds nl defaults).
			t = max(t, min(total[d], lim.MinCostMilli*int64(nl)))
		}
		if t < 0 {
			t = 0
		}
		for k := 0; k < nl; k++ {
			dm := in[live[k]].DemandMilli
			if d == 1 {
				// Burst demand: the same demand scaled from L to B.
				dm = mulDiv(min(dm, lim.RateMilli), lim.BurstMilli, lim.RateMilli)
			}
			demand[k] = min(dm, t)
		}
		var out [MaxRegions]int64
		c.fill(t, floors[d], demand[:nl], out[:nl])
		for k := 0; k < nl; k++ {
			// Headroom cap: leftover beyond max(default, H*demand) stays
			// unallocated, so a region keeps at collection (Keep) what
			// its target gives it and shares do not churn.
			v[d][live[k]] = min(out[k], max(def[d], mulDiv(demand[k], c.HeadroomPermille, 1000)))
		}
	}
}

// Keep returns what region self may keep of its share claim at the end of
// an epoch in which it measured demandMilli (its demand rate of that
// epoch, milli cost units per second, rejected attempts included), before
// it publishes its report: per dimension, a claim above max(Default(),
// H*demand) shrinks to max(floor, H*demand) (H = HeadroomPermille, floor
// as in Targets, burst demand scaled from L to B); other claims are kept.
// The result is never above claim and never mixed. Keep lets a region
// give up share it stopped using before the others decide the same epoch,
// which saves one epoch of lag on every shift of demand. The error wraps
// ErrLimit or ErrConfig, or ErrInput for a negative demand or a claim out
// of range. It does not allocate.
func (c Config) Keep(lim Limit, claim Share, demandMilli int64) (Share, error) {
	if err := c.Validate(); err != nil {
		return Share{}, err
	}
	if err := lim.Validate(); err != nil {
		return Share{}, err
	}
	switch {
	case demandMilli < 0:
		return Share{}, fmt.Errorf("%w: DemandMilli %d is negative", ErrInput, demandMilli)
	case claim.RateMilli < 0 || claim.RateMilli > lim.RateMilli:
		return Share{}, fmt.Errorf("%w: Claim.RateMilli %d not in 0..%d", ErrInput, claim.RateMilli, lim.RateMilli)
	case claim.BurstMilli < 0 || claim.BurstMilli > lim.BurstMilli:
		return Share{}, fmt.Errorf("%w: Claim.BurstMilli %d not in 0..%d", ErrInput, claim.BurstMilli, lim.BurstMilli)
	}
	def := lim.defaultDims()
	floors := c.floors(lim)
	cl := claim.dims()
	need := dims{min(demandMilli, lim.RateMilli), 0}
	need[1] = mulDiv(need[0], lim.BurstMilli, lim.RateMilli)
	var out dims
	for d := 0; d < 2; d++ {
		h := mulDiv(need[d], c.HeadroomPermille, 1000)
		out[d] = cl[d]
		if cl[d] > max(def[d], h) {
			out[d] = min(cl[d], max(floors[d], h))
		}
	}
	return fromDims(unmix(out, def)), nil
}

// fill water-fills total over demand (each <= total) with a floor per
// region, and spreads what is left; see the package doc. len(out) ==
// len(demand) >= 1.
func (c Config) fill(total, floor int64, demand, out []int64) {
	n := int64(len(demand))
	if floor*n > total {
		floor = total / n
	}
	rem := total - floor*n
	// Excess demand above the floor, and the order of the regions by it
	// (insertion sort: n is small).
	var excess [MaxRegions]int64
	var order [MaxRegions]int
	for i, d := range demand {
		excess[i] = max(d-floor, 0)
		j := i
		for j > 0 && excess[order[j-1]] > excess[i] {
			order[j] = order[j-1]
			j--
		}
		order[j] = i
	}
	var given [MaxRegions]int64
	for k := 0; k < len(demand); k++ {
		i := order[k]
		cnt := n - int64(k)
		if excess[i]*cnt <= rem {
			given[i] = excess[i]
			rem -= excess[i]
			continue
		}
		level := rem / cnt
		for ; k < len(demand); k++ {
			given[order[k]] = level
		}
		rem -= level * cnt
	}
	// Over-subscribed (the demand above the floors exceeds what is left):
	// ProportionalPermille of the amount is split in proportion to the
	// excess demand instead of water-filled. Each part is at most the
	// region's excess (rem0 < ex), so no region gets more than its demand
	// and the sum stays within total; the rounding dust is spread below.
	if p := c.ProportionalPermille; p > 0 {
		var ex int64
		for i := range demand {
			ex += excess[i]
		}
		if rem0 := total - floor*n; ex > rem0 {
			rem = rem0
			for i := range demand {
				given[i] = mulDiv(given[i], 1000-p, 1000) + mulDiv(mulDiv(rem0, excess[i], ex), p, 1000)
				rem -= given[i]
			}
		}
	}
	// rem is now the leftover: every demand is met (or rounding dust).
	var sum int64
	for i := range demand {
		sum += floor + given[i]
	}
	for i := range demand {
		a := floor + given[i]
		var extra int64
		if sum == 0 {
			extra = rem / n
		} else {
			// rem * (S*sum + (1000-S)*n*a) / (1000*n*sum): an equal part
			// and a proportional part in one floored division.
			w := c.SpreadPermille*sum + (1000-c.SpreadPermille)*n*a
			extra = mulDiv(rem, w, 1000*n*sum)
		}
		out[i] = a + extra
	}
}

// Want returns how much region self asks to grow: (t - claim)+ per
// dimension, t being its damped target. A region publishes its want in its
// report; in Mode Grow the growth of every region is split in proportion
// to the published wants. Want is zero unless the region would grow. The
// error wraps ErrLimit, ErrInput or ErrConfig. It does not allocate.
func (c Config) Want(lim Limit, self int, in []RegionInput) (Share, error) {
	if err := c.Validate(); err != nil {
		return Share{}, err
	}
	if err := check(lim, self, in); err != nil {
		return Share{}, err
	}
	t := c.damped(lim, self, in)
	claim := in[self].Claim.dims()
	var w dims
	for d := 0; d < 2; d++ {
		w[d] = max(t[d]-claim[d], 0)
	}
	return fromDims(w), nil
}

// damped returns region self's damped target per dimension.
func (c Config) damped(lim Limit, self int, in []RegionInput) dims {
	var v [2][MaxRegions]int64
	c.targets(lim, in, &v)
	claim := in[self].Claim.dims()
	var t dims
	for d := 0; d < 2; d++ {
		// Go's division truncates toward zero, so the step rounds toward
		// the claim.
		t[d] = claim[d] + (v[d][self]-claim[d])*c.DampingPermille/1000
	}
	return t
}

// Next returns region self's next share for one key from its view in and
// the mode: see the package doc. Inputs are not modified. It does not
// allocate. The error wraps ErrLimit, ErrInput or ErrConfig; on error the
// caller should keep the current share (never raise it).
func (c Config) Next(lim Limit, self int, in []RegionInput, mode Mode) (Share, error) {
	if err := c.Validate(); err != nil {
		return Share{}, err
	}
	if err := check(lim, self, in); err != nil {
		return Share{}, err
	}
	claim := in[self].Claim.dims()
	def := lim.defaultDims()
	var next dims
	switch mode {
	case Hold, Grow, Fallback:
		t := c.damped(lim, self, in)
		for d := 0; d < 2; d++ {
			next[d] = min(claim[d], t[d])
			if mode == Fallback {
				next[d] = min(next[d], def[d])
			}
		}
		if mode == Grow {
			limit := lim.dims()
			want := in[self].Want.dims()
			for d := 0; d < 2; d++ {
				if t[d] <= claim[d] || want[d] == 0 {
					continue
				}
				slack, wsum, nsum := limit[d], int64(0), int64(0)
				for i := range in {
					if in[i].Silent {
						slack -= def[d]
						continue
					}
					slack -= in[i].Claim.dims()[d]
					w := in[i].Want.dims()[d]
					wsum += w
					if needs(lim, in[i], d) {
						nsum += w
					}
				}
				if slack <= 0 {
					continue
				}
				var part int64
				switch {
				case nsum == 0:
					part = mulDiv(slack, want[d], wsum)
				case needs(lim, in[self], d):
					part = mulDiv(slack, want[d], nsum)
				}
				next[d] = claim[d] + min(part, t[d]-claim[d])
			}
		}
	default:
		return Share{}, fmt.Errorf("%w: unknown mode %d", ErrInput, uint8(mode))
	}
	return fromDims(unmix(next, def)), nil
}

// needs reports whether region r's published demand is above its claim in
// dimension d (burst demand scaled from L to B, as in Targets): its want
// is a need, served before the wants of regions that do not use their
// claim (which want to return to the default of an idle key, or grow from
// a view older than the decision's).
func needs(lim Limit, r RegionInput, d int) bool {
	if r.Silent || r.Want.dims()[d] == 0 {
		return false
	}
	dm := r.DemandMilli
	if d == 1 {
		dm = mulDiv(min(dm, lim.RateMilli), lim.BurstMilli, lim.RateMilli)
	}
	return dm > r.Claim.dims()[d]
}

// unmix clamps the dimension above the default to the default when the
// other is below it, so a share is never mixed.
func unmix(s, def dims) dims {
	switch {
	case s[0] > def[0] && s[1] < def[1]:
		s[0] = def[0]
	case s[1] > def[1] && s[0] < def[0]:
		s[1] = def[1]
	}
	return s
}

// Mixed reports whether s is above the default in one dimension and below
// it in the other; Next never returns a mixed share.
func (l Limit) Mixed(s Share) bool {
	def := l.Default()
	return (s.RateMilli > def.RateMilli && s.BurstMilli < def.BurstMilli) ||
		(s.BurstMilli > def.BurstMilli && s.RateMilli < def.RateMilli)
}

// AboveDefault reports whether s exceeds the default in either dimension.
func (l Limit) AboveDefault(s Share) bool {
	def := l.Default()
	return s.RateMilli > def.RateMilli || s.BurstMilli > def.BurstMilli
}

// mulDiv returns floor(a*b/c) for a, b >= 0 and c > 0 with a 128-bit
// intermediate, saturating at MaxInt64; 0 when c <= 0.
func mulDiv(a, b, c int64) int64 {
	if c <= 0 || a <= 0 || b <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi == 0 {
		return int64(min(lo/uint64(c), 1<<63-1))
	}
	if hi >= uint64(c) {
		return 1<<63 - 1
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(q)
}

// MulDiv returns floor(a*b/c) for a, b >= 0 and c > 0 computed without
// overflow, saturating at the largest int64; 0 when any argument is out of
// range. Package rebalancer uses it to convert per-epoch demand to rates.
func MulDiv(a, b, c int64) int64 { return mulDiv(a, b, c) }
