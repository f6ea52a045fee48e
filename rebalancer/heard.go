package rebalancer

import (
	"fmt"
	"math/bits"
	"slices"

	"github.com/quotientlabs/quotient/shares"
)

// The heard matrix and the partition rule (see the package doc, "The
// decision and the partition rule", for the rule and its proof). This file
// holds what the Core knows of who hears whom, how reports carry it, and the
// tests the decision makes of it; core.go calls them.

// row is the heard vector of the newest report of one region that this
// Core knows of, received directly or relayed in another region's report.
type row struct {
	known   bool
	epoch   int64   // the report's epoch
	started int64   // the report's Started (0: not said)
	heard   []int64 // by region index: the report's Heard; -1 when absent
}

// noEpoch stands for "never heard" in a row (epochs are >= 0).
const noEpoch = -1

// setRow makes r the row of a report of epoch and started with heard.
func (c *Core) setRow(r *row, epoch, started int64, heard []Heard) {
	if r.heard == nil {
		r.heard = make([]int64, len(c.regions))
	}
	r.known, r.epoch, r.started = true, epoch, started
	for i := range r.heard {
		r.heard[i] = noEpoch
	}
	for _, h := range heard {
		if i, ok := c.index[h.Region]; ok && h.Epoch > r.heard[i] {
			r.heard[i] = h.Epoch
		}
	}
}

// checkRelay validates a received report's relayed rows: a relayed report
// cannot be of an epoch after the report that relays it by more than one
// (clock skew), nor negative. Rows of regions this Core does not know are
// ignored (a region being added or removed).
func checkRelay(r *Report) error {
	if r.Started < 0 || r.Started > r.Epoch {
		return fmt.Errorf("%w: region %s epoch %d: Started %d not in 0..%d", ErrReport, r.Region, r.Epoch, r.Started, r.Epoch)
	}
	for i, rr := range r.Relay {
		if rr.Epoch < 0 || rr.Epoch > r.Epoch+1 {
			return fmt.Errorf("%w: region %s epoch %d: relayed report %d (of region %q) has epoch %d, not in 0..%d", ErrReport, r.Region, r.Epoch, i, rr.Region, rr.Epoch, r.Epoch+1)
		}
		if rr.Started < 0 || rr.Started > rr.Epoch {
			return fmt.Errorf("%w: region %s epoch %d: relayed report %d (of region %q) has Started %d, not in 0..%d", ErrReport, r.Region, r.Epoch, i, rr.Region, rr.Started, rr.Epoch)
		}
	}
	return nil
}

// learn takes what report r of region qi says about who hears whom: its
// own heard vector, and the rows it relays, each kept when it is newer
// (by epoch) than the row this Core has for that region. Rows only move
// forward, so the result does not depend on the order of reports, and a
// duplicate changes nothing.
func (c *Core) learn(qi int, r *Report) {
	if q := &c.remote[qi]; !q.row.known || r.Epoch > q.row.epoch {
		c.setRow(&q.row, r.Epoch, r.Started, r.Heard)
	}
	for _, rr := range r.Relay {
		i, ok := c.index[rr.Region]
		if !ok || i == c.self || i == qi {
			continue
		}
		if q := &c.remote[i]; !q.row.known || rr.Epoch > q.row.epoch {
			c.setRow(&q.row, rr.Epoch, rr.Started, rr.Heard)
		}
	}
}

// relay returns the rows this Core relays in its next report: the newest
// row it knows of each other region.
func (c *Core) relay() []Relayed {
	var out []Relayed
	for i := range c.regions {
		q := &c.remote[i]
		if i == c.self || !q.row.known {
			continue
		}
		rr := Relayed{Region: c.regions[i], Epoch: q.row.epoch, Started: q.row.started}
		for j, e := range q.row.heard {
			if e != noEpoch {
				rr.Heard = append(rr.Heard, Heard{Region: c.regions[j], Epoch: e})
			}
		}
		out = append(out, rr)
	}
	return out
}

// silentAt reports whether region i is silent at the decision of epoch m:
// with S = silenceBound(), this Core has no report of it of epochs
// m-S..m, and no row it knows says that anyone heard it since epoch
// m-S-1, nor is there a row of one of its own reports of those epochs
// (relayed). A silent region is counted at exactly the default. (Before
// the heard matrix, silence was only the first part, with S = K; the
// second keeps a region that others still hear from being counted at the
// default by a region that does not: see the package doc.)
func (c *Core) silentAt(i int, m int64) bool {
	k := c.silenceBound()
	q := &c.remote[i]
	if q.heard && q.last > m-k-1 {
		return false
	}
	if q.row.known && q.row.epoch > m-k-1 {
		return false
	}
	for j := range c.regions {
		if j == c.self || j == i {
			continue
		}
		if r := &c.remote[j].row; r.known && r.heard[i] > m-k-1 {
			return false
		}
	}
	return true
}

