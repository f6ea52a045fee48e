package rebalancer

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/quotientlabs/quotient/shares"
	"github.com/stretchr/testify/require"
)

// The harness runs several regions' Cores in virtual time over a bus that
// can lose, duplicate, delay and reorder reports, cut links (partitions)
// and crash coordinators. Each region has a fake store of share records
// with expiry, like Redis: what a region ENFORCES for a key at time t is
// its record if not expired, else the default share.

type record struct {
	share    shares.Share
	expireAt time.Time
}

type hregion struct {
	name      string
	core      *Core
	store     map[Key]record
	up        bool
	received  []*Report // every report delivered to the Core, for the reference
	decisions []Decision
	reports   []*Report // reports it published (by every Core of the region)
	fresh     bool      // its Core skipped the warm-up (StartFresh)
	lastFull  *Report   // the last full report its Core returned (the base of its deltas)
	// offset is how far this region's clock (its coordinator's and its
	// Redis's) is ahead of true time, with cluster.skew: every event the
	// harness plays at t happens at true time t - offset, and a record
	// expires at its ExpireAt - offset.
	offset time.Duration
	// hist is every write to the store, at true times (with cluster.skew).
	hist map[Key][]hwrite
}

// hwrite is one write to a region's store, at true time at; a delete is
// a record at the default that never expires.
type hwrite struct {
	at       time.Time
	share    shares.Share
	expireAt time.Time // true time; zero: never
	del      bool
}

type msg struct {
	to  int
	rep *Report
	due int64 // epoch whose decision window delivers it
}

// net decides the fate of one report on one link.
type net interface {
	// route returns the delivery delays (in epochs) of the copies of a
	// report from -> to of epoch e: none when lost, two when duplicated.
	route(r *rand.Rand, from, to int, e int64) []int64
}

type cluster struct {
	t        testing.TB
	r        *rand.Rand
	cfg      Config
	policies PolicyMap
	keys     []Key
	regs     []*hregion
	inflight []msg
	net      net
	// deliverFirst delivers every due report before any decision of the
	// step (so decisions see complete views when nothing is lost).
	deliverFirst bool
	// senderOrder delivers the reports of one sender that are due in the
	// same step in epoch order (as one Kafka partition does), still
	// interleaved at random with the other senders'.
	senderOrder bool
	// checkRef compares each decision's mode with the naive reference.
	checkRef bool
	// skip is the probability that a region's driver misses a decision
	// window, so its next Collect decides late (without growth).
	skip float64
	// afterCollect, when set, runs in every step between the collections
	// and the decisions (for example, to change a policy there).
	afterCollect func(e int64)
	// late is the probability that a report due in an epoch's decision
	// window arrives after the deadline (MaxWait), while the next epoch
	// still runs: a region that held for it may decide again with growth.
	late float64
	// unknown is the probability that a region's usage read fails, so it
	// collects the epoch with CollectUnknown.
	unknown float64
	// incomplete is the probability that a region's usage is a lower bound
	// (a gateway dropped counts at its key bound): a random part of the
	// entries is dropped and the rest lowered, and the region collects the
	// epoch with CollectIncomplete; the cluster then checks that no key's
	// smoothed demand fell and that nothing was written at collection.
	incomplete float64
	// lookup, when set, is the Cores' Policies instead of policies, and
	// limitAt the limit in force for a key at t (what the gateways apply,
	// for the default share and the check); see overrideLookup.
	lookup  Policies
	limitAt func(k Key, t time.Time) shares.Limit
	// xfer, when set, runs asks and gives between the decisions: several
	// transfer ticks per epoch, before, among and after the decisions
	// (see transfer_property_test.go).
	xfer *xferNet
	// fresh makes every new Core skip the warm-up (StartFresh) when the
	// bus holds no report of its region of the FirstStartEpochs epochs
	// before its first one (see startCore): a fleet's first start, and a
	// restart after a long enough outage.
	fresh bool
	// pubFail is the probability that a region's publication of its
	// report fails: the report is neither on the bus (h.reports) nor
	// delivered, and the Core decides as if it were published.
	pubFail float64
	// freshRestarts counts Cores that started fresh after an earlier Core
	// of their region had reported (an outage longer than the span).
	freshRestarts int
	// skew, when positive, gives each region a clock ahead of true time by
	// a random offset in [0, skew] (set it with setSkew, below half of
	// Epoch - MaxWait: the clock assumption of the package doc, since a
	// decision may come as late as (Epoch+MaxWait)/2 into its epoch here).
	// The enforced sum is then checked at true times: after every write,
	// at every instant another region's write already seen happens later
	// than it, and at every region's epoch starts.
	skew time.Duration
}

