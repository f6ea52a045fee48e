package rebalancer

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/quotientlabs/quotient/shares"
)

// Transfers between decisions (asks and gives): a region whose demand for
// a key outruns its share asks the others for the difference (Ask); a
// region with spare share lowers its share and gives the amount (Give);
// the asker raises its share by what it accepts. They travel on their own
// topic beside the reports; see the package doc ("Transfers between
// decisions") for the rules and why the enforced sum stays within L.

// ErrTransfer: an Ask or a Give is malformed (nil, unknown region, a key
// twice, a negative amount); it was not applied.
var ErrTransfer = errors.New("rebalancer: invalid transfer")

// Pressure is this region's recent demand for one key: what its gateways
// attempted per second (allowed or not), in milli cost units, over the
// last pressure window (about a second, see DriverConfig's pressure
// interval), as their flushed usage shows it. A driver passes the keys
// whose demand outran what was admitted (the gateways' pressure marks).
type Pressure struct {
	Key
	DemandMilli int64 // milli cost units per second, >= 0
}

// AskKey is one key of an Ask: the asker's demand for Key outruns its
// share by Need (rate and burst; burst = rate*B/L).
type AskKey struct {
	Key
	Need shares.Share
}

// Ask is a region's request for share. It is sent to every region; the
// Core keeps no reference to it.
type Ask struct {
	Region string // the asker
	Epoch  int64  // the asker's last collected (published) report epoch
	Keys   []AskKey
}

// GiveKey is one key of a Give: the giver no longer enforces Amount of
// its share of Key; the receiver may.
type GiveKey struct {
	Key
	Amount shares.Share
}

// Give moves share from region From to region To. The giver lowered its
// share by every Amount, and wrote that, before sending it. The amounts
// count in the giver's claims of epochs < Transfer and in the receiver's
// claims of epochs >= Transfer; a receiver whose last report is not of
// epoch Transfer-1 refuses the gift (it is lost until the next decision:
// safe). The Core keeps no reference to it.
type Give struct {
	From, To string
	// ID is strictly increasing per giver and, in practice, unique across
	// its restarts (from the clock, in microseconds): receivers refuse a
	// (From, ID) they accepted before (a duplicate on the bus).
	ID int64
	// Transfer (T) is the giver's last collected report epoch + 1.
	Transfer int64
	Keys     []GiveKey
}

// transfers is a Core's state for asks and gives.
type transfers struct {
	keys   map[Key]*transferKey
	seen   map[giveID]int64 // gives accepted, by (From, ID): their T (pruned at collection)
	lastID int64            // the last Give.ID this Core sent
	poll   time.Time        // the last Pressure call
	// asked holds the keys the last Pressure call asked for, and reaskAt
	// when Reask may ask for them again (zero: no re-ask due).
	asked   []Key
	reaskAt time.Time
}

// transferKey is one key's transfers since this region's last report.
type transferKey struct {
	period   int64        // the collected epoch the sums below follow (Core.published then)
	given    shares.Share // given away since the report of period
	accepted shares.Share // accepted since the report of period
	askedAt  time.Time    // last ask for the key (zero: never)
	gaveTo   int          // region index the key was last given to (-1: none)
	gaveAt   time.Time    // when (answers a duplicated ask only once)
	// The last pressure seen for the key (Core.Pressure): demand, milli
	// per second, and when.
	pressure   int64
	pressureAt time.Time
	// pressedSince is when the key's run of pressure began: the first of
	// the Pressure calls in a row that listed it.
	pressedSince time.Time
	// unanswered counts the asks of the period since a gift for the key
	// was last accepted (see askLimit); acceptedIn is the
	// last period a gift for it was accepted in (-1: none).
	unanswered int
	acceptedIn int64
	acceptedAt time.Time // when a gift for it was last accepted (zero: never)
	// dry counts the periods in a row whose asks got no gift accepted:
	// such a key asks once per period (see Pressure).
	dry int
}

type giveID struct {
	from string
	id   int64
}

// xkey returns key's transfer state, its sums reset when they follow an
// older period than the current one.
func (c *Core) xkey(k Key) *transferKey {
	if c.tr.keys == nil {
		c.tr.keys = make(map[Key]*transferKey)
	}
	x := c.tr.keys[k]
	if x == nil {
		x = &transferKey{period: c.published, gaveTo: -1, acceptedIn: -1}
		c.tr.keys[k] = x
	}
	if x.period != c.published {
		switch {
		case x.accepted != (shares.Share{}):
			x.dry = 0
		case x.unanswered > 0:
			x.dry++
		}
		x.period, x.given, x.accepted, x.unanswered = c.published, shares.Share{}, shares.Share{}, 0
	}
	return x
}

