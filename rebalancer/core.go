package rebalancer

import (
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"

	"github.com/quotientlabs/quotient/shares"
)

// Core is the pure per-epoch step of one region's coordinator: it turns the
// usage the gateways flushed into the report to publish, collects the
// other regions' reports, and decides this region's next shares. It does no
// I/O, starts no goroutine and reads no clock: every method that needs the
// time takes it as now. Drivers (the coordinator, the simulator) call it.
//
// The cycle, once per epoch (see the package doc): Collect at the start of
// epoch m+1 (write Published.Late's updates, then publish the report);
// Receive every report that arrives; Decide when Due (write the updates).
//
// A Core is not safe for concurrent use; a driver serialises its calls.
// The zero value is not usable; use New.
type Core struct {
	cfg      Config
	policies Policies
	subjects SubjectPolicies // policies, when it has per-subject limits; else nil
	regions  []string        // sorted
	index    map[string]int
	self     int
	epochMs  int64

	started    bool
	firstEpoch int64 // first epoch collected
	published  int64 // last epoch collected
	pending    bool  // the decision for epoch published is not made yet
	ownReport  bool  // a report was published for epoch published
	decided    int64 // last epoch decided (valid when started)
	fallback   bool  // the last decision was in fallback
	again      bool  // epoch decided was held for an incomplete view: it may be decided again with growth (see Due)
	adopted    bool  // Adopt took the store's records: no warm-up
	fresh      bool  // StartFresh, not revoked since: no warm-up (fresh.go)
	restart    int64 // epoch this Core warms up from (firstEpoch, or after a revoked StartFresh)

	tab    *keyTable  // every key held or mentioned by a stored report, by index (keytable.go)
	st     stateTable // by key index; valid where held (keystate.go)
	wbase  int64      // the epoch keyState.written counts from
	refs   []int32    // by key index: how many stored reports mention the key
	nheld  int        // keys held
	order  []int32    // the keys held, sorted, as of the last tidy (some maybe gone)
	added  []int32    // keys held since the last tidy and not in order
	gone   int        // keys of order let go since the last tidy
	remote []remote   // by region index; remote[self] unused
	stats  Stats
	in     []shares.RegionInput // scratch, one per region
	tr     transfers            // asks and gives (transfer.go)
	ds     deltaSender          // the base of this region's deltas (delta.go)
	sil    []bool               // silentAt by region for epoch silM, while silOn (during a decision)
	silM   int64
	silOn  bool
	fresh1 []int32 // scratch of Receive: the indices it interned
	posBuf []int32 // scratch of Receive: a delta's lines by key index; all 0 between calls
	// usageHint is the index of each key of the last usage collected, in
	// its order (some maybe let go since): see collect.
	usageHint []int32

	// Lookup cache (performance only; see limit).
	lcOn   bool // lcID, lcLim, lcRes hold the last limit lookup of this call
	lcID   string
	lcLim  shares.Limit
	lcRes  uint8 // 0 found and valid, 1 unknown, 2 invalid
	lookup bool  // lineOf searches a report's lines instead of its index (tests compare both ways)
}

// epochUse is one key's usage of the epoch being collected, by key index
// in a slice that lives for one collect: summed over the usage entries of
// the key (a store may report a key in several entries).
type epochUse struct {
	demand, admitted int64 // cost units
}

// remote is what this region holds from another region.
type remote struct {
	reports   map[int64]*stored // by epoch
	heard     bool              // any report received
	last      int64             // highest epoch received
	heardSelf int64             // heard[self] in report last; -1 when absent
	row       row               // heard vector of the newest report of the region known (heard.go)
	accepts   bool              // report last says AcceptsDelta
	// full is the region's newest full report received (its key indices
	// counted in refs once more, for it), of epoch fullEpoch: the base
	// its deltas are overlays of (delta.go). nil: none.
	full      *stored
	fullEpoch int64
}

// stored is one received report, reduced to what decisions read: per line
// the sender's smoothed demand, claim and want, and the line of each key
// by its index, resolved once when the report is received. It holds no
// pointer besides its slices' and its base (the garbage collector scans
// none of the slices).
//
// A delta is stored as an overlay of its base (base not nil, a full
// report): lines, idx and pos then hold only the lines the delta lists
// (pos nil, and sparse indexing them, when they are fewer than half the
// table's keys), gone marks the base's lines it removed
// (nil when none), and every other line is the base's. So a delta that
// changes nothing costs a few words, not a copy of the base (mentions,
// lineOf).
type stored struct {
	seq   int64
	base  *stored     // a delta's base; nil for a full report
	lines []line      // the report's key lines, in its order (a delta's: only those it lists)
	wants shareColumn // by line: KeyReport.Want
	idx   []int32     // by line: the key's index
	pos   []int32     // by key index: line+1; 0 or past the end: not among lines; nil: see sparse
	// sparse is a delta's index of its lines by key index when it lists
	// few (pos nil): overlay.
	sparse lineIndex
	gone   []bool // a delta's: by line of base, removed by the delta; nil: none
	// started is the report's Started (0: an older sender); heardMax the
	// highest epoch its Heard says the sender received from another
	// region (noEpoch: none). A report with heardMax <= m-K shows its
	// sender isolated at the decision of m (heard.go, isolated).
	started, heardMax int64
}

// line is what a decision reads of one KeyReport.
type line struct {
	smoothed int64        // KeyReport.SmoothedDemandMilli
	share    shares.Share // KeyReport.Share
}

// lineView is one line as decisions read it: the stored line and its
// want (stored.wants).
type lineView struct {
	smoothed    int64        // KeyReport.SmoothedDemandMilli
	share, want shares.Share // KeyReport.Share and Want
}