// setSkew draws every region's clock offset in [0, max] from seed (not
// from the cluster's random stream, which the scenario's events use).
func (c *cluster) setSkew(max time.Duration, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 9))
	c.skew = max
	for _, h := range c.regs {
		h.offset = time.Duration(r.Int64N(int64(max) + 1))
		h.hist = map[Key][]hwrite{}
	}
}

// enforcedAt is what region h enforces for key at true time t (skew).
func (c *cluster) enforcedAt(h *hregion, k Key, t time.Time) shares.Share {
	ws := h.hist[k]
	for i := len(ws) - 1; i >= 0; i-- {
		w := ws[i]
		if w.at.After(t) {
			continue
		}
		if w.del || !w.expireAt.IsZero() && !t.Before(w.expireAt) {
			break
		}
		return w.share
	}
	return c.limit(k, t).Default()
}

// checkAt asserts the invariant at true time t over the write histories
// (skew).
func (c *cluster) checkAt(t time.Time) {
	c.checkSum(t, c.enforcedAt, func(h *hregion) string { return fmt.Sprintf("%s(clock +%v)", h.name, h.offset) }, "at true time")
}

// checkSkewed checks at true time t and at every later instant of a write
// of another region already recorded (a write played later by the harness
// may happen earlier in true time).
func (c *cluster) checkSkewed(t time.Time) {
	c.checkAt(t)
	for _, h := range c.regs {
		for _, ws := range h.hist {
			for i := len(ws) - 1; i >= 0 && ws[i].at.After(t); i-- {
				c.checkAt(ws[i].at)
			}
		}
	}
}

func newCluster(t testing.TB, r *rand.Rand, names []string, cfg Config, policies PolicyMap, keys []Key, n net) *cluster {
	c := &cluster{t: t, r: r, cfg: cfg, policies: policies, keys: keys, net: n, checkRef: true}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	for _, name := range sorted {
		h := &hregion{name: name, store: make(map[Key]record), up: true}
		h.core = c.newCore(name)
		c.regs = append(c.regs, h)
	}
	return c
}

func (c *cluster) newCore(name string) *Core {
	cfg := c.cfg
	cfg.Region = name
	cfg.Regions = nil
	for _, h := range c.regs {
		cfg.Regions = append(cfg.Regions, h.name)
	}
	if len(cfg.Regions) == 0 || !slices.Contains(cfg.Regions, name) {
		cfg.Regions = append(cfg.Regions, name)
	}
	var pol Policies = c.policies
	if c.lookup != nil {
		pol = c.lookup
	}
	core, err := New(cfg, pol)
	require.NoError(c.t, err)
	return core
}

func (c *cluster) fixRegions() { c.fixRegionsAt(0) }

// fixRegionsAt is fixRegions for a cluster whose first epoch is first
// (which matters with c.fresh).
func (c *cluster) fixRegionsAt(first int64) {
	// newCore during construction saw a partial list; rebuild with all.
	for _, h := range c.regs {
		c.startCore(h, first)
	}
}