// xcurrent returns key's transfers of the current period, or nil.
func (c *Core) xcurrent(k Key) *transferKey {
	if x := c.tr.keys[k]; x != nil && x.period == c.published {
		return x
	}
	return nil
}

// transferring reports whether this region may ask, give or accept now:
// transfers on, a report published for the epoch last collected, not in
// fallback (at the last decision) nor in warm-up.
func (c *Core) transferring() bool {
	return c.cfg.Transfers && c.started && c.ownReport && !c.fallback && !c.warm(c.published)
}

// afterTransfers is the decision hook. Unless in fallback, a key that
// accepted a gift in this period or the one before and is under pressure
// (see pressed) keeps at least min(claim, its recent demand * headroom)
// (per dimension; burst demand scaled from L to B): a region may always
// keep up to its claim, and the smoothed demand lags a shift by epochs, so
// the decision would take back what the gift gave. (Every key under
// pressure keeping its claim locked shares in under contention: the
// regions that hold more than their fair part are all under pressure
// too.) Then: minus what was given and plus what was accepted
// since the report of the period (nothing accepted in fallback), floored
// at 0, at most the limit, and never mixed (the dimension above the
// default is lowered to it).
func (c *Core) afterTransfers(k Key, lim shares.Limit, next, claim shares.Share, fallback bool, now time.Time) shares.Share {
	if p, ok := c.pressed(k, now); ok && !fallback && c.acceptedRecently(k) {
		h := shares.MulDiv(min(p, lim.RateMilli), c.cfg.Shares.HeadroomPermille, 1000)
		keep := shares.Share{RateMilli: min(claim.RateMilli, h), BurstMilli: min(claim.BurstMilli, shares.MulDiv(h, lim.BurstMilli, lim.RateMilli))}
		next = lowerUnmix(shares.Share{RateMilli: max(next.RateMilli, keep.RateMilli), BurstMilli: max(next.BurstMilli, keep.BurstMilli)}, lim)
	}
	x := c.xcurrent(k)
	if x == nil {
		return next
	}
	r := next.RateMilli - x.given.RateMilli
	b := next.BurstMilli - x.given.BurstMilli
	if !fallback {
		r += x.accepted.RateMilli
		b += x.accepted.BurstMilli
	}
	out := shares.Share{RateMilli: min(max(r, 0), lim.RateMilli), BurstMilli: min(max(b, 0), lim.BurstMilli)}
	return lowerUnmix(out, lim)
}

// acceptedRecently reports whether a gift for k was accepted in the
// current period or the one before.
func (c *Core) acceptedRecently(k Key) bool {
	x := c.tr.keys[k]
	return x != nil && x.acceptedIn >= 0 && x.acceptedIn >= c.published-1
}

// askLimit is how many asks a key may send in a period without a gift
// accepted: three, or two after a period whose asks all went unanswered
// (a region over its limit that nobody can give to). One there made
// follow-the-sun 6.7% and five-regions-lossy 9.8% in the simulator (the
// rotating demand makes a giver of a region that had no spare an epoch
// before); three there cost 1.7 ask lines per report line in
// follow-the-sun.
func askLimit(x *transferKey) int {
	if x.dry > 0 {
		return 2
	}
	return 3
}

// askSpacing is the shortest time between two asks for a key: half the
// AskInterval. A driver woken by a gateway's flush (new pressure) reads
// right after it and then at its interval, and the first flush after a
// shift holds only part of a second's demand (a small ask): the next read,
// with the whole second, comes one interval later give or take the
// wake-up's delay, and must be able to ask for the rest (through the
// binaries a spacing of 7/8 of the interval missed it by 50 ms, which cost
// a second). Reads at the interval (the simulator's) ask as before; the
// per-period bound (askLimit) still caps the asks.
func askSpacing(interval time.Duration) time.Duration {
	return interval / 2
}