// Stats are cumulative counters of a Core, for metrics.
type Stats struct {
	Reports        int64 // reports accepted
	Duplicates     int64 // duplicate reports ignored
	Conflicts      int64 // conflicting reports ignored
	Stale          int64 // stale reports ignored
	Future         int64 // reports rejected by ReceiveAt: epoch beyond what clock skew allows
	UnknownPolicy  int64 // key-epochs skipped: policy unknown
	InvalidPolicy  int64 // key-epochs skipped: limit invalid or regions count != len(Regions)
	InvalidShare   int64 // key-epochs whose share computation failed (share kept)
	Decisions      int64 // decisions made
	AgainDecisions int64 // second decisions of an epoch, with growth, after a hold (see Core.Due)
	LateDecisions  int64 // decisions forced by Collect (no growth)
	GrowDecisions  int64 // decisions in mode Grow
	FallbackEpochs int64 // decisions in mode Fallback
	Capped         int64 // key-decisions capped at the default outside fallback (Decision.Capped)
	Rises          int64 // decisions in fallback that raised every share to the default (Decision.Rose)
	Updates        int64 // updates returned (by Decide, Collect and late decisions)
	Kept           int64 // key-epochs whose share shrank at collection (shares.Config.Keep)
	UnknownUsage   int64 // epochs collected with unknown usage (CollectUnknown): demand and claims held
	// IncompleteUsage: epochs collected with usage that is a lower bound
	// (CollectIncomplete): smoothed demand never lowered, shares held at
	// collection.
	IncompleteUsage int64
	// Transfers between decisions (see Config.Transfers).
	Asks          int64 // asks returned by Pressure and Reask
	AskedKeys     int64 // keys in those asks
	Reasks        int64 // of those asks, the ones Reask returned
	Gives         int64 // gives returned by ReceiveAsk
	GivenKeys     int64 // keys in those gives
	Accepted      int64 // gives accepted by ReceiveGive (some key raised)
	FreshRevoked  int64 // StartFresh revoked by a report of this region from another Core (fresh.go)
	Refused       int64 // gives to this region refused whole (fallback, warm-up, wrong T, duplicate)
	RefusedKeys   int64 // keys of accepted gives refused (cascade, mixed side, unknown policy)
	DroppedAmount int64 // gives' rate (milli/s) not raised by receivers: refused or dropped parts
	// Delta reports (Config.Deltas).
	Deltas  int64 // reports this Core published as deltas
	Unbased int64 // deltas received whose base this Core does not hold (Unbased: not applied)
}

// Published is what Collect returns.
type Published struct {
	// Epoch is the epoch collected (the one that just ended).
	Epoch int64
	// Report is the report to publish; nil during warm-up (publish
	// nothing). The Core keeps no reference to it.
	Report *Report
	// Late, when not nil, is the decision for the previous epoch, which
	// had not been made and is made now without growth. Write its updates
	// before publishing Report.
	Late *Decision
	// Updates are share records to write after Late's and before
	// publishing Report: the shares this region gives up at collection,
	// because the epoch's demand shows it does not need them (see
	// Config.ShrinkAtCollect and shares.Config.Keep). Report claims these smaller shares, so it must
	// not be published until they are written. Sorted by key; the caller
	// owns the slice.
	Updates []Update
}

// Decision is the result of deciding one epoch.
type Decision struct {
	Epoch    int64       // the epoch decided
	Mode     shares.Mode // Grow, Hold or Fallback
	Complete bool        // a report of the epoch from every region not silent
	Silent   []string    // regions assumed at the safe share
	Keys     int         // keys computed
	// Capped is how many keys were decided as in fallback (at most the
	// default) although this region is not in fallback: a region is
	// counted silent, at the default, and the view is incomplete or its
	// claims exceed the limit (see the package doc, "Fit").
	Capped int
	// Rose: this region is in fallback and has heard no other region
	// for long enough that every region counts it at the default, so its
	// shares rose to the default (package doc, "Rise").
	Rose bool
	// Again: the epoch was decided before without growth because its view
	// was incomplete at the deadline (Config.MaxWait); the missing reports
	// arrived while the epoch after it still runs, so it is decided again,
	// from the same published claims (see Core.Due).
	Again bool
	// Updates are the share records to write: keys whose share changed,
	// records due for a refresh, and keys this Core writes for the first
	// time. The caller owns the slice.
	Updates []Update
}

// New returns a Core for cfg (validated, defaults filled) and the policy
// lookup.
func New(cfg Config, policies Policies) (*Core, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if policies == nil {
		return nil, fmt.Errorf("%w: policies is nil", ErrConfig)
	}
	regions := slices.Clone(cfg.Regions)
	slices.Sort(regions)
	cfg.Regions = regions
	c := &Core{
		cfg:      cfg,
		policies: policies,
		regions:  regions,
		index:    make(map[string]int, len(regions)),
		epochMs:  cfg.Epoch.Milliseconds(),
		tab:      newKeyTable(),
		remote:   make([]remote, len(regions)),
		in:       make([]shares.RegionInput, len(regions)),
		fallback: true,
	}
	for i, r := range regions {
		c.index[r] = i
		c.remote[i] = remote{reports: make(map[int64]*stored), heardSelf: -1}
	}
	c.self = c.index[cfg.Region]
	c.subjects, _ = policies.(SubjectPolicies)
	return c, nil
}

// Config returns the validated configuration.
func (c *Core) Config() Config { return c.cfg }

// Stats returns the cumulative counters.
func (c *Core) Stats() Stats { return c.stats }

// Keys returns how many keys the Core holds state for.
func (c *Core) Keys() int { return c.nheld }

// Share returns the share this region enforces now for key and whether the
// Core has a share for it (false: the default applies).
func (c *Core) Share(k Key) (shares.Share, bool) {
	st := c.held(k)
	if st == nil || !st.is(kfKnown) {
		return shares.Share{}, false
	}
	return st.share, true
}

// Pending returns the epoch waiting for a decision, if any.
func (c *Core) Pending() (int64, bool) { return c.published, c.pending }

// Deadline returns when the bounded wait for the pending epoch's laggards
// ends: MaxWait after the epoch's end. Zero when nothing is pending.
func (c *Core) Deadline() time.Time {
	if !c.pending {
		return time.Time{}
	}
	return EpochStart(c.published+1, c.cfg.Epoch).Add(c.cfg.MaxWait)
}

// Due reports whether the pending epoch should be decided now: its view is
// complete (a report from every region that is not silent) or the wait for
// laggards is over. It is also true when the last decision held (no
// growth) only because the view was incomplete at the deadline, and the
// view of that epoch is now complete while the epoch after it still runs
// (now is in it, and it is not collected yet): Decide then decides the
// epoch again, with growth from the claims every region published for it
// (Decision.Again). So reports later than MaxWait delay growth by their
// lateness instead of freezing it; see the package doc for why this is
// safe.
func (c *Core) Due(now time.Time) bool {
	if !c.pending {
		return c.dueAgain(now)
	}
	if !now.Before(c.Deadline()) {
		return true
	}
	complete, _ := c.view(c.published)
	return complete
}