// startCore gives region h a new Core whose first collected epoch is
// first. With c.fresh it skips the warm-up when none of the region's
// published reports is of epochs first-FirstStartEpochs..first-1, as a
// driver that read the whole span from the bus would decide.
func (c *cluster) startCore(h *hregion, first int64) {
	h.core = c.newCore(h.name)
	h.lastFull = nil
	h.received = nil
	h.fresh = false
	if !c.fresh {
		return
	}
	span := FirstStartEpochs(h.core.Config())
	for _, r := range h.reports {
		if r.Epoch >= first-span && r.Epoch < first {
			return
		}
	}
	require.NoError(c.t, h.core.StartFresh())
	h.fresh = true
	if len(h.reports) > 0 {
		c.freshRestarts++
	}
}

func (c *cluster) index(name string) int {
	for i, h := range c.regs {
		if h.name == name {
			return i
		}
	}
	c.t.Fatalf("no region %s", name)
	return -1
}

func (c *cluster) epochStart(e int64) time.Time { return EpochStart(e, c.cfg.Epoch) }

// enforced is what region h enforces for key at t.
func (c *cluster) enforced(h *hregion, k Key, t time.Time) shares.Share {
	if rec, ok := h.store[k]; ok && t.Before(rec.expireAt) {
		return rec.share
	}
	return c.limit(k, t).Default()
}

// limit is the limit in force for k at t.
func (c *cluster) limit(k Key, t time.Time) shares.Limit {
	if c.limitAt != nil {
		return c.limitAt(k, t)
	}
	return c.policies[k.PolicyID]
}

func (c *cluster) apply(h *hregion, now time.Time, ups []Update) {
	for _, u := range ups {
		if u.Delete {
			delete(h.store, u.Key)
			continue
		}
		require.True(c.t, u.ExpireAt.After(now), "update %+v expires before it is written at %v", u, now)
		h.store[u.Key] = record{share: u.Share, expireAt: u.ExpireAt}
	}
	if c.skew > 0 {
		at := now.Add(-h.offset)
		for _, u := range ups {
			w := hwrite{at: at, share: u.Share, del: u.Delete}
			if !u.Delete {
				w.expireAt = u.ExpireAt.Add(-h.offset)
			}
			h.hist[u.Key] = append(h.hist[u.Key], w)
		}
		c.checkSkewed(at)
		return // (the scenarios without skew check the run with every clock right)
	}
	c.check(now)
}

// check asserts the safety invariant at t: for every key, the shares
// enforced by all regions together are within L and B.
func (c *cluster) check(t time.Time) {
	c.checkSum(t, c.enforced, func(h *hregion) string { return h.name }, "at")
}

// checkSum asserts that the shares enforced at t (as enforced reads them)
// of every key sum to within its L and B, naming each region's part with
// name in the failure.
func (c *cluster) checkSum(t time.Time, enforced func(h *hregion, k Key, t time.Time) shares.Share, name func(h *hregion) string, at string) {
	for _, k := range c.keys {
		lim := c.limit(k, t)
		if c.limitAt != nil {
			// A change of the limit takes effect at the decisions after
			// it: until then the sum is bounded by the limit before it.
			lim2 := c.limit(k, t.Add(-c.cfg.Epoch-c.cfg.MaxWait))
			lim.RateMilli, lim.BurstMilli = max(lim.RateMilli, lim2.RateMilli), max(lim.BurstMilli, lim2.BurstMilli)
		}
		var sum shares.Share
		for _, h := range c.regs {
			s := enforced(h, k, t)
			sum.RateMilli += s.RateMilli
			sum.BurstMilli += s.BurstMilli
		}
		if sum.RateMilli > lim.RateMilli || sum.BurstMilli > lim.BurstMilli {
			var parts []string
			for _, h := range c.regs {
				parts = append(parts, fmt.Sprintf("%s=%+v", name(h), enforced(h, k, t)))
			}
			c.t.Fatalf("%s %v (epoch %d) key %v: enforced sum %+v exceeds limit %+v: %v",
				at, t, EpochOf(t, c.cfg.Epoch), k, sum, lim, parts)
		}
	}
}