// duplicateAskWindow is how long after a gift to an asker a giver takes
// the same asker's ask for the key as a duplicate on the bus and answers
// nothing: a quarter of the AskInterval. An asker asks at most every half
// interval (askSpacing), and a re-ask (Core.Reask) follows its ask by half
// an interval, so the read after a re-ask that was answered asks half an
// interval after the gift, for the rest; with a window of half an
// interval that ask fell at its edge, and through the binaries one run in
// four was refused by a millisecond and never got the rest. A bus
// duplicate comes within the bus's jitter of the original.
func duplicateAskWindow(interval time.Duration) time.Duration {
	return interval / 4
}

// askNoise is the margin, in milli per second, that a demand rate seen
// over one second must exceed a share by before it is asked for: three
// standard deviations of a Poisson count of that many cost units,
// 3*sqrt(units) units. (Tuned once on the simulator's suite: with two,
// keys of a few requests per second per region asked on noise and
// zipf-many-keys lost 2 points; a giver keeps only the headroom above its
// demand and, on a first ask, giveNoise: a margin of deviations there left
// flash-crowd's and follow-the-sun's asks unanswered.) Unlike giveNoise it
// stays a margin of one second's count whatever the pressure window:
// taken over a shorter window (deployed mode's 0.2 s), it made the first
// asks after a shift, read from part of a window, ask for nothing, and
// abrupt-shift's shift window through the binaries was 4.8, 7.8 and 8.0
// points off virtual time (1.3 to 1.5 with this margin). A smaller margin costs asks on
// noise, which a giver's margin bounds; it never starves a region.
func askNoise(demandMilli int64) int64 {
	return 3 * int64(math.Sqrt(float64(demandMilli)*1000))
}

// giveNoise is what a giver keeps above the demand rate it saw over one
// window (besides the headroom) when it first gives a key to an asker;
// window is the pressure window, Config.AskInterval (the gateways' usage
// flush interval, 1 s by default). It is three requests of the policy's
// cheapest cost per window (milli per second, cost at least one unit; 3
// per second over the default 1 s), the rate that a window without a
// request does not rule out (a Poisson count of 0 has a 5% chance at 3 per
// window). A key of a
// few requests per second sees whole seconds without one: keeping only the
// headroom above such a count gave its share away and starved it
// (coordinator-down at a fifth of its rates: 23.5% under-served). A
// repeated ask gets the rest, so a region whose traffic has gone gives all
// of it one ask interval later. The margin is per window, not per second,
// because a window without a request is what it guards against: deployed
// mode's time-compressed runs measure over a fifth of a second, and with
// three per second their givers kept a fifth of what virtual time's keep,
// gave a key away on one quiet window and starved it (store-down: a region
// held at 1.7 of its 6 requests per second for 40 s, 11 points under
// virtual time).
func giveNoise(costMilli int64, window time.Duration) int64 {
	return int64(float64(3*max(costMilli, 1000)) / window.Seconds())
}

// pressed returns key's pressure demand (milli per second) when the last
// Pressure call, within two AskIntervals of now, listed it: a key is
// under pressure until a poll no longer lists it.
func (c *Core) pressed(k Key, now time.Time) (int64, bool) {
	x := c.tr.keys[k]
	if x == nil || x.pressureAt.IsZero() || !x.pressureAt.Equal(c.tr.poll) || now.Sub(x.pressureAt) > 2*c.cfg.AskInterval || now.Before(x.pressureAt) {
		return 0, false
	}
	return x.pressure, true
}

// keepRate is the collection hook for shares.Config.Keep: the epoch's
// demand rate, or the key's recent pressure when higher (the epoch's
// average lags a rise within it; keeping more than Keep would is always
// safe, the report claims it).
func (c *Core) keepRate(k Key, rate int64, now time.Time) int64 {
	if p, ok := c.pressed(k, now); ok {
		return max(rate, p)
	}
	return rate
}

// collectedTransfers is the collection hook (after the report of
// c.published is built): the sums start over with the new period, and
// gives whose T is this epoch or older can no longer be accepted, so
// their IDs are forgotten.
func (c *Core) collectedTransfers(now time.Time) {
	for k, x := range c.tr.keys {
		if x.period < c.published && (x.askedAt.IsZero() || x.period < c.published-1) {
			if _, ok := c.pressed(k, now); !ok && !c.acceptedRecently(k) {
				delete(c.tr.keys, k)
			}
		}
	}
	for id, t := range c.tr.seen {
		if t <= c.published {
			delete(c.tr.seen, id)
		}
	}
}