// Collect ends the epoch that now follows: it adds up usage (this region's
// gateways' counts for that epoch), updates the smoothed demand and returns
// the report to publish. If the previous epoch was not decided yet, it is
// decided first, without growth (Published.Late). usage is not retained.
//
// Errors: ErrEpochNotOver when the epoch before now was already collected;
// ErrUsage naming the entry and field when an entry is invalid. On error
// nothing changes.
func (c *Core) Collect(now time.Time, usage []Usage) (Published, error) {
	return c.collect(now, usage, usageExact)
}

// CollectUnknown ends the epoch that now follows, like Collect, when its
// usage could not be read (the usage source failed): the epoch's demand is
// unknown, not zero. Every key keeps its smoothed demand and its share (no
// shrink at collection), and the report claims what this region enforces
// now (an upper bound, as always) with the held smoothed demand and no
// epoch demand or admitted cost. So a failed read neither empties a busy
// region's shares nor tells the others its demand fell to 0. Counted in
// Stats.UnknownUsage. Errors: ErrEpochNotOver, as Collect.
func (c *Core) CollectUnknown(now time.Time) (Published, error) {
	return c.collect(now, nil, usageUnknown)
}

// CollectIncomplete ends the epoch that now follows, like Collect, when
// usage is a lower bound of the epoch's: some gateway dropped counts
// (limiter.Config.UsageMaxKeys), so a key may be missing although it was
// used, and a key's total may be short (ErrUsageIncomplete). It is
// CollectUnknown for the keys the usage does not show, and never lowers
// the others: every key's smoothed demand becomes the larger of the one
// it had and the one usage gives (smoothed as Collect does), no share is
// given up at collection (ShrinkAtCollect does not apply), and the report
// claims what this region enforces now, with the epoch's demand and
// admitted cost as read (lower bounds). So a dropped count never shrinks a
// share below what the key had, nor tells the others that the key's
// demand fell; the region's growth still follows the usage it can see.
// See the package doc ("Incomplete usage"). Counted in
// Stats.IncompleteUsage. Errors: as Collect.
func (c *Core) CollectIncomplete(now time.Time, usage []Usage) (Published, error) {
	return c.collect(now, usage, usageLowerBound)
}

// usageKind says what the usage given to collect is.
type usageKind uint8

const (
	usageExact      usageKind = iota // the epoch's usage (Collect)
	usageUnknown                     // none could be read (CollectUnknown)
	usageLowerBound                  // a lower bound (CollectIncomplete)
)