// step runs epoch e: at its end every live region collects demand(i, key)
// and publishes; then reports are delivered and regions decide.
func (c *cluster) step(e int64, demand func(i int, k Key) int64) {
	end := c.epochStart(e + 1)
	for _, i := range c.r.Perm(len(c.regs)) {
		h := c.regs[i]
		if !h.up {
			continue
		}
		var usage []Usage
		for _, k := range c.keys {
			if d := demand(i, k); d > 0 {
				usage = append(usage, Usage{Key: k, Demand: d, Admitted: d / 2})
			}
		}
		var pub Published
		var err error
		switch {
		case c.unknown > 0 && c.r.Float64() < c.unknown:
			pub, err = h.core.CollectUnknown(end)
		case c.incomplete > 0 && c.r.Float64() < c.incomplete:
			var thin []Usage
			for _, u := range usage {
				switch c.r.IntN(3) {
				case 0: // dropped
				case 1:
					u.Demand = c.r.Int64N(u.Demand + 1)
					u.Admitted = min(u.Admitted, u.Demand)
					thin = append(thin, u)
				default:
					thin = append(thin, u)
				}
			}
			before := map[Key]int64{}
			for k, st := range h.core.all() {
				before[k] = st.smoothed
			}
			pub, err = h.core.CollectIncomplete(end, thin)
			require.NoError(c.t, err)
			require.Empty(c.t, pub.Updates, "region %s epoch %d: an incomplete epoch gives up no share at collection", h.name, e)
			for k, prev := range before {
				if st := h.core.held(k); st != nil {
					require.GreaterOrEqual(c.t, st.smoothed, prev, "region %s epoch %d key %v: an incomplete epoch lowered the smoothed demand", h.name, e, k)
				}
			}
			if pub.Report != nil {
				for _, kr := range pub.Report.Keys {
					if kr.Removed {
						continue // (a delta's line: claims the default)
					}
					st := h.core.held(kr.Key)
					require.Equal(c.t, st.share, kr.Share, "region %s epoch %d key %v: the report claims what is enforced", h.name, e, kr.Key)
				}
			}
		default:
			pub, err = h.core.Collect(end, usage)
		}
		require.NoError(c.t, err)
		require.Equal(c.t, e, pub.Epoch)
		if rep := pub.Report; rep != nil {
			// What the report publishes, expanded if a delta, is the
			// Core's own state: its claims, and the smoothed demand its
			// own view decides from (delta.go).
			if rep.Base == 0 {
				h.lastFull = rep
			} else {
				require.NotNil(c.t, h.lastFull, "region %s epoch %d: a delta without a full report before", h.name, e)
				require.Equal(c.t, h.lastFull.Epoch, rep.Base)
				rep = expandReport(h.lastFull, rep)
			}
			for _, kr := range rep.Keys {
				st := h.core.held(kr.Key)
				require.NotNil(c.t, st, "region %s epoch %d key %v", h.name, e, kr.Key)
				require.Equal(c.t, st.share, kr.Share, "region %s epoch %d key %v: claim", h.name, e, kr.Key)
				require.Equal(c.t, st.want, kr.Want, "region %s epoch %d key %v: want", h.name, e, kr.Key)
				require.Equal(c.t, st.smoothed, kr.SmoothedDemandMilli, "region %s epoch %d key %v: smoothed demand", h.name, e, kr.Key)
			}
		}
		if pub.Late != nil {
			h.decisions = append(h.decisions, *pub.Late)
			c.apply(h, end, pub.Late.Updates)
		}
		c.apply(h, end, pub.Updates)
		if pub.Report == nil {
			continue
		}
		if c.pubFail > 0 && c.r.Float64() < c.pubFail {
			// The publication failed: the report is not on the bus, and
			// the Core decides all the same (as the driver's does).
			h.core.NotPublished(pub.Epoch)
			continue
		}
		h.reports = append(h.reports, pub.Report)
		for j := range c.regs {
			if j == i {
				continue
			}
			for _, delay := range c.net.route(c.r, i, j, e) {
				c.inflight = append(c.inflight, msg{to: j, rep: pub.Report, due: e + delay})
			}
		}
	}
	// Every region's epoch start, in true time (expiries happen there).
	for _, h := range c.regs {
		if c.skew > 0 {
			c.checkAt(end.Add(-h.offset))
		}
	}
	c.check(end)
	if c.afterCollect != nil {
		c.afterCollect(e)
	}
	if c.xfer != nil {
		c.transferTick(end.Add(c.cfg.MaxWait / 4))
	}

	mid := end.Add(c.cfg.MaxWait / 2)
	deadline := end.Add(c.cfg.MaxWait)
	type event struct {
		deliver *msg
		decide  int
		xfer    bool // a transfer tick (c.xfer)
	}
	var events, lateEvents, afterMid []event
	var keep []msg
	for idx := range c.inflight {
		m := c.inflight[idx]
		// With skew, a report arrives no sooner in true time than its
		// sender published it (at its collection): a receiver whose clock
		// is ahead of the sender's by more than MaxWait/2 gets it only
		// after its decisions at mid, by more than MaxWait only late.
		ahead := c.regs[m.to].offset - c.regs[c.index(m.rep.Region)].offset
		switch {
		case m.due > e:
			keep = append(keep, m)
		case c.late > 0 && c.r.Float64() < c.late || c.skew > 0 && ahead > c.cfg.MaxWait:
			lateEvents = append(lateEvents, event{deliver: &m})
		case c.skew > 0 && ahead > c.cfg.MaxWait/2:
			afterMid = append(afterMid, event{deliver: &m})
		default:
			events = append(events, event{deliver: &m})
		}
	}
	c.inflight = keep
	c.r.Shuffle(len(events), func(a, b int) { events[a], events[b] = events[b], events[a] })
	if c.senderOrder {
		inSenderOrder(events, func(e event) *msg { return e.deliver })
	}
	var decides []event
	for i := range c.regs {
		decides = append(decides, event{decide: i})
	}
	if c.xfer != nil {
		for range 2 {
			at := c.r.IntN(len(events) + 1)
			events = slices.Insert(events, at, event{xfer: true})
		}
	}
	if c.deliverFirst {
		events = append(events, decides...)
	} else {
		for _, d := range decides {
			at := c.r.IntN(len(events) + 1)
			events = slices.Insert(events, at, d)
		}
	}
	var deferred []int
	skipped := map[int]bool{}
	deliver := func(m *msg) *hregion {
		h := c.regs[m.to]
		if !h.up {
			return nil
		}
		rc, err := h.core.Receive(m.rep)
		require.NoError(c.t, err)
		if rc == Accepted || rc == Duplicate || rc == Stale {
			h.received = append(h.received, m.rep)
		}
		return h
	}
	for _, ev := range events {
		if ev.deliver != nil {
			deliver(ev.deliver)
			continue
		}
		if ev.xfer {
			c.transferTick(mid)
			continue
		}
		h := c.regs[ev.decide]
		if !h.up || c.r.Float64() < c.skip {
			skipped[ev.decide] = true
			continue
		}
		if h.core.Due(mid) {
			c.decide(h, mid)
		} else {
			deferred = append(deferred, ev.decide)
		}
	}
	for _, ev := range afterMid {
		deliver(ev.deliver)
	}
	for _, i := range deferred {
		h := c.regs[i]
		require.True(c.t, h.core.Due(deadline))
		c.decide(h, deadline)
	}
	// Reports later than the deadline, still in epoch e+1: a region that
	// held for one of them decides again, with growth, once its view is
	// complete (as a driver does when a report makes Due true).
	lateAt := deadline.Add((c.cfg.Epoch - c.cfg.MaxWait) / 2)
	c.r.Shuffle(len(lateEvents), func(a, b int) { lateEvents[a], lateEvents[b] = lateEvents[b], lateEvents[a] })
	for _, ev := range lateEvents {
		h := deliver(ev.deliver)
		if h == nil || skipped[ev.deliver.to] {
			continue
		}
		if h.core.Due(lateAt) {
			_, pending := h.core.Pending()
			require.False(c.t, pending, "region %s: only a second decision is due after the deadline", h.name)
			c.decide(h, lateAt)
			require.True(c.t, h.decisions[len(h.decisions)-1].Again)
		}
	}
	if c.xfer != nil {
		// Between the decisions and the next collection.
		rest := end.Add(c.cfg.Epoch).Sub(lateAt)
		c.transferTick(lateAt.Add(rest / 3))
		c.transferTick(lateAt.Add(2 * rest / 3))
	}
}