// lowerUnmix lowers the dimension above the default to the default when
// the other is below it: a share is never mixed.
func lowerUnmix(s shares.Share, lim shares.Limit) shares.Share {
	def := lim.Default()
	switch {
	case s.RateMilli > def.RateMilli && s.BurstMilli < def.BurstMilli:
		s.RateMilli = def.RateMilli
	case s.BurstMilli > def.BurstMilli && s.RateMilli < def.RateMilli:
		s.BurstMilli = def.BurstMilli
	}
	return s
}

// keyFor returns key's state, created at the default share when the Core
// has none, and its limit; false when the policy is unknown or invalid.
// The state is valid until a key is next held.
func (c *Core) keyFor(k Key, now time.Time) (*keyState, shares.Limit, bool) {
	lim, ok := c.keyLimit(k, now)
	if !ok {
		return nil, lim, false
	}
	st := c.held(k)
	if st == nil {
		st = c.st.at(c.hold(k, c.published))
	}
	if !st.is(kfKnown) {
		st.share, st.claim = lim.Default(), lim.Default()
		st.set(kfKnown, true)
	} else if st.is(kfSynced) && !st.is(kfRecord) {
		st.share = lim.Default() // no record: the default of the limit in force
	}
	return st, lim, true
}

// threshold is the smallest ask or give of lim, in milli per second.
func (c *Core) threshold(lim shares.Limit) int64 {
	return max(1, shares.MulDiv(lim.RateMilli, c.cfg.AskThresholdPermille, 1000))
}

// Pressure is called by the driver every pressure interval (about a
// second), with nothing too, with this region's recent demand for the keys
// under pressure (the gateways rejected some of it): a key is under
// pressure until a call no longer lists it (or for two AskIntervals
// without a call). It notes each key's pressure (see the decisions and
// ReceiveAsk), also in fallback and warm-up, and returns the Ask to publish, or nil
// when no key needs more share. A key is asked for when (demand minus
// three Poisson deviations of a one-second count, 3*sqrt(units))
// *HeadroomPermille/1000, at most L, exceeds its share by at least
// Config.AskThresholdPermille of L; the region is neither in fallback nor
// in warm-up and has published a report for its last collected epoch; the
// key was not asked for within half of Config.AskInterval (see
// askSpacing), nor three times in
// this report period since a gift for it was last accepted (a lost ask is
// asked again; after that the decision serves it), nor more than twice
// in a period when the period before got no gift for all its asks (see
// askLimit: two always left follow-the-sun at 5.6% and flash-crowd at
// 4.1% in the simulator, three always cost 1.7 ask key lines per report
// key line where a region stays over its limit); and this region
// gave none of it since its last report (no cascades). Need is that
// excess, burst in proportion (Need.RateMilli*B/L). Entries with an
// unknown policy or a negative demand are skipped; the Ask's keys are
// sorted. Asking changes no share. When it asks, ReaskAt is half an
// AskInterval later, when Reask repeats the ask for what is then still
// missing; a Pressure call that asks before that replaces it, one that
// does not keeps it (a read woken by another gateway's flush within the
// spacing), and the keys it no longer lists are not repeated.
func (c *Core) Pressure(now time.Time, pressure []Pressure) *Ask {
	prevPoll := c.tr.poll
	c.tr.poll = now
	c.lcOn = false
	defer func() { c.lcOn = false }()
	var ask *Ask
	for _, p := range pressure {
		if p.PolicyID == "" || p.DemandMilli < 0 {
			continue
		}
		lim, ok := c.keyLimit(p.Key, now)
		if !ok {
			continue
		}
		px := c.xkey(p.Key)
		if px.pressureAt.IsZero() || !px.pressureAt.Equal(prevPoll) || now.Sub(px.pressureAt) > 2*c.cfg.AskInterval {
			px.pressedSince = now
		}
		px.pressure, px.pressureAt = p.DemandMilli, now
		ask = c.askFor(now, ask, p.Key, lim, px, false)
	}
	if ask = c.finishAsk(ask); ask != nil {
		c.tr.asked = c.tr.asked[:0]
		for _, k := range ask.Keys {
			c.tr.asked = append(c.tr.asked, k.Key)
		}
		c.tr.reaskAt = now.Add(askSpacing(c.cfg.AskInterval))
	}
	return ask
}

// ReaskAt is when Reask may ask again for the keys the last Pressure call
// asked for (zero: nothing to ask again). A driver calls Reask then
// unless a Pressure call comes first.
func (c *Core) ReaskAt() time.Time { return c.tr.reaskAt }

