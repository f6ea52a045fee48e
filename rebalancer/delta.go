package rebalancer

import (
	"fmt"
	"iter"
	"slices"

	"github.com/quotientlabs/quotient/shares"
)

// Delta reports (issue 15; package doc, "Delta reports"). A sender keeps
// its last full report (sentBase) and makes each delta against it; a
// receiver keeps each region's last full report (remote.full) and stores
// a delta as an overlay of it (stored.base), which reads as the report the
// full one would have given.
// This file holds both sides; Collect and Receive call them.

// sentBase is the last full report this Core published: what its deltas
// are relative to. Its key indices are counted in Core.refs, so they keep
// naming the same keys while it is held.
type sentBase struct {
	epoch   int64
	idx     []int32     // by line: the key's index
	pos     []int32     // by key index: line+1; 0 or past the end: not in the base
	lines   []sentLine  // by line
	wants   shareColumn // by line: the want
	matched []bool      // by line, scratch of one delta: the key is reported now
}

// sentLine is what a delta compares of one line of the base, with its
// want (sentBase.wants).
type sentLine struct {
	demand, admitted, smoothed int64
	share                      shares.Share
}

// deltaSender is a Core's sending side of deltas.
type deltaSender struct {
	base    *sentBase
	since   int   // reports published since the base (deltas)
	lastPub int64 // epoch of the last report Collect returned; valid when pub
	pub     bool
	next    *sentBase // the full report being made by this Collect, when it is one
	tol     int64     // the demand tolerance of this Collect's delta, permille
}

// deltaFor reports whether the report of epoch m is a delta: deltas are
// on, a base exists (of an epoch > 0, so that Base > 0 marks a delta), the
// previous epoch's report was published by this Core (no gap), fewer than
// FullEvery-1 deltas followed the base, and every region this Core hears
// accepts deltas and does not show that it lacks the base (lacksBase).
func (c *Core) deltaFor(m int64) bool {
	ds := &c.ds
	if !c.cfg.Deltas || ds.base == nil || ds.base.epoch <= 0 || !ds.pub || ds.lastPub != m-1 || ds.since >= c.cfg.FullEvery-1 {
		return false
	}
	for i := range c.remote {
		if q := &c.remote[i]; i != c.self && q.heard && (!q.accepts || c.lacksBase(q)) {
			return false
		}
	}
	return true
}

// lacksBase reports whether region q may not hold this Core's base: its
// heard of this region (in its latest report) is before the base, unless
// that report is of the base's own epoch (collected before the base
// could arrive). So a region that says it applied nothing of this region
// since before the base, and a region not heard since before the base
// (silent, cut off, or late: it cannot have said anything), get full
// reports. Every report of this Core of the base's epoch or later is the
// base or a delta against it, so q holds the base once its heard of this
// region reaches the base's epoch. A lost base then costs a receiver
// about two epochs of this region's reports instead of up to FullEvery-1,
// and after a partition heals both sides send full reports at once
// (their deltas would be Unbased across it). A wrong answer only makes
// more or fewer full reports, never anything unsafe.
func (c *Core) lacksBase(q *remote) bool {
	return q.heardSelf < c.ds.base.epoch && q.last != c.ds.base.epoch
}

// startReport prepares the sending side for the report of epoch m: a
// delta (true) or a full report, which becomes the next base when deltas
// are on. exact: the usage is the epoch's (Collect); otherwise (a lower
// bound, or unknown) the delta is exact, so that leaving a key out never
// lowers its smoothed demand (see CollectIncomplete).
func (c *Core) startReport(m int64, exact bool) bool {
	ds := &c.ds
	ds.next = nil
	ds.tol = 0
	if exact {
		ds.tol = c.cfg.DeltaDemandPermille
	}
	if c.deltaFor(m) {
		clear(ds.base.matched)
		return true
	}
	if c.cfg.Deltas {
		ds.next = &sentBase{epoch: m, idx: make([]int32, 0, c.nheld), lines: make([]sentLine, 0, c.nheld), wants: makeShareColumn(c.nheld)}
	}
	return false
}