func (c *cluster) decide(h *hregion, now time.Time) {
	m, _ := h.core.Pending()
	d, err := h.core.Decide(now)
	require.NoError(c.t, err)
	h.decisions = append(h.decisions, d)
	if c.checkRef {
		want := refMode(h, c, m)
		require.Equal(c.t, want.String(), d.Mode.String(), "region %s epoch %d: mode", h.name, m)
	}
	c.apply(h, now, d.Updates)
}

// refMode is a naive reference for the mode of region h's decision of
// epoch m, recomputed from every report ever delivered to it: the rule
// before the heard matrix (every region heard, and hearing this one,
// within K epochs) or the majority rule (see the package doc), with
// silence counted over the heard matrix.
func refMode(h *hregion, c *cluster, m int64) shares.Mode {
	cfg := h.core.Config()
	k := cfg.SilenceEpochs
	if !h.fresh && m < h.core.firstEpoch+cfg.WarmupEpochs {
		return shares.Fallback
	}
	names := make([]string, len(c.regs))
	for i, q := range c.regs {
		names[i] = q.name
	}
	// rows[q]: the heard vector (by name) of the newest report of q known,
	// directly or relayed; the first one wins among equal epochs.
	type refRow struct {
		ok             bool
		epoch, started int64
		heard          map[string]int64
	}
	rows := map[string]*refRow{}
	see := func(region string, epoch, started int64, heard []Heard) {
		if region == h.name {
			return
		}
		if r := rows[region]; r != nil && r.ok && epoch <= r.epoch {
			return
		}
		r := &refRow{ok: true, epoch: epoch, started: started, heard: map[string]int64{}}
		for _, hd := range heard {
			if old, ok := r.heard[hd.Region]; !ok || hd.Epoch > old {
				r.heard[hd.Region] = hd.Epoch
			}
		}
		rows[region] = r
	}
	heardOf := func(r *refRow, name string) int64 {
		if e, ok := r.heard[name]; ok {
			return e
		}
		return -1
	}
	type direct struct {
		has             bool
		any             bool
		last, heardSelf int64
		// isolated, by epoch: the report's sender was new (Started > 0)
		// and the highest epoch its Heard names of another region.
		started  map[int64]int64
		heardMax map[int64]int64
	}
	dir := map[string]*direct{}
	for _, r := range h.received {
		see(r.Region, r.Epoch, r.Started, r.Heard)
		for _, rr := range r.Relay {
			if rr.Region != r.Region {
				see(rr.Region, rr.Epoch, rr.Started, rr.Heard)
			}
		}
		d := dir[r.Region]
		if d == nil {
			d = &direct{last: -1 << 62, heardSelf: -1}
			dir[r.Region] = d
		}
		if r.Epoch == m {
			d.has = true
		}
		if d.started == nil {
			d.started, d.heardMax = map[int64]int64{}, map[int64]int64{}
		}
		if _, ok := d.started[r.Epoch]; !ok {
			hm := int64(-1)
			for _, hd := range r.Heard {
				if hd.Region != r.Region {
					hm = max(hm, hd.Epoch)
				}
			}
			d.started[r.Epoch], d.heardMax[r.Epoch] = r.Started, hm
		}
		if !d.any || r.Epoch > d.last {
			d.any, d.last, d.heardSelf = true, r.Epoch, -1
			for _, hd := range r.Heard {
				if hd.Region == h.name {
					d.heardSelf = hd.Epoch
				}
			}
		}
	}
	dirOf := func(name string) direct {
		if d := dir[name]; d != nil {
			return *d
		}
		return direct{last: -1 << 62, heardSelf: -1}
	}
	// With WarmupEpochs >= max(2K-1, K+R-1) the majority rule applies, and
	// silence takes K+R-1 epochs instead of K+1 (R = RecordEpochs).
	on := cfg.WarmupEpochs >= max(2*k-1, k+cfg.RecordEpochs-1)
	sb := k
	if on {
		sb = k + cfg.RecordEpochs - 2
	}
	silent := func(name string) bool {
		if d := dirOf(name); d.any && d.last > m-sb-1 {
			return false
		}
		if r := rows[name]; r != nil && r.epoch > m-sb-1 {
			return false
		}
		for other, r := range rows {
			if other != name && heardOf(r, name) > m-sb-1 {
				return false
			}
		}
		return true
	}
	complete, oldOK := true, true
	for _, q := range names {
		if q == h.name {
			continue
		}
		d := dirOf(q)
		if !d.has && !silent(q) {
			complete = false
		}
		if !d.any || d.last <= m-k || d.heardSelf <= m-k {
			oldOK = false
		}
	}
	hears := func(u, v string) bool {
		if u == h.name {
			d := dirOf(v)
			return d.any && d.last > m-k
		}
		r := rows[u]
		return r != nil && r.started > 0 && r.epoch-r.started > sb && r.epoch > m-k && heardOf(r, v) > m-k
	}
	majority := false
	if on && m > h.core.firstEpoch+sb {
		n := len(names)
		for set := 0; set < 1<<n && !majority; set++ {
			var members []string
			for i, name := range names {
				if set&(1<<i) != 0 {
					members = append(members, name)
				}
			}
			if len(members) <= n/2 || !slices.Contains(members, h.name) {
				continue
			}
			ok := true
			for _, u := range members {
				for _, v := range members {
					if u != v && !hears(u, v) {
						ok = false
					}
				}
			}
			majority = ok
		}
	}
	// A region (not silent, not unheard) whose report in the view (of m,
	// else its latest) says it heard nobody else in epochs m-K-1..m may
	// rise to the default: no growth while one is in the view.
	isolated := false
	for _, q := range names {
		d := dirOf(q)
		if q == h.name || silent(q) || !d.any || d.last <= m-k {
			continue
		}
		e := d.last
		if d.has {
			e = m
		}
		if d.started[e] > 0 && d.heardMax[e] <= m-k-1 {
			isolated = true
		}
	}
	switch {
	case !oldOK && !majority:
		return shares.Fallback
	case complete && !isolated:
		return shares.Grow
	}
	return shares.Hold
}