// Reask asks again, once, for the keys the last asking Pressure call asked
// for, with the demand of the last call that listed them (a later call that
// listed them no more leaves them out), when no gift for them came since
// and their run of pressure (the Pressure calls in a row that listed them)
// began at most two AskIntervals ago: the first asks after a shift. The
// rules of Pressure apply (threshold, no ask for a key given away, in
// fallback or in warm-up, nor past the asks of the period), but a re-ask is
// not counted among those asks and does not move the spacing of the next
// one: it repeats an ask, at most once each, so a shift sends at most two
// more asks per key. It is what a refused ask costs otherwise: a giver
// whose own gateways rejected some of the key until their last flush
// refuses an ask that comes before that flush is read (through the
// binaries, 20 to 160 ms before; gives are sent, refusals are not), and the
// asker's next read is a whole pressure interval later. A collection in
// between does not cancel it: the re-ask is for the new period (with 10 s
// epochs, by the arithmetic, for about one shift in twenty). Keys under
// pressure for longer are not repeated: there nobody had spare at the last
// read, and repeats moved share on the givers' noise (five-regions-lossy
// over 20 seeds: mean 7.0% and up to 15.2% under with every ask repeated,
// 4.9% and 9.4% without repeats, 4.9% and 8.3% with these). Reask before
// ReaskAt, or a second time for one Pressure call, returns nil. Goroutine
// safety as for the rest of the Core: none.
func (c *Core) Reask(now time.Time) *Ask {
	if c.tr.reaskAt.IsZero() || now.Before(c.tr.reaskAt) {
		return nil
	}
	c.tr.reaskAt = time.Time{}
	c.lcOn = false
	defer func() { c.lcOn = false }()
	var ask *Ask
	for _, k := range c.tr.asked {
		if _, ok := c.pressed(k, now); !ok {
			continue
		}
		x := c.xkey(k)
		if !x.acceptedAt.Before(x.askedAt) {
			continue // a gift came since the ask: the next read asks for the rest
		}
		if now.Sub(x.pressedSince) > 2*c.cfg.AskInterval {
			continue // under pressure for long: no shift to catch up with
		}
		lim, ok := c.keyLimit(k, now)
		if !ok {
			continue
		}
		ask = c.askFor(now, ask, k, lim, x, true)
	}
	c.tr.asked = c.tr.asked[:0]
	if ask = c.finishAsk(ask); ask != nil {
		c.stats.Reasks++
	}
	return ask
}

// askFor adds k to ask (a new one when nil) when the region may ask for
// it and its pressure demand (x.pressure), less three Poisson deviations,
// times the headroom outruns its share by the ask threshold (see
// Pressure), and notes the ask in x unless it repeats one (Reask).
func (c *Core) askFor(now time.Time, ask *Ask, k Key, lim shares.Limit, x *transferKey, repeat bool) *Ask {
	if !c.transferring() {
		return ask
	}
	share := lim.Default()
	if st := c.held(k); st != nil && st.is(kfKnown) && !(st.is(kfSynced) && !st.is(kfRecord)) {
		share = st.share
	}
	lo := max(x.pressure-askNoise(x.pressure), 0)
	want := min(shares.MulDiv(lo, c.cfg.Shares.HeadroomPermille, 1000), lim.RateMilli)
	need := want - share.RateMilli
	if need < c.threshold(lim) {
		return ask
	}
	if !x.askedAt.IsZero() && now.Before(x.askedAt.Add(askSpacing(c.cfg.AskInterval))) {
		return ask
	}
	if x.period == c.published && x.given != (shares.Share{}) {
		return ask // gave some of it this period: no cascades
	}
	limit := askLimit(x)
	if repeat {
		limit++ // the ask it repeats is counted
	}
	if x.period == c.published && x.unanswered >= limit {
		return ask // asked three times for nothing: wait for the decision
	}
	if !repeat {
		x.askedAt = now
		x.unanswered++
	}
	if ask == nil {
		ask = &Ask{Region: c.cfg.Region, Epoch: c.published}
	}
	ask.Keys = append(ask.Keys, AskKey{Key: k, Need: shares.Share{RateMilli: need, BurstMilli: shares.MulDiv(need, lim.BurstMilli, lim.RateMilli)}})
	return ask
}