// silence fills c.sil with silentAt for every region at epoch m (self:
// false) and returns it; reportFor reads it during a decision.
func (c *Core) silence(m int64) []bool {
	if c.sil == nil {
		c.sil = make([]bool, len(c.regions))
	}
	for i := range c.regions {
		c.sil[i] = i != c.self && c.silentAt(i, m)
	}
	c.silM, c.silOn = m, true
	return c.sil
}

// silentFor is silentAt, from c.sil when it holds epoch m.
func (c *Core) silentFor(i int, m int64) bool {
	if c.silOn && c.silM == m {
		return c.sil[i]
	}
	return c.silentAt(i, m)
}

// usable reports whether the row of region u is evidence for the majority
// rule at epoch m: it is recent (of epoch m-K+1 or later) and its sender's
// Core had collected more than S epochs when it sent it (S =
// silenceBound()), so what it says it heard is what its region heard in
// the epochs that matter (a Core that started later, after a restart or a
// leader change, may have forgotten reports its predecessor received).
func (c *Core) usable(u int, m int64) bool {
	k := c.cfg.SilenceEpochs
	r := &c.remote[u].row
	return r.known && r.started > 0 && r.epoch-r.started > c.silenceBound() && r.epoch > m-k
}

// hears reports whether this Core's knowledge at the decision of m shows
// that u heard v recently (a report of v of epoch m-K+1 or later): for u
// = self from its own reports received, else from u's usable row.
func (c *Core) hears(u, v int, m int64) bool {
	k := c.cfg.SilenceEpochs
	if u == c.self {
		q := &c.remote[v]
		return q.heard && q.last > m-k
	}
	return c.usable(u, m) && c.remote[u].row.heard[v] > m-k
}

// inMajority reports whether this region is in a majority clique at the
// decision of m: more than half of the regions, this one included, each
// pair of which hear each other recently as this Core's knowledge shows.
func (c *Core) inMajority(m int64) bool {
	n := len(c.regions)
	need := n/2 + 1 // members, this region included
	var cand []int
	for u := range c.regions {
		if u != c.self && c.hears(c.self, u, m) && c.hears(u, c.self, m) {
			cand = append(cand, u)
		}
	}
	if 1+len(cand) < need {
		return false
	}
	// adj[a] has bit b set when candidates a and b hear each other.
	adj := make([]uint32, len(cand))
	for a, u := range cand {
		for b, v := range cand {
			if a != b && c.hears(u, v, m) && c.hears(v, u, m) {
				adj[a] |= 1 << b
			}
		}
	}
	return clique(adj, (1<<len(cand))-1, need-1)
}

// clique reports whether the candidates in set (a bit mask over adj)
// contain a clique of size k. n <= shares.MaxRegions = 16, so the search
// is small; it stops at the first clique found.
func clique(adj []uint32, set uint32, k int) bool {
	if k <= 0 {
		return true
	}
	if bits.OnesCount32(set) < k {
		return false
	}
	for set != 0 {
		a := bits.TrailingZeros32(set)
		set &^= 1 << a
		if clique(adj, set&adj[a], k-1) {
			return true
		}
		if bits.OnesCount32(set) < k {
			return false
		}
	}
	return false
}

// majorityOn reports whether the configuration allows the majority rule:
// WarmupEpochs >= max(2K-1, S+1) with S = K+R-2 the majority rule's
// silence bound (see the package doc: a restarted region must not rise to
// the default before the others count it silent, S+1 epochs; 2K-1 is the
// bound of the rule's first version, kept so that no configuration that
// ran without the majority rule runs with it now).
func (c *Core) majorityOn() bool {
	k := c.cfg.SilenceEpochs
	return c.cfg.WarmupEpochs >= max(2*k-1, k+c.recordEpochs()-1)
}

// silenceBound is S: a region is silent after S+1 epochs without a report
// of it. S = K+R-2 with the majority rule (R = Config.RecordEpochs: the
// records above the default of a region that grew while its reports were
// lost expire an epoch before; package doc, "Why a silent region is at
// most the default"), else K as before the heard matrix.
func (c *Core) silenceBound() int64 {
	if c.majorityOn() {
		return c.cfg.SilenceEpochs + c.recordEpochs() - 2
	}
	return c.cfg.SilenceEpochs
}