func (c *Core) collect(now time.Time, usage []Usage, kind usageKind) (Published, error) {
	unknown := kind == usageUnknown
	m := EpochOf(now, c.cfg.Epoch) - 1
	if c.started && m <= c.published {
		return Published{}, fmt.Errorf("%w: epoch %d was collected; now %v is in epoch %d", ErrEpochNotOver, c.published, now, m+1)
	}
	for i, u := range usage {
		switch {
		case u.PolicyID == "":
			return Published{}, fmt.Errorf("%w: entry %d: PolicyID is empty", ErrUsage, i)
		case u.Demand < 0:
			return Published{}, fmt.Errorf("%w: entry %d (%s/%s): Demand %d is negative", ErrUsage, i, u.PolicyID, u.Subject, u.Demand)
		case u.Admitted < 0 || u.Admitted > u.Demand:
			return Published{}, fmt.Errorf("%w: entry %d (%s/%s): Admitted %d not in 0..Demand %d", ErrUsage, i, u.PolicyID, u.Subject, u.Admitted, u.Demand)
		}
	}
	var out Published
	out.Epoch = m
	c.lcOn = false
	defer func() { c.lcOn = false }()
	if c.pending {
		d := c.decide(now, true)
		out.Late = &d
	}
	if !c.started {
		c.started, c.firstEpoch, c.decided = true, m, m-1
		c.restart = max(c.restart, m)
	}
	c.again = false
	// The gateways' usage comes in much the same order every epoch (its
	// layout in the store): the key of the entry after the previous match
	// in the last epoch's usage is tried first (hint). Keys the Core does
	// not hold are held in key order, after the others, so that the
	// indices of keys first seen together follow their order (the loops
	// over the keys then read the states in order).
	hint, next := c.usageHint, 0
	seen := make([]int32, len(usage)) // by entry: the key's index, -1 none
	var fresh []int
	for n := range usage {
		u := &usage[n]
		i := int32(-1)
		for d := range 2 {
			if next+d < len(hint) && c.st.at(hint[next+d]).is(kfHeld) && c.tab.is(hint[next+d], u.Key) {
				i, next = hint[next+d], next+d+1
				break
			}
		}
		if i < 0 {
			j, ok := c.tab.find(u.Key)
			if !ok || !c.st.at(j).is(kfHeld) {
				seen[n] = -1
				fresh = append(fresh, n)
				continue
			}
			i = j
		}
		seen[n] = i
	}
	slices.SortStableFunc(fresh, func(a, b int) int { return compareKeys(usage[a].Key, usage[b].Key) })
	for _, n := range fresh {
		u := &usage[n]
		i, ok := c.tab.find(u.Key)
		if !ok || !c.st.at(i).is(kfHeld) {
			if _, ok := c.limit(u.PolicyID); !ok {
				continue
			}
			i = c.hold(u.Key, m)
		}
		seen[n] = i
	}
	// The epoch's usage by key index: only this call reads it, so the
	// Core does not keep it between epochs (16 B a key).
	use := make([]epochUse, c.tab.size())
	for n, i := range seen {
		if i >= 0 {
			u := &use[i]
			u.demand = satAdd(u.demand, usage[n].Demand)
			u.admitted = satAdd(u.admitted, usage[n].Admitted)
		}
	}
	c.usageHint = slices.DeleteFunc(seen, func(i int32) bool { return i < 0 })
	warm := c.warm(m)
	var rep *Report
	var delta bool // rep is a delta (delta.go)
	if !warm {
		// Sized for every key: most keys held are reported, and growing
		// a million-line slice by appending cost a fifth of Collect.
		delta = c.startReport(m, kind == usageExact)
		size := c.nheld
		if delta {
			size = min(size, 64+size/16) // most keys are left out
		}
		rep = &Report{Region: c.cfg.Region, Epoch: m, Seq: m, Started: c.firstEpoch, Relay: c.relay(), Keys: make([]KeyReport, 0, size)}
		for i, r := range c.regions {
			if i == c.self {
				rep.Heard = append(rep.Heard, Heard{Region: r, Epoch: m})
			} else if c.remote[i].heard {
				rep.Heard = append(rep.Heard, Heard{Region: r, Epoch: c.remote[i].last})
			}
		}
	}
	// In key order, so that the report and the updates come out sorted.
	for _, i := range c.tidy() {
		k, st := c.tab.key(i), c.st.at(i)
		var u epochUse
		if int(i) < len(use) {
			u = use[i]
		}
		rate := min(shares.MulDiv(u.demand, 1_000_000, c.epochMs), 1<<60)
		prev := st.smoothed
		switch {
		case unknown:
			// The epoch's demand is unknown: hold the smoothed demand.
		case c.adopted && m == c.firstEpoch:
			// An adopted Core's first epoch: no history to smooth with;
			// starting from 0 would halve the demand and shrink shares
			// the region needs.
			st.smoothed = min(rate, shares.MulDiv(rate, c.cfg.Shares.HeadroomPermille, 1000))
		default:
			st.smoothed = c.smooth(st.smoothed, rate)
		}
		if kind == usageLowerBound {
			// The epoch's demand is at least rate: never below what it
			// was, nor below what rate alone gives.
			st.smoothed = max(st.smoothed, prev)
		}
		st.want = shares.Share{}
		lim, ok := c.keyLimit(k, now)
		if !ok {
			continue
		}
		if !st.is(kfKnown) {
			st.share, st.claim = lim.Default(), lim.Default()
			st.set(kfKnown, true)
		} else if st.is(kfSynced) && !st.is(kfRecord) {
			// No record: the gateways enforce the default of the limit
			// in force, which moves with the limit (package doc, Policies).
			st.share = lim.Default()
		}
		// Give up now what the epoch's demand shows is not needed, so the
		// report claims the smaller share and the others can grow into
		// it at their decision of this very epoch. Never during warm-up
		// (see decide).
		if !warm && c.cfg.ShrinkAtCollect && kind == usageExact {
			// A record above the default written now expires at the start
			// of c.decided+R (record); after missed epochs that may be
			// already past, and the share is then not worth writing.
			if kept, err := c.cfg.Shares.Keep(lim, clamp(st.share, lim), c.keepRate(k, rate, now)); err == nil && kept != st.share && kept != clamp(st.share, lim) &&
				(!lim.AboveDefault(kept) || c.decided+c.recordEpochs() > m+1) {
				out.Updates = append(out.Updates, c.record(k, st, lim, kept, c.decided))
				st.share = kept
				c.stats.Kept++
			}
		}
		// The claim of this epoch's report (an absent key claims the
		// default, which is its share then).
		st.claim = st.share
		if !warm && !c.fallback {
			if w, err := c.cfg.Shares.Want(lim, c.self, c.inputs(i, st, lim, m, true)); err == nil {
				st.want = w
			}
		}
		if rep != nil && (u.demand > 0 || st.smoothed > 0 || st.share != lim.Default() || st.want != (shares.Share{})) {
			// (A delta may publish the base's smoothed demand, within
			// the tolerance: it becomes this key's, so that every view,
			// this region's included, reads the same; delta.go.)
			st.smoothed = c.reportLine(rep, delta, i, KeyReport{
				Key: k, Demand: u.demand, Admitted: u.admitted, SmoothedDemandMilli: st.smoothed,
				Share: st.share, Want: st.want,
			})
		}
	}
	if rep != nil {
		c.finishReport(rep, delta)
	} else {
		c.noReport()
	}
	if rep != nil && len(rep.Keys) == 0 {
		rep.Keys = nil // as before it was sized
	}
	c.stats.Updates += int64(len(out.Updates))
	switch kind {
	case usageUnknown:
		c.stats.UnknownUsage++
	case usageLowerBound:
		c.stats.IncompleteUsage++
	}
	c.published, c.pending, c.ownReport = m, true, rep != nil
	c.collectedTransfers(now)
	out.Report = rep
	return out, nil
}

// ReceiveAt is Receive for a report taken from the bus at now (the
// receiver's clock): a report whose epoch is after now's epoch is refused
// as Future and counted (Stats.Future), and changes nothing. By the clock
// assumption of the package doc (clocks differ by less than one epoch) a
// region publishes its report of epoch m after the end of m on its clock,
// which is after the start of m on every other region's clock; a report of
// a later epoch comes from a clock outside that assumption or is corrupt,
// and accepting it would make it the region's latest report for good (the
// region's real reports would then be stale or never newest, and this
// region would stay in fallback). Drivers call ReceiveAt.
func (c *Core) ReceiveAt(now time.Time, r *Report) (Receipt, error) {
	if r != nil && r.Epoch > EpochOf(now, c.cfg.Epoch) {
		if _, ok := c.index[r.Region]; ok && r.Region != c.cfg.Region {
			c.stats.Future++
			return Future, nil
		}
	}
	return c.Receive(r)
}