// finishAsk sorts ask's keys, drops repeats and counts it; nil stays nil.
func (c *Core) finishAsk(ask *Ask) *Ask {
	if ask == nil {
		return nil
	}
	slices.SortFunc(ask.Keys, func(a, b AskKey) int { return compareKeys(a.Key, b.Key) })
	ask.Keys = slices.CompactFunc(ask.Keys, func(a, b AskKey) bool { return a.Key == b.Key })
	c.stats.Asks++
	c.stats.AskedKeys += int64(len(ask.Keys))
	return ask
}

// ReceiveAsk answers another region's Ask, with own this region's recent
// demand for the asked keys (milli per second over the last pressure
// window, as for Pressure; a key absent from own has demand 0: a driver
// that could not read its usage must not call it). It gives only when the
// ask follows this region's last collected epoch (Ask.Epoch equal to it:
// otherwise the asker, in another report period, would refuse the gift)
// and this region may transfer (as for Pressure). For each key with spare
// share (share minus max(own demand*headroom, own demand + giveNoise on a
// first ask, the floor), in rate) of at
// least the ask threshold, not under pressure here (Pressure saw it within
// two AskIntervals), not accepted since its last report, and not given to
// the same asker within AskInterval/4 (a duplicated ask), it lowers its
// share by min(spare, Need) (burst in proportion, never below the floor;
// the part that would leave the share above the default in one dimension
// and below it in the other is kept) and returns the Updates that write
// the lowered shares, with the Give to publish; both nil when it gives
// nothing. The driver MUST write the updates before publishing the Give,
// and drop the Give when the write fails (the Core has already lowered
// its shares: the next report claims the lowered share, an upper bound of
// what is enforced). Errors wrap ErrTransfer (malformed ask, unknown
// region); nothing changed then. An ask of this region's own is ignored
// (nil, nil, nil).
func (c *Core) ReceiveAsk(now time.Time, ask *Ask, own []Pressure) ([]Update, *Give, error) {
	if err := c.checkAsk(ask); err != nil {
		return nil, nil, err
	}
	qi := c.index[ask.Region]
	if qi == c.self || !c.transferring() || ask.Epoch != c.published {
		return nil, nil, nil
	}
	c.lcOn = false
	defer func() { c.lcOn = false }()
	demand := make(map[Key]int64, len(own))
	for _, p := range own {
		demand[p.Key] = max(demand[p.Key], p.DemandMilli)
	}
	var ups []Update
	var give *Give
	for _, ak := range ask.Keys {
		if x := c.tr.keys[ak.Key]; x != nil {
			if x.period == c.published && x.accepted != (shares.Share{}) {
				continue // accepted some of it this period: no cascades
			}
			if x.gaveTo == qi && !x.gaveAt.IsZero() && now.Before(x.gaveAt.Add(duplicateAskWindow(c.cfg.AskInterval))) {
				continue // a duplicate of an ask already answered
			}
		}
		if _, ok := c.pressed(ak.Key, now); ok {
			continue // its own gateways reject some of it: no spare
		}
		st, lim, ok := c.keyFor(ak.Key, now)
		if !ok {
			continue
		}
		def := lim.Default()
		floor := shares.MulDiv(def.RateMilli, c.cfg.Shares.FloorPermille, 1000)
		// The first give of a run keeps giveNoise above the second's
		// count; a repeated ask (this asker again within two ask
		// intervals, and this region's count low again) gets the rest.
		noise := giveNoise(lim.MinCostMilli, c.cfg.AskInterval)
		if x := c.tr.keys[ak.Key]; x != nil && x.gaveTo == qi && !x.gaveAt.IsZero() && now.Sub(x.gaveAt) <= 2*c.cfg.AskInterval {
			noise = 0
		}
		keep := max(shares.MulDiv(demand[ak.Key], c.cfg.Shares.HeadroomPermille, 1000), demand[ak.Key]+noise, floor)
		cur := clamp(st.share, lim)
		spare := cur.RateMilli - keep
		if spare < c.threshold(lim) || ak.Need.RateMilli <= 0 {
			continue
		}
		amt := min(spare, ak.Need.RateMilli)
		burstFloor := min(max(shares.MulDiv(def.BurstMilli, c.cfg.Shares.FloorPermille, 1000), lim.MinCostMilli), def.BurstMilli)
		next := shares.Share{
			RateMilli:  cur.RateMilli - amt,
			BurstMilli: max(cur.BurstMilli-shares.MulDiv(amt, lim.BurstMilli, lim.RateMilli), min(burstFloor, cur.BurstMilli)),
		}
		next = raiseUnmix(next, lim)
		gave := shares.Share{RateMilli: cur.RateMilli - next.RateMilli, BurstMilli: cur.BurstMilli - next.BurstMilli}
		if gave.RateMilli <= 0 && gave.BurstMilli <= 0 {
			continue
		}
		ups = append(ups, c.record(ak.Key, st, lim, next, c.decided))
		st.share = next
		x := c.xkey(ak.Key)
		x.given = shares.Share{RateMilli: x.given.RateMilli + gave.RateMilli, BurstMilli: x.given.BurstMilli + gave.BurstMilli}
		x.gaveTo, x.gaveAt = qi, now
		if give == nil {
			c.tr.lastID = max(c.tr.lastID+1, now.UnixMicro())
			give = &Give{From: c.cfg.Region, To: ask.Region, ID: c.tr.lastID, Transfer: c.published + 1}
		}
		give.Keys = append(give.Keys, GiveKey{Key: ak.Key, Amount: gave})
	}
	if give == nil {
		return nil, nil, nil
	}
	c.stats.Gives++
	c.stats.GivenKeys += int64(len(give.Keys))
	c.stats.Updates += int64(len(ups))
	return ups, give, nil
}