// majorityRule reports whether the majority rule keeps this region out of
// fallback at the decision of m: the configuration allows it, its Core has
// collected more than S epochs (so what it counts as silent it has not
// heard itself, not merely forgotten), and it is in a majority clique.
func (c *Core) majorityRule(m int64) bool {
	return c.majorityOn() && m > c.firstEpoch+c.silenceBound() && c.inMajority(m)
}

// overCommitted reports whether the claims of view in, silent regions at
// the default, exceed the limit in either dimension.
func overCommitted(lim shares.Limit, in []shares.RegionInput) bool {
	def := lim.Default()
	var rate, burst int64
	for _, r := range in {
		s := r.Claim
		if r.Silent {
			s = def
		}
		rate, burst = satAdd(rate, s.RateMilli), satAdd(burst, s.BurstMilli)
	}
	return rate > lim.RateMilli || burst > lim.BurstMilli
}

// unheard returns the regions (not this one, not silent) of which this
// region has no report of epochs m-K+1..m: the regions whose absence
// would put it in fallback by the rule before the heard matrix, and which
// the majority rule holds at their last claims instead. Such a region may
// enforce more than its last claim: a share record below the default is
// lost when its Redis restarts empty (no persistence), and the region's
// gateways then enforce the default, before its coordinator can say so.
func (c *Core) unheard(m int64, silent []int) []int {
	if c.fallback {
		return nil
	}
	var out []int
	for i := range c.regions {
		if i == c.self || slices.Contains(silent, i) {
			continue
		}
		q := &c.remote[i]
		if !q.heard || q.last <= m-c.cfg.SilenceEpochs {
			out = append(out, i)
		}
	}
	return out
}

// overCommittedUnheard reports whether the claims of in exceed the limit
// when every region of unheard is counted at max(its last claim, the
// default): what it enforces if its store lost its records (TestBinariesRedisKilled
// restarts a region's Redis empty while the others hold).
func overCommittedUnheard(lim shares.Limit, in []shares.RegionInput, unheard []int) bool {
	def := lim.Default()
	var rate, burst int64
	for i, r := range in {
		s := r.Claim
		if r.Silent {
			s = def
		} else if slices.Contains(unheard, i) {
			s = shares.Share{RateMilli: max(s.RateMilli, def.RateMilli), BurstMilli: max(s.BurstMilli, def.BurstMilli)}
		}
		rate, burst = satAdd(rate, s.RateMilli), satAdd(burst, s.BurstMilli)
	}
	return rate > lim.RateMilli || burst > lim.BurstMilli
}

// isolated returns the regions (not this one, not silent, not in unheard)
// whose report in the view of epoch m says they heard no other region in
// epochs m-K..m: a region that hears nobody for long enough raises its
// shares to the default in fallback (rises), so such a region is counted
// at max(its claim, the default), as an unheard one, and no growth is
// decided while one is in the view (package doc, "Rise"). Reports of
// older senders (Started 0) never show it: those never rise. (K+1 epochs,
// not K: a region that heard nobody after h rises at h+K+R, and only the
// decisions of h+K+1 on must count it at the default; counting it one
// epoch sooner lowered shares for nothing.)
func (c *Core) isolated(m int64, silent, unheard []int) []int {
	if c.fallback {
		return nil
	}
	var out []int
	for i := range c.regions {
		if i == c.self || slices.Contains(silent, i) || slices.Contains(unheard, i) {
			continue
		}
		if s := c.reportFor(i, m); s != nil && s.started > 0 && s.heardMax <= m-c.cfg.SilenceEpochs-1 {
			out = append(out, i)
		}
	}
	return out
}

// heardLast returns the epoch after which this region's Core received
// nothing from any other region: the highest epoch of a report it
// received from another region, and at least its first collected epoch
// (a Core does not know what its predecessor heard).
func (c *Core) heardLast() int64 {
	h := c.firstEpoch
	for i := range c.remote {
		if i != c.self && c.remote[i].heard {
			h = max(h, c.remote[i].last)
		}
	}
	return h
}

// rises reports whether this region, in fallback at the decision of m,
// raises its shares to the default: it is out of warm-up, the majority
// rule is on (every region then runs the rules that count it at the
// default: isolated, unheard, silent), and it heard no other region for
// K+R epochs (R = Config.RecordEpochs), m >= heardLast()+K+R. Every
// decision of epoch heardLast()+K+1 or later, by any region, then counts
// it at the default or more, and every record decided before that and
// above the default has expired an epoch before this rise takes effect
// (package doc, "Rise").
func (c *Core) rises(m int64) bool {
	return c.fallback && !c.warm(m) && c.majorityOn() && m >= c.heardLast()+c.cfg.SilenceEpochs+c.recordEpochs()
}