// Receive stores a report from the bus. Duplicates, conflicting resends and
// stale reports change nothing (see Receipt). The Core keeps nothing of r
// but copies of what its decisions read (and the keys' strings, which
// cannot change): the caller may reuse r. Receive does not check the
// report's epoch against a clock: drivers use ReceiveAt.
//
// Errors wrap ErrReport and say what is malformed (unknown region, negative
// values, a key twice); the report is then ignored.
func (c *Core) Receive(r *Report) (Receipt, error) {
	if r == nil {
		return 0, fmt.Errorf("%w: nil report", ErrReport)
	}
	qi, ok := c.index[r.Region]
	switch {
	case !ok:
		return 0, fmt.Errorf("%w: Region %q is not one of %v", ErrReport, r.Region, c.regions)
	case r.Epoch < 0:
		return 0, fmt.Errorf("%w: region %s: Epoch %d is negative", ErrReport, r.Region, r.Epoch)
	case r.Seq < 1:
		return 0, fmt.Errorf("%w: region %s epoch %d: Seq %d < 1", ErrReport, r.Region, r.Epoch, r.Seq)
	}
	if qi == c.self {
		c.receiveOwn(r)
		return Own, nil
	}
	q := &c.remote[qi]
	// A stored (region, epoch) was valid: answer duplicates cheaply.
	if s, ok := q.reports[r.Epoch]; ok {
		if s.seq == r.Seq {
			c.stats.Duplicates++
			return Duplicate, nil
		}
		c.stats.Conflicts++
		return Conflict, nil
	}
	// A delta applies only against the base it names (delta.go); without
	// it the report is as lost.
	var base *stored
	if r.Base != 0 {
		if r.Base < 0 || r.Base >= r.Epoch {
			return 0, fmt.Errorf("%w: region %s epoch %d: Base %d not in 1..Epoch-1", ErrReport, r.Region, r.Epoch, r.Base)
		}
		if base = baseOf(q, r); base == nil {
			c.stats.Unbased++
			return Unbased, nil
		}
	}
	// Validate the lines in order and intern their keys (a key's index is
	// resolved once, here); the first malformed line, or the first line
	// whose key came before, is the error. A region's reports list much
	// the same keys in the same order: the key of the line after the
	// previous match in its latest stored report is tried first.
	c.fresh1 = c.fresh1[:0]
	idx := make([]int32, 0, len(r.Keys))
	var bad error
	prev, next := q.reports[q.last], 0
	if prev != nil && prev.base != nil {
		prev = prev.base // the order of the region's full report
	}
	for i := range r.Keys {
		k := &r.Keys[i]
		switch {
		case k.PolicyID == "":
			bad = fmt.Errorf("%w: region %s epoch %d key %d: PolicyID is empty", ErrReport, r.Region, r.Epoch, i)
		case k.Demand < 0 || k.Admitted < 0 || k.SmoothedDemandMilli < 0:
			bad = fmt.Errorf("%w: region %s epoch %d key %s/%s: negative Demand, Admitted or SmoothedDemandMilli", ErrReport, r.Region, r.Epoch, k.PolicyID, k.Subject)
		case k.Share.RateMilli < 0 || k.Share.BurstMilli < 0:
			bad = fmt.Errorf("%w: region %s epoch %d key %s/%s: negative Share", ErrReport, r.Region, r.Epoch, k.PolicyID, k.Subject)
		case k.Want.RateMilli < 0 || k.Want.BurstMilli < 0:
			bad = fmt.Errorf("%w: region %s epoch %d key %s/%s: negative Want", ErrReport, r.Region, r.Epoch, k.PolicyID, k.Subject)
		case k.Removed && (base == nil || k.Demand != 0 || k.Admitted != 0 || k.SmoothedDemandMilli != 0 || k.Share != (shares.Share{}) || k.Want != (shares.Share{})):
			bad = fmt.Errorf("%w: region %s epoch %d key %s/%s: Removed in a full report, or with values", ErrReport, r.Region, r.Epoch, k.PolicyID, k.Subject)
		}
		if bad != nil {
			break
		}
		var j int32
		if prev != nil && next < len(prev.idx) && c.tab.is(prev.idx[next], k.Key) {
			j = prev.idx[next]
			next++
		} else {
			var added bool
			if j, added = c.tab.intern(k.Key); added {
				c.fresh1 = append(c.fresh1, j)
			} else if prev != nil && int(j) < len(prev.pos) && prev.pos[j] > 0 {
				next = int(prev.pos[j])
			}
		}
		idx = append(idx, j)
	}
	c.grow()
	// A full report keeps its index by key index; a delta's lines are
	// few (overlay indexes them sparsely), so it uses the Core's scratch,
	// cleared below, instead of a slice the size of the table.
	var pos []int32
	if base != nil {
		pos = c.scratchPos()
		defer func() {
			for _, j := range idx {
				pos[j] = 0
			}
		}()
	} else {
		pos = make([]int32, c.tab.size())
	}
	for l, j := range idx {
		if pos[j] != 0 {
			k := &r.Keys[l]
			bad = fmt.Errorf("%w: region %s epoch %d: key %s/%s twice", ErrReport, r.Region, r.Epoch, k.PolicyID, k.Subject)
			break
		}
		pos[j] = int32(l) + 1
	}
	if bad == nil {
		bad = checkRelay(r)
	}
	var s *stored
	if bad == nil && base != nil {
		s, bad = c.overlay(base, r, idx, pos)
	}
	if bad != nil {
		c.releaseFresh()
		return 0, bad
	}
	if c.started && r.Epoch <= c.decided && q.heard && r.Epoch < q.last {
		// Too old for the shares, but what it says of who hears whom may
		// be news (rows only move forward).
		c.releaseFresh()
		c.learn(qi, r)
		c.stats.Stale++
		return Stale, nil
	}
	c.learn(qi, r)
	heardMax := int64(noEpoch)
	for _, h := range r.Heard {
		if h.Region != r.Region {
			heardMax = max(heardMax, h.Epoch)
		}
	}
	if base == nil {
		lines := make([]line, len(r.Keys))
		wants := makeShareColumn(len(r.Keys))
		for l := range r.Keys {
			k := &r.Keys[l]
			lines[l] = line{smoothed: k.SmoothedDemandMilli, share: k.Share}
			wants.push(k.Want)
		}
		s = &stored{lines: lines, wants: wants, idx: idx, pos: pos}
	}
	s.seq, s.started, s.heardMax = r.Seq, r.Started, heardMax
	for j := range s.mentions() {
		c.refs[j]++
	}
	q.reports[r.Epoch] = s
	if base == nil {
		c.setFull(q, s, r.Epoch)
	}
	if !q.heard || r.Epoch > q.last {
		q.heard, q.last, q.heardSelf, q.accepts = true, r.Epoch, -1, r.AcceptsDelta
		for _, h := range r.Heard {
			if h.Region == c.cfg.Region {
				q.heardSelf = h.Epoch
			}
		}
	}
	c.stats.Reports++
	return Accepted, nil
}

// Decide decides the pending epoch: this region's next share for every
// key it or any report of the epoch mentions. It grows only when the view
// is complete, this region is not in fallback, its own report was
// published, and now is still in the epoch right after the decided one.
// With nothing pending, it decides the last epoch again when Due says so
// (Decision.Again). Write the updates before the next Collect's report is
// published.
//
// Error: ErrNothingPending (nothing pending and no second decision due).
func (c *Core) Decide(now time.Time) (Decision, error) {
	if !c.pending {
		if !c.dueAgain(now) {
			return Decision{}, ErrNothingPending
		}
		c.stats.AgainDecisions++
		d := c.decide(now, false)
		d.Again = true
		return d, nil
	}
	return c.decide(now, false), nil
}