// reportLine adds kr, the line of the key of index j, to rep: always to a
// full report (and to the next base), to a delta only when the base has no
// line for the key or a line that differs (sameLine). It returns the
// smoothed demand the report publishes for the key: kr's, or the base's
// when the delta leaves the key out (the caller makes it the key's
// smoothed demand, so that this region's own view decides from what the
// others read: package doc, "Delta reports").
func (c *Core) reportLine(rep *Report, delta bool, j int32, kr KeyReport) int64 {
	ds := &c.ds
	if !delta {
		rep.Keys = append(rep.Keys, kr)
		if ds.next != nil {
			ds.next.idx = append(ds.next.idx, j)
			ds.next.lines = append(ds.next.lines, sentLine{demand: kr.Demand, admitted: kr.Admitted, smoothed: kr.SmoothedDemandMilli, share: kr.Share})
			ds.next.wants.push(kr.Want)
		}
		return kr.SmoothedDemandMilli
	}
	b := ds.base
	if int(j) < len(b.pos) {
		if l := b.pos[j]; l > 0 {
			b.matched[l-1] = true
			if bl := &b.lines[l-1]; sameLine(bl, b.wants.get(int(l-1)), &kr, ds.tol) {
				return bl.smoothed
			}
		}
	}
	rep.Keys = append(rep.Keys, kr)
	return kr.SmoothedDemandMilli
}

// finishReport completes the report of epoch m: a delta gets its Removed
// lines (keys of the base it does not report) and Base; a full report
// replaces the base.
func (c *Core) finishReport(rep *Report, delta bool) {
	ds := &c.ds
	rep.AcceptsDelta = true
	ds.pub, ds.lastPub = true, rep.Epoch
	if delta {
		b := ds.base
		n := len(rep.Keys)
		for l, ok := range b.matched {
			if !ok {
				rep.Keys = append(rep.Keys, KeyReport{Key: c.tab.key(b.idx[l]), Removed: true})
			}
		}
		if len(rep.Keys) > n {
			slices.SortFunc(rep.Keys, func(a, b KeyReport) int { return compareKeys(a.Key, b.Key) })
		}
		rep.Base = b.epoch
		ds.since++
		c.stats.Deltas++
		return
	}
	c.dropBase()
	ds.since = 0
	if nb := ds.next; nb != nil {
		ds.next = nil
		nb.pos = make([]int32, c.tab.size())
		for l, j := range nb.idx {
			nb.pos[j] = int32(l) + 1
			c.refs[j]++
		}
		nb.matched = make([]bool, len(nb.idx))
		ds.base = nb
	}
}

// dropBase lets the sending side's base go.
func (c *Core) dropBase() {
	b := c.ds.base
	if b == nil {
		return
	}
	c.ds.base = nil
	for _, j := range b.idx {
		if c.refs[j]--; c.refs[j] == 0 {
			c.release(j)
		}
	}
}

// noReport notes that Collect returned no report for its epoch (warm-up):
// the next report is full.
func (c *Core) noReport() { c.ds.pub = false }

// sameLine reports whether kr may be left out of a delta whose base has
// line b and want: its claims (Share, Want) equal the base's exactly, and
// each demand field is within tol permille of the base's (exact when tol
// is 0).
func sameLine(b *sentLine, want shares.Share, kr *KeyReport, tol int64) bool {
	return kr.Share == b.share && kr.Want == want &&
		near(kr.Demand, b.demand, tol) && near(kr.Admitted, b.admitted, tol) && near(kr.SmoothedDemandMilli, b.smoothed, tol)
}

// near reports whether v is within tol permille of base (both >= 0).
func near(v, base, tol int64) bool {
	if v == base {
		return true
	}
	if tol == 0 || base <= 0 {
		return false
	}
	d := v - base
	if d < 0 {
		d = -d
	}
	return d <= shares.MulDiv(base, tol, 1000)
}