// raiseUnmix raises the dimension below the default to the default when
// the other is above it (a giver keeps that part).
func raiseUnmix(s shares.Share, lim shares.Limit) shares.Share {
	def := lim.Default()
	switch {
	case s.RateMilli > def.RateMilli && s.BurstMilli < def.BurstMilli:
		s.BurstMilli = def.BurstMilli
	case s.BurstMilli > def.BurstMilli && s.RateMilli < def.RateMilli:
		s.RateMilli = def.RateMilli
	}
	return s
}

// ReceiveGive applies a Give addressed to this region: it raises this
// region's share of each key by the amount, at most to the limit, minus
// whatever part would put the share above the default in one dimension
// and below it in the other, and returns the Updates to write. A give to
// another region is ignored (nil, nil). It refuses the whole gift (nil,
// nil; Stats.Refused) when this region may not transfer (transfers off,
// fallback, warm-up, no report published for its last collected epoch),
// when (From, ID) was accepted before, or when its last collected epoch
// is not Transfer-1; a refused gift is lost (the giver's next report no
// longer claims it, so the next decision hands it out again). It refuses
// a key it gave some of since its last report (no cascades), and one
// whose policy is unknown (Stats.RefusedKeys). If the write fails, the
// driver must not publish the next report until the updates are written,
// as for a decision's. Errors wrap ErrTransfer (malformed give); nothing
// changed then. ReceiveGiveReason also says why a give raised nothing.
func (c *Core) ReceiveGive(now time.Time, g *Give) ([]Update, error) {
	ups, _, err := c.ReceiveGiveReason(now, g)
	return ups, err
}