// dueAgain reports whether the last decided epoch should be decided again
// with growth: it held for an incomplete view, that view is now complete,
// and now is still in the epoch after it (which is not collected yet:
// Collect clears again).
func (c *Core) dueAgain(now time.Time) bool {
	if !c.again || EpochOf(now, c.cfg.Epoch) != c.decided+1 {
		return false
	}
	complete, _ := c.view(c.decided)
	return complete
}

// view classifies the other regions for epoch m: complete is true when
// each has a report for m or is silent (silentAt: no report for epochs
// m-S..m, S = silenceBound(), and no row says anyone heard it since).
func (c *Core) view(m int64) (complete bool, silent []int) {
	complete = true
	for i := range c.regions {
		if i == c.self {
			continue
		}
		q := &c.remote[i]
		if _, ok := q.reports[m]; ok {
			continue
		}
		if c.silentFor(i, m) {
			silent = append(silent, i)
			continue
		}
		complete = false
	}
	return complete, silent
}

// cutOff reports whether this region must fall back at decision m: unless
// every region sent a report of epochs m-K+1..m or later whose heard says
// it heard this region in those epochs too (the rule before the heard
// matrix, which decides alone with two regions), it falls back unless the
// majority rule keeps it out (heard.go; package doc).
func (c *Core) cutOff(m int64) bool {
	k := c.cfg.SilenceEpochs
	for i := range c.regions {
		if i == c.self {
			continue
		}
		q := &c.remote[i]
		if !q.heard || q.last <= m-k || q.heardSelf <= m-k {
			return !c.majorityRule(m)
		}
	}
	return false
}

func (c *Core) decide(now time.Time, late bool) Decision {
	c.lcOn = false
	defer func() { c.lcOn = false }()
	m := c.published
	c.silence(m)
	defer func() { c.silOn = false }()
	complete, silentIdx := c.view(m)
	warm := c.warm(m)
	c.fallback = warm || c.cutOff(m)
	unheardIdx := c.unheard(m, silentIdx)
	isolatedIdx := c.isolated(m, silentIdx, unheardIdx)
	timely := EpochOf(now, c.cfg.Epoch) == m+1
	d := Decision{Epoch: m, Complete: complete, Mode: shares.Hold}
	switch {
	case c.fallback:
		d.Mode = shares.Fallback
		c.stats.FallbackEpochs++
		if d.Rose = c.rises(m); d.Rose {
			c.stats.Rises++
		}
	case complete && timely && c.ownReport && !late && len(isolatedIdx) == 0:
		d.Mode = shares.Grow
		c.stats.GrowDecisions++
	}
	// Held only because a report is missing: if it arrives within the
	// next epoch, the epoch is decided again with growth (dueAgain).
	c.again = d.Mode == shares.Hold && !complete && timely && c.ownReport && !late
	// An isolated region may rise to the default (package doc, "Rise"):
	// it is counted at max(its claim, the default), like an unheard one.
	unheardIdx = append(unheardIdx, isolatedIdx...)
	for _, i := range silentIdx {
		d.Silent = append(d.Silent, c.regions[i])
	}
	// Keys that other regions reported for this epoch (or last, for a
	// region missing from the view) and this region has no state for.
	for i := range c.regions {
		if i == c.self {
			continue
		}
		s := c.reportFor(i, m)
		if s == nil {
			continue
		}
		for j := range s.mentions() {
			if c.st.at(j).is(kfHeld) {
				continue
			}
			if _, ok := c.limit(c.tab.policy(j)); !ok {
				continue
			}
			c.holdIndex(j, m)
		}
	}
	// In key order, so that the updates come out sorted.
	for _, j := range c.tidy() {
		key, st := c.tab.key(j), c.st.at(j)
		lim, ok := c.keyLimit(key, now)
		if !ok {
			c.remove(j)
			continue
		}
		if !st.is(kfKnown) {
			st.share, st.claim = lim.Default(), lim.Default()
			st.set(kfKnown, true)
		} else if st.is(kfSynced) && !st.is(kfRecord) {
			st.share = lim.Default() // package doc, Policies
		}
		in := c.inputs(j, st, lim, m, false)
		d.Keys++
		mode := d.Mode
		if mode != shares.Fallback && (len(silentIdx) > 0 && (!complete || overCommitted(lim, in)) ||
			len(unheardIdx) > 0 && overCommittedUnheard(lim, in, unheardIdx)) {
			// A region is counted at the default (silent), or may enforce
			// it (unheard for K epochs: its store may have restarted
			// empty): fit under it now (package doc, "Fit").
			mode = shares.Fallback
			d.Capped++
			c.stats.Capped++
		}
		next, err := c.cfg.Shares.Next(lim, c.self, in, mode)
		if err != nil {
			c.stats.InvalidShare++
			// Never above the current share (nor the claim).
			next = shares.Share{RateMilli: min(in[c.self].Claim.RateMilli, st.share.RateMilli), BurstMilli: min(in[c.self].Claim.BurstMilli, st.share.BurstMilli)}
		}
		// What was given and accepted since the report of m (see
		// "Transfers between decisions" in the package doc).
		next = c.afterTransfers(key, lim, next, in[c.self].Claim, d.Mode == shares.Fallback, now)
		if d.Rose {
			next = lim.Default()
		}
		if !c.again {
			st.want = shares.Share{} // (kept for a second decision)
		}
		def := lim.Default()
		w := c.writtenAt(st)
		refresh := st.is(kfRecord) && (st.is(kfShort) && m >= w+c.recordEpochs()-2 || !st.is(kfShort) && m >= w+c.cfg.IdleTTLEpochs/2)
		// During warm-up nothing is written: records of a previous
		// coordinator may still be counted by the others at its last
		// claims, and any write (even the default) could raise them.
		if !warm && (next != st.share || !st.is(kfSynced) || refresh) {
			d.Updates = append(d.Updates, c.record(key, st, lim, next, m))
		}
		if !warm {
			// During warm-up nothing is written: the store still enforces
			// what a previous coordinator wrote (at most the default once
			// its records above it expired) or the default, so the share,
			// and the first report's claim, stay at the default. (Taking
			// next here made the first report claim less than the store
			// enforced; harmless while every region fell back the epoch
			// before, not once a majority keeps growing.)
			st.share = next
		}
		if st.share == def && !st.is(kfRecord) && st.smoothed == 0 && st.is(kfSynced) {
			c.remove(j) // idle at the default: no state needed
		}
	}
	// Keep, per region, the reports of later epochs and the latest one
	// (and those of m while it may be decided again).
	for i := range c.remote {
		q := &c.remote[i]
		for e := range q.reports {
			if (e < m || e == m && !c.again) && e != q.last {
				c.drop(q.reports[e])
				delete(q.reports, e)
			}
		}
	}
	c.pending, c.decided = false, m
	c.stats.Decisions++
	if late {
		c.stats.LateDecisions++
	}
	c.stats.Updates += int64(len(d.Updates))
	return d
}