// setFull makes s, region q's full report just stored, the region's base
// for its deltas (when it is newer than the one held): its key indices
// are counted once more in refs, for the base.
func (c *Core) setFull(q *remote, s *stored, epoch int64) {
	if q.full != nil && epoch <= q.fullEpoch {
		return
	}
	c.dropFull(q)
	q.full, q.fullEpoch = s, epoch
	for _, j := range s.idx {
		c.refs[j]++
	}
}

// dropFull lets region q's base go.
func (c *Core) dropFull(q *remote) {
	if q.full != nil {
		c.drop(q.full)
		q.full = nil
	}
}

// baseOf returns the base that delta r of region q is relative to, or nil
// when this Core does not hold it: the region's last full report held is
// of epoch r.Base and from the same sender Core (Started).
func baseOf(q *remote, r *Report) *stored {
	if q.full == nil || q.fullEpoch != r.Base || q.full.started != r.Started {
		return nil
	}
	return q.full
}

// overlay returns the stored form of delta r (its lines' key indices idx,
// and pos: line+1 by key index) against base b: an overlay of b holding
// r's lines that are not Removed, with the base's lines r removes marked
// gone. An error (wrapping ErrReport) when r removes a key b does not
// have.
func (c *Core) overlay(b *stored, r *Report, idx, pos []int32) (*stored, error) {
	s := &stored{base: b}
	n := 0
	for l, j := range idx {
		k := &r.Keys[l]
		if !k.Removed {
			n++
			continue
		}
		at := b.ownLineIndex(j)
		if at < 0 {
			return nil, fmt.Errorf("%w: region %s epoch %d: key %s/%s removed, but not in base %d", ErrReport, r.Region, r.Epoch, k.PolicyID, k.Subject, r.Base)
		}
		if s.gone == nil {
			s.gone = make([]bool, len(b.lines))
		}
		s.gone[at] = true
	}
	if n == 0 {
		return s, nil
	}
	s.lines, s.wants, s.idx = make([]line, 0, n), makeShareColumn(n), idx[:0:n]
	if n < len(idx) {
		s.idx = make([]int32, 0, n)
	}
	for l, j := range idx {
		k := &r.Keys[l]
		if k.Removed {
			pos[j] = 0
			continue
		}
		s.lines = append(s.lines, line{smoothed: k.SmoothedDemandMilli, share: k.Share})
		s.wants.push(k.Want)
		s.idx = append(s.idx, j)
		pos[j] = int32(len(s.lines))
	}
	if n < len(pos)/2 {
		s.sparse = makeLineIndex(s.idx)
	} else {
		s.pos = slices.Clone(pos)
	}
	return s, nil
}

// ownLineIndex returns the line of s's own lines of the key of index j,
// or -1 (from pos: s is a full report, or the lines a delta lists; from
// sparse: a delta that lists few).
func (s *stored) ownLineIndex(j int32) int {
	if s.pos == nil {
		return s.sparse.get(j)
	}
	if int(j) < len(s.pos) {
		return int(s.pos[j]) - 1
	}
	return -1
}

// mentions yields the index of every key s mentions, once each: a full
// report's keys in its order; a delta's, its base's that it did not
// remove, then those it added.
func (s *stored) mentions() iter.Seq[int32] {
	return func(yield func(int32) bool) {
		b := s.base
		if b == nil {
			for _, j := range s.idx {
				if !yield(j) {
					return
				}
			}
			return
		}
		for l, j := range b.idx {
			if (s.gone == nil || !s.gone[l]) && !yield(j) {
				return
			}
		}
		for _, j := range s.idx {
			if b.ownLineIndex(j) < 0 && !yield(j) {
				return
			}
		}
	}
}

// NotPublished tells the Core that the report Collect returned for epoch
// could not be published (its updates were not written, or the bus
// refused it). The receivers then lack it: if it was a full report, every
// delta made against it would be Unbased, so the next report is full.
// Drivers call it on every failed publication; a Core not told (a driver
// that does not call it) stays safe, as for any lost report, but its
// receivers may miss up to FullEvery-1 of its reports. Calling it for
// another epoch than the last collected changes nothing.
func (c *Core) NotPublished(epoch int64) {
	if c.ds.pub && c.ds.lastPub == epoch {
		c.ds.pub = false
	}
}
