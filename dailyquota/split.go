package dailyquota

import (
	"fmt"
	"math/bits"
	"sort"
)

// SplitConfig configures the remainder split. Start from
// DefaultSplitConfig.
type SplitConfig struct {
	// BelowPermille: the remainder of a window is split among the regions
	// once it is at most this many thousandths of the limit. 0 < x <= 1000.
	// Default 200 (the last 20% of a quota). 1000 splits from the start.
	BelowPermille int64
	// QuietPermille is the weight of a region with no admissions in the
	// window, in thousandths of the average region's admissions, so a
	// region whose demand starts late still gets a part. Default 100.
	QuietPermille int64
}

// DefaultSplitConfig returns the defaults.
func DefaultSplitConfig() SplitConfig { return SplitConfig{BelowPermille: 200, QuietPermille: 100} }

// Validate fills defaults and rejects bad values, naming the field.
func (c *SplitConfig) Validate() error {
	d := DefaultSplitConfig()
	if c.BelowPermille == 0 {
		c.BelowPermille = d.BelowPermille
	}
	if c.BelowPermille < 0 || c.BelowPermille > 1000 {
		return fmt.Errorf("%w: split: below permille %d: want 1 to 1000", ErrInvalid, c.BelowPermille)
	}
	if c.QuietPermille == 0 {
		c.QuietPermille = d.QuietPermille
	}
	if c.QuietPermille < 0 || c.QuietPermille > 1_000_000 {
		return fmt.Errorf("%w: split: quiet permille %d: want 1 to 1000000", ErrInvalid, c.QuietPermille)
	}
	return nil
}

// Caps computes every region's cap for one window of a policy with limit
// cost units, from the replicated counts (region -> admitted) and the list
// of regions (regions present only in counts are added). It returns nil
// while the remainder R = limit - Σ counts is above BelowPermille of the
// limit: no caps, every region admits against the sum. Otherwise region r's
// cap is counts[r] + part_r, where the parts split R exactly (Σ parts = R)
// in proportion to the regions' weights, w_r = counts[r] + quiet, quiet =
// QuietPermille/1000 of the average count (at least 1): the admissions so
// far in the window are the recent demand every region sees alike. Integer
// arithmetic throughout (128-bit products), largest remainders get the
// leftover units, ties broken by region name: the same counts give the same
// caps in every region. With R <= 0 every cap equals the region's count.
//
// Why: while every region enforces its cap, the regions together admit at
// most Σ caps = limit from the view the caps were computed from, whatever
// the replication does; a region cut off from the others can overspend the
// true remainder by at most its own part (without caps: by the whole
// remainder it saw). Caps is pure.
func Caps(limit int64, regions []string, counts map[string]int64, cfg SplitConfig) map[string]int64 {
	if cfg.Validate() != nil {
		return nil
	}
	all := map[string]bool{}
	for _, r := range regions {
		all[r] = true
	}
	var total int64
	for r, c := range counts {
		all[r] = true
		total += max(0, c)
	}
	names := make([]string, 0, len(all))
	for r := range all {
		names = append(names, r)
	}
	sort.Strings(names)
	rem := limit - total
	if rem*1000 > cfg.BelowPermille*limit {
		return nil
	}
	caps := make(map[string]int64, len(names))
	for _, r := range names {
		caps[r] = max(0, counts[r])
	}
	if rem <= 0 || len(names) == 0 {
		return caps
	}
	n := int64(len(names))
	quiet := max(1, total*cfg.QuietPermille/(1000*n))
	weights := make([]uint64, len(names))
	var sumW uint64
	for i, r := range names {
		weights[i] = uint64(max(0, counts[r]) + quiet)
		sumW += weights[i]
	}
	type frac struct {
		i   int
		rem uint64
	}
	fr := make([]frac, len(names))
	var given int64
	for i, w := range weights {
		hi, lo := bits.Mul64(uint64(rem), w)
		q, r := bits.Div64(hi, lo, sumW) // hi < sumW since w <= sumW and rem < 2^63
		caps[names[i]] += int64(q)
		given += int64(q)
		fr[i] = frac{i, r}
	}
	sort.SliceStable(fr, func(a, b int) bool { return fr[a].rem > fr[b].rem })
	for k := 0; given < rem; k++ {
		caps[names[fr[k].i]]++
		given++
	}
	return caps
}