// record returns the update that writes share next for key and notes
// the write in st. d is the epoch of the decision that bounds next: the
// epoch decided, for a decision's write; the last epoch decided
// (c.decided), for a write between decisions (a shrink at collection, a
// gift given or accepted), whose share that decision bounds. A record
// above the default expires at the start of d+R, R = recordEpochs(), one
// epoch before the proofs of the rise and of silence need it gone
// (package doc, "Share records and their lifetime").
func (c *Core) record(key Key, st *keyState, lim shares.Limit, next shares.Share, d int64) Update {
	u := Update{Key: key, Share: next}
	switch {
	case next == lim.Default():
		u.Delete = true
	case lim.AboveDefault(next):
		u.ExpireAt = EpochStart(d+c.recordEpochs(), c.cfg.Epoch)
	default:
		u.ExpireAt = EpochStart(d+c.cfg.IdleTTLEpochs, c.cfg.Epoch)
	}
	st.set(kfSynced, true)
	st.set(kfRecord, !u.Delete)
	st.set(kfShort, lim.AboveDefault(next))
	c.setWrittenAt(st, d)
	return u
}

// recordEpochs is R = Config.RecordEpochs, the lifetime of a share record
// above the default in epochs from the start of the epoch of the decision
// that bounds it (see record).
func (c *Core) recordEpochs() int64 { return c.cfg.RecordEpochs }

// smooth returns the next smoothed demand from the previous one and the
// rate of the epoch just ended (milli units per second): an exponentially
// weighted moving average with weight RiseSmoothingPermille when the rate
// is above it and SmoothingPermille otherwise, and never above the rate
// times the headroom (shares.Config.HeadroomPermille), so demand that fell
// is seen at once, as Keep sees it.
func (c *Core) smooth(prev, rate int64) int64 {
	a := c.cfg.SmoothingPermille
	if rate > prev {
		a = c.cfg.RiseSmoothingPermille
	}
	next := shares.MulDiv(prev, 1000-a, 1000) + shares.MulDiv(rate, a, 1000)
	return min(next, shares.MulDiv(rate, c.cfg.Shares.HeadroomPermille, 1000))
}

// reportFor returns region i's report for epoch m, or its latest report
// when it has none for m and is not silent; nil otherwise.
func (c *Core) reportFor(i int, m int64) *stored {
	q := &c.remote[i]
	if s, ok := q.reports[m]; ok {
		return s
	}
	if !q.heard || c.silentFor(i, m) {
		return nil
	}
	return q.reports[q.last]
}

// inputs fills the scratch view of the key of index j (whose state is st)
// for epoch m. latest uses every region's latest report (for the want
// published at Collect).
func (c *Core) inputs(j int32, st *keyState, lim shares.Limit, m int64, latest bool) []shares.RegionInput {
	in := c.in
	def := lim.Default()
	for i := range c.regions {
		if i == c.self {
			// The claim this region published: a decision's growth is
			// bounded from it (its share may have shrunk since, at a
			// first decision of the epoch that held).
			in[i] = shares.RegionInput{DemandMilli: st.smoothed, Claim: clamp(st.claim, lim), Want: clamp(st.want, lim)}
			continue
		}
		q := &c.remote[i]
		var s *stored
		if latest {
			if q.heard && q.last > m-c.cfg.SilenceEpochs-1 {
				s = q.reports[q.last]
			}
		} else {
			s = c.reportFor(i, m)
		}
		if s == nil {
			in[i] = shares.RegionInput{Silent: true}
			continue
		}
		if l, ok := c.lineOf(s, j); ok {
			in[i] = shares.RegionInput{DemandMilli: l.smoothed, Claim: clamp(l.share, lim), Want: clamp(l.want, lim)}
		} else {
			in[i] = shares.RegionInput{Claim: def}
		}
	}
	return in
}

// scratchPos returns c.posBuf, all zero, grown to the table's size.
func (c *Core) scratchPos() []int32 {
	if n := c.tab.size(); len(c.posBuf) < n {
		c.posBuf = make([]int32, n+n/4)
	}
	return c.posBuf[:c.tab.size()]
}

// lineOf returns the line of the key of index j in s, and false when s
// does not mention it: from s's index of lines by key index, or
// (c.lookup, in tests) by searching its lines.
func (c *Core) lineOf(s *stored, j int32) (lineView, bool) {
	if l := c.ownLine(s, j); l >= 0 {
		return s.view(l), true
	}
	if b := s.base; b != nil {
		if l := c.ownLine(b, j); l >= 0 && (s.gone == nil || !s.gone[l]) {
			return b.view(l), true
		}
	}
	return lineView{}, false
}

// view returns s's own line l.
func (s *stored) view(l int) lineView {
	return lineView{smoothed: s.lines[l].smoothed, share: s.lines[l].share, want: s.wants.get(l)}
}

// ownLine returns the line of s's own lines (a delta's: those it lists)
// of the key of index j, or -1.
func (c *Core) ownLine(s *stored, j int32) int {
	if c.lookup {
		return slices.Index(s.idx, j)
	}
	return s.ownLineIndex(j)
}

// held returns the state of key k, or nil when the Core holds none. The
// pointer is valid until a key is next held.
func (c *Core) held(k Key) *keyState {
	j, ok := c.tab.find(k)
	if !ok || !c.st.at(j).is(kfHeld) {
		return nil
	}
	return c.st.at(j)
}