// share returns what region name enforces for k at the start of epoch e.
func (c *cluster) share(name string, k Key, e int64) shares.Share {
	return c.enforced(c.regs[c.index(name)], k, c.epochStart(e))
}

// perfect delivers every report at once.
type perfect struct{}

func (perfect) route(*rand.Rand, int, int, int64) []int64 { return []int64{0} }

// cut drops reports on links for which drop is true, else delivers at once.
type cut struct {
	drop func(from, to int, e int64) bool
}

func (c cut) route(_ *rand.Rand, from, to int, e int64) []int64 {
	if c.drop(from, to, e) {
		return nil
	}
	return []int64{0}
}

// inSenderOrder sorts the deliveries of each (sender, receiver) pair by
// epoch, keeping the positions the pairs' deliveries hold in events.
func inSenderOrder[E any](events []E, deliver func(E) *msg) {
	type pair struct {
		from string
		to   int
	}
	at := map[pair][]int{}
	for i, e := range events {
		if m := deliver(e); m != nil {
			p := pair{m.rep.Region, m.to}
			at[p] = append(at[p], i)
		}
	}
	for _, idx := range at {
		evs := make([]E, len(idx))
		for n, i := range idx {
			evs[n] = events[i]
		}
		slices.SortStableFunc(evs, func(a, b E) int { return cmp.Compare(deliver(a).rep.Epoch, deliver(b).rep.Epoch) })
		for n, i := range idx {
			events[i] = evs[n]
		}
	}
}