// ReceiveGiveReason is ReceiveGive, and says why it raised no share
// (GiveAccepted when it raised some): RefusedInvalid with the error,
// RefusedOtherRegion for a give to another region, the reason that
// refused the whole gift (see GiveRefusal), or the cause that most of
// its keys were refused for.
func (c *Core) ReceiveGiveReason(now time.Time, g *Give) ([]Update, GiveRefusal, error) {
	if err := c.checkGive(g); err != nil {
		return nil, RefusedInvalid, err
	}
	if g.To != c.cfg.Region {
		return nil, RefusedOtherRegion, nil
	}
	id := giveID{from: g.From, id: g.ID}
	_, dup := c.tr.seen[id]
	if why := c.giveGate(g, dup); why != GiveAccepted {
		c.stats.Refused++
		for _, gk := range g.Keys {
			c.stats.DroppedAmount = satAdd(c.stats.DroppedAmount, gk.Amount.RateMilli)
		}
		return nil, why, nil
	}
	if c.tr.seen == nil {
		c.tr.seen = make(map[giveID]int64)
	}
	c.tr.seen[id] = g.Transfer
	c.lcOn = false
	defer func() { c.lcOn = false }()
	var ups []Update
	var refused keyRefusals
	for _, gk := range g.Keys {
		if x := c.xcurrent(gk.Key); x != nil && x.given != (shares.Share{}) {
			c.stats.RefusedKeys++
			c.stats.DroppedAmount = satAdd(c.stats.DroppedAmount, gk.Amount.RateMilli)
			refused.givenHere++
			continue
		}
		st, lim, ok := c.keyFor(gk.Key, now)
		if !ok {
			c.stats.RefusedKeys++
			c.stats.DroppedAmount = satAdd(c.stats.DroppedAmount, gk.Amount.RateMilli)
			refused.unknown++
			continue
		}
		cur := clamp(st.share, lim)
		next := shares.Share{
			RateMilli:  min(satAdd(cur.RateMilli, gk.Amount.RateMilli), lim.RateMilli),
			BurstMilli: min(satAdd(cur.BurstMilli, gk.Amount.BurstMilli), lim.BurstMilli),
		}
		next = lowerUnmix(next, lim)
		got := shares.Share{RateMilli: next.RateMilli - cur.RateMilli, BurstMilli: next.BurstMilli - cur.BurstMilli}
		c.stats.DroppedAmount = satAdd(c.stats.DroppedAmount, gk.Amount.RateMilli-got.RateMilli)
		if got == (shares.Share{}) {
			c.stats.RefusedKeys++
			refused.noRoom++
			continue
		}
		ups = append(ups, c.record(gk.Key, st, lim, next, c.decided))
		st.share = next
		x := c.xkey(gk.Key)
		x.accepted = shares.Share{RateMilli: x.accepted.RateMilli + got.RateMilli, BurstMilli: x.accepted.BurstMilli + got.BurstMilli}
		x.acceptedIn, x.unanswered, x.acceptedAt = c.published, 0, now
	}
	if len(ups) == 0 {
		return nil, refused.reason(), nil
	}
	c.stats.Accepted++
	c.stats.Updates += int64(len(ups))
	return ups, GiveAccepted, nil
}

// checkAsk validates an Ask; the error wraps ErrTransfer.
func (c *Core) checkAsk(a *Ask) error {
	if a == nil {
		return fmt.Errorf("%w: nil ask", ErrTransfer)
	}
	if _, ok := c.index[a.Region]; !ok {
		return fmt.Errorf("%w: ask: Region %q is not one of %v", ErrTransfer, a.Region, c.regions)
	}
	seen := make(map[Key]bool, len(a.Keys))
	for i, k := range a.Keys {
		switch {
		case k.PolicyID == "":
			return fmt.Errorf("%w: ask from %s: key %d: PolicyID is empty", ErrTransfer, a.Region, i)
		case k.Need.RateMilli < 0 || k.Need.BurstMilli < 0:
			return fmt.Errorf("%w: ask from %s: key %s/%s: negative Need %+v", ErrTransfer, a.Region, k.PolicyID, k.Subject, k.Need)
		case seen[k.Key]:
			return fmt.Errorf("%w: ask from %s: key %s/%s twice", ErrTransfer, a.Region, k.PolicyID, k.Subject)
		}
		seen[k.Key] = true
	}
	return nil
}

// checkGive validates a Give; the error wraps ErrTransfer.
func (c *Core) checkGive(g *Give) error {
	if g == nil {
		return fmt.Errorf("%w: nil give", ErrTransfer)
	}
	if _, ok := c.index[g.From]; !ok {
		return fmt.Errorf("%w: give: From %q is not one of %v", ErrTransfer, g.From, c.regions)
	}
	if _, ok := c.index[g.To]; !ok {
		return fmt.Errorf("%w: give from %s: To %q is not one of %v", ErrTransfer, g.From, g.To, c.regions)
	}
	if g.From == g.To {
		return fmt.Errorf("%w: give from %s to itself", ErrTransfer, g.From)
	}
	seen := make(map[Key]bool, len(g.Keys))
	for i, k := range g.Keys {
		switch {
		case k.PolicyID == "":
			return fmt.Errorf("%w: give %s->%s id %d: key %d: PolicyID is empty", ErrTransfer, g.From, g.To, g.ID, i)
		case k.Amount.RateMilli < 0 || k.Amount.BurstMilli < 0:
			return fmt.Errorf("%w: give %s->%s id %d: key %s/%s: negative Amount %+v", ErrTransfer, g.From, g.To, g.ID, k.PolicyID, k.Subject, k.Amount)
		case seen[k.Key]:
			return fmt.Errorf("%w: give %s->%s id %d: key %s/%s twice", ErrTransfer, g.From, g.To, g.ID, k.PolicyID, k.Subject)
		}
		seen[k.Key] = true
	}
	return nil
}