// all yields every key held and its state.
func (c *Core) all() iter.Seq2[Key, *keyState] {
	return func(yield func(Key, *keyState) bool) {
		for j := range c.st.n {
			if st := c.st.at(int32(j)); st.is(kfHeld) && !yield(c.tab.key(int32(j)), st) {
				return
			}
		}
	}
}

// grow sizes the per-index slices for every index of the key table.
func (c *Core) grow() {
	n := c.tab.size()
	c.st.grow(n)
	if old := len(c.refs); n > old {
		c.refs = slices.Grow(c.refs, n-old)[:n]
		clear(c.refs[old:])
	}
}

// hold makes the Core hold state for key k, first seen at epoch m (it
// holds none), and returns its index.
func (c *Core) hold(k Key, m int64) int32 {
	j, _ := c.tab.intern(k)
	c.grow()
	c.holdIndex(j, m)
	return j
}

// holdIndex makes the Core hold state for the key of index j, first seen
// at epoch m (it holds none). A record a previous coordinator wrote may
// exist until IdleTTLEpochs after this Core started; until then the first
// decision writes the key even if unchanged. An adopted Core read every
// record: a key it has no state for has none.
func (c *Core) holdIndex(j int32, m int64) {
	synced := c.adopted || c.started && m >= c.restart+c.cfg.IdleTTLEpochs
	st := c.st.at(j)
	listed := st.is(kfListed)
	*st = keyState{flags: kfHeld | kfListed}
	st.set(kfSynced, synced)
	if !listed {
		c.added = append(c.added, j)
	}
	c.nheld++
}

// remove lets the state of the key of index j go.
func (c *Core) remove(j int32) {
	st := c.st.at(j)
	*st = keyState{flags: st.flags & kfListed}
	c.nheld--
	c.gone++
}

// drop forgets a stored report that is deleted: a key no longer mentioned
// by any report and not held loses its index.
func (c *Core) drop(s *stored) {
	for j := range s.mentions() {
		if c.refs[j]--; c.refs[j] == 0 {
			c.release(j)
		}
	}
}

// release gives the index j back to the key table when nothing uses it:
// no state held, not listed in the order, no stored report mentions it.
func (c *Core) release(j int32) {
	if st := c.st.at(j); !st.is(kfHeld) && !st.is(kfListed) && c.refs[j] == 0 {
		c.tab.release(j)
	}
}

// releaseFresh releases the indices Receive interned for a report it did
// not store.
func (c *Core) releaseFresh() {
	for _, j := range c.fresh1 {
		c.release(j)
	}
	c.fresh1 = c.fresh1[:0]
}

// tidy returns the index of every key held, sorted by key: the last order
// without the keys let go since, merged with the keys held since.
func (c *Core) tidy() []int32 {
	if len(c.added) == 0 && c.gone == 0 {
		return c.order
	}
	cmp := func(a, b int32) int { return compareKeys(c.tab.key(a), c.tab.key(b)) }
	var dropped []int32
	c.added = slices.DeleteFunc(c.added, func(j int32) bool {
		if !c.st.at(j).is(kfHeld) {
			dropped = append(dropped, j)
			return true
		}
		return false
	})
	slices.SortFunc(c.added, cmp)
	out := make([]int32, 0, len(c.order)+len(c.added))
	i := 0
	for _, j := range c.order {
		if !c.st.at(j).is(kfHeld) {
			dropped = append(dropped, j)
			continue
		}
		for i < len(c.added) && cmp(c.added[i], j) < 0 {
			out = append(out, c.added[i])
			i++
		}
		out = append(out, j)
	}
	out = append(out, c.added[i:]...)
	c.order, c.added, c.gone = out, c.added[:0], 0
	for _, j := range dropped {
		c.st.at(j).set(kfListed, false)
		c.release(j)
	}
	return c.order
}

// compareKeys orders keys by PolicyID, then Subject (a Report's order).
func compareKeys(a, b Key) int {
	if a.PolicyID != b.PolicyID {
		return strings.Compare(a.PolicyID, b.PolicyID)
	}
	return strings.Compare(a.Subject, b.Subject)
}

// clamp bounds a share to the limit: a claim above the limit (the limit
// was lowered) counts as the limit, which leaves no slack.
func clamp(s shares.Share, lim shares.Limit) shares.Share {
	return shares.Share{RateMilli: min(s.RateMilli, lim.RateMilli), BurstMilli: min(s.BurstMilli, lim.BurstMilli)}
}

// limit looks up a policy and checks it fits this deployment, counting
// misses. Within one Collect or decision (lcOn), the last policy's answer
// is reused: keys come in runs of one policy.
func (c *Core) limit(policyID string) (shares.Limit, bool) {
	if !c.lcOn || policyID != c.lcID {
		c.lcOn, c.lcID, c.lcLim, c.lcRes = true, policyID, shares.Limit{}, 0
		lim, ok := c.policies.Limit(policyID)
		switch {
		case !ok:
			c.lcRes = 1
		case lim.Validate() != nil || lim.Regions != len(c.regions):
			c.lcRes = 2
		default:
			c.lcLim = lim
		}
	}
	switch c.lcRes {
	case 1:
		c.stats.UnknownPolicy++
		return shares.Limit{}, false
	case 2:
		c.stats.InvalidPolicy++
		return shares.Limit{}, false
	}
	return c.lcLim, true
}

// keyLimit is the limit in force for key at now: the subject's own limit
// when Policies is a SubjectPolicies with one in force for it (an
// override) that fits this deployment, else the policy's (see limit). An
// override that does not fit is counted in Stats.InvalidPolicy and the
// policy's limit applies.
func (c *Core) keyLimit(k Key, now time.Time) (shares.Limit, bool) {
	lim, ok := c.limit(k.PolicyID)
	if !ok || c.subjects == nil {
		return lim, ok
	}
	if o, ok := c.subjects.SubjectLimit(k.PolicyID, k.Subject, now); ok {
		if o.Validate() == nil && o.Regions == len(c.regions) {
			return o, true
		}
		c.stats.InvalidPolicy++
	}
	return lim, true
}

// warm reports whether epoch m is in this Core's warm-up.
func (c *Core) warm(m int64) bool {
	return !c.adopted && !c.fresh && m < c.restart+c.cfg.WarmupEpochs
}

func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return 1<<63 - 1
}
