package quota

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"time"
)

// Amount is a token-bucket rate and burst in milli units, the units of the
// coordinator's share records.
type Amount struct {
	// RateMilli is in thousandths of a request per second.
	RateMilli int64
	// BurstMilli is in thousandths of a request.
	BurstMilli int64
}

func (a Amount) fits(b Amount) bool {
	return a.RateMilli <= b.RateMilli && a.BurstMilli <= b.BurstMilli
}

func (a Amount) add(b Amount) Amount {
	return Amount{satAdd(a.RateMilli, b.RateMilli), satAdd(a.BurstMilli, b.BurstMilli)}
}

func maxAmount(a, b Amount) Amount {
	return Amount{max(a.RateMilli, b.RateMilli), max(a.BurstMilli, b.BurstMilli)}
}

func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}

// mulDiv is floor(a*b/c) for a, b >= 0 and c > 0 without overflow, capped
// at MaxInt64.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// EnvoyID names one stream (one Envoy's connection) within a Core.
type EnvoyID uint64

// BucketKey is the canonical identity of a bucket (rls.BucketKey).
type BucketKey string

// Config configures a Core. Start from DefaultConfig.
type Config struct {
	// TTL is the assignment_time_to_live of every assignment. It must be
	// longer than the Envoys' reporting_interval (twice or more is
	// advised) so that a live Envoy's assignment is extended before it
	// expires. A lowered assignment frees capacity for other Envoys only
	// TTL + InFlight after the higher one was sent. Default 5 s.
	TTL time.Duration
	// InFlight bounds how long an assignment takes from being decided to
	// reaching the Envoy (stream buffers, network). The server reserves an
	// assignment until TTL + InFlight after it decided it, since the
	// Envoy's TTL starts when it receives it. Default 1 s.
	InFlight time.Duration
	// ThresholdPermille: an assignment whose target rate moves by no more
	// than this fraction (in thousandths) of the larger of the old and the
	// new value is kept (and extended), except a raise of more than a
	// quarter of it for an Envoy that needs more (LowerReports); every new
	// assignment is a full Envoy bucket. Default 100 (10 %).
	ThresholdPermille int64
	// IdleTimeout: a bucket of an Envoy that reported no request for this
	// long gets an AbandonAction. Default 60 s.
	IdleTimeout time.Duration
	// MinElapsed is the shortest span a demand rate is computed over.
	// Envoy reports a bucket when it creates it and again whenever it
	// receives a new assignment, so a report can cover a few milliseconds;
	// reports are added up until they cover MinElapsed before an Envoy's
	// demand is updated (its first report sets it at once, as if it
	// covered MinElapsed). Default 500 ms.
	MinElapsed time.Duration
	// BurstSparePermille is the part of the share's burst, in thousandths,
	// that the split leaves unassigned. Every new assignment (anything but
	// an extension) starts a full Envoy token bucket, so its burst is
	// reserved on top of the bursts of the assignments it replaces until
	// those run out; the spare part is what lets an assignment be changed
	// while the one before it is still reserved. A new assignment whose
	// burst does not fit is sent with the burst that does, or, under one
	// request, not sent (the Envoy keeps the one it has). Default 150
	// (250 before: with 30 Envoys per region each Envoy's bucket held 3
	// or 4 tokens against about 5 requests a second at random and
	// overflowed between them, 4.5 % under the limit; see the README).
	BurstSparePermille int64
	// LowerReports is how many of an Envoy's latest demand measurements
	// (each MinElapsed or more) make up the span over which a lowering is
	// judged. An assignment is lowered only when the requests reported,
	// over the latest measurement or over this span, are significantly
	// below its rate (two standard deviations of a Poisson count), so that
	// one low second of noise does not lower an assignment that is raised
	// back a second later (each change is a full Envoy bucket). Raises
	// are sent at once. Default 4.
	LowerReports int
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{TTL: 5 * time.Second, InFlight: time.Second, ThresholdPermille: 100, IdleTimeout: time.Minute, MinElapsed: 500 * time.Millisecond,
		BurstSparePermille: 150, LowerReports: 4}
}

// ErrConfig is wrapped by the errors of Config.Validate.
var ErrConfig = errors.New("quota: invalid configuration")

// Validate reports the first invalid field, by name.
func (c Config) Validate() error {
	switch {
	case c.TTL <= 0:
		return fmt.Errorf("%w: TTL must be > 0, got %v", ErrConfig, c.TTL)
	case c.InFlight < 0:
		return fmt.Errorf("%w: InFlight must be >= 0, got %v", ErrConfig, c.InFlight)
	case c.ThresholdPermille < 0 || c.ThresholdPermille > 1000:
		return fmt.Errorf("%w: ThresholdPermille must be in [0, 1000], got %d", ErrConfig, c.ThresholdPermille)
	case c.IdleTimeout <= 0:
		return fmt.Errorf("%w: IdleTimeout must be > 0, got %v", ErrConfig, c.IdleTimeout)
	case c.MinElapsed <= 0:
		return fmt.Errorf("%w: MinElapsed must be > 0, got %v", ErrConfig, c.MinElapsed)
	case c.BurstSparePermille < 0 || c.BurstSparePermille >= 1000:
		return fmt.Errorf("%w: BurstSparePermille must be in [0, 1000), got %d", ErrConfig, c.BurstSparePermille)
	case c.LowerReports < 1 || c.LowerReports > 64:
		return fmt.Errorf("%w: LowerReports must be in [1, 64], got %d", ErrConfig, c.LowerReports)
	}
	return nil
}

// Usage is one bucket's report from one Envoy.
type Usage struct {
	Allowed, Denied uint64
	Elapsed         time.Duration
}

// Action is what the server tells one Envoy about one bucket.
type Action struct {
	Envoy  EnvoyID
	Bucket BucketKey
	// Abandon: the Envoy drops the bucket (it was idle); the other fields
	// are unset.
	Abandon bool
	// Unlimited: ALLOW_ALL (an unlimited rule); Amount is unset.
	Unlimited bool
	// Amount is the token bucket assigned; a zero rate or a burst under
	// one request is DENY_ALL.
	Amount Amount
	// TTL is the assignment's time to live; 0 expires it at once.
	TTL time.Duration
}

// grant is one assignment sent, reserved until until: its rate while it
// may be in force, its burst (a full Envoy bucket) as long, since it
// cannot be known what the Envoy spent of it. An extension prolongs the
// grant it extends instead of making one.
type grant struct {
	amt   Amount
	until time.Time
}

// measure is one demand measurement: requests reported (n, of which
// denied were denied) over a span.
type measure struct {
	n, denied uint64
	elapsed   time.Duration
}

// sub is one Envoy's subscription to one bucket.
type sub struct {
	connected  bool
	abandoned  bool
	demand     int64 // milli requests per second, over the last MinElapsed or more
	hasDemand  bool
	measures   []measure     // the latest LowerReports measurements, oldest first
	accN       uint64        // requests reported since demand was last set
	accDenied  uint64        // of which denied
	accElapsed time.Duration // time those reports cover
	lastActive time.Time
	hasCur     bool // cur was sent and has not expired on the Envoy
	cur        Amount
	curSent    time.Time
	grants     []grant
}

// reserved is what the Envoy may be admitting at now (grants pruned): the
// largest rate of its grants that have not run out (it enforces one at a
// time) and the sum of their bursts (each was a full bucket).
func (s *sub) reserved() Amount {
	var r Amount
	for _, g := range s.grants {
		r.RateMilli = max(r.RateMilli, g.amt.RateMilli)
		r.BurstMilli = satAdd(r.BurstMilli, g.amt.BurstMilli)
	}
	return r
}

// reservedAt is what the Envoy may be admitting at t >= now by the grants
// made so far, counting those that have not run out at t as reserved does.
func (s *sub) reservedAt(t time.Time) Amount {
	var r Amount
	for _, g := range s.grants {
		if t.Before(g.until) {
			r.RateMilli = max(r.RateMilli, g.amt.RateMilli)
			r.BurstMilli = satAdd(r.BurstMilli, g.amt.BurstMilli)
		}
	}
	return r
}

// significantlyBelow reports whether the requests measured are, with three
// standard deviations of a Poisson count to spare, fewer than rateMilli
// over the span: n + 3*sqrt(n) + 4.5 < rate * elapsed. A measurement that
// is not cannot tell a lower demand from noise.
func significantlyBelow(m measure, rateMilli int64) bool {
	if m.elapsed <= 0 {
		return false
	}
	n := float64(m.n)
	return (n+3*math.Sqrt(n)+4.5)*1000 < float64(rateMilli)*m.elapsed.Seconds()
}

// significantlyAbove is the converse: n - 3*sqrt(n) > rate * elapsed.
func significantlyAbove(m measure, rateMilli int64) bool {
	n := float64(m.n)
	return (n-3*math.Sqrt(n))*1000 > float64(rateMilli)*m.elapsed.Seconds()
}

// window is the latest measurement and all of the latest LowerReports
// together.
func (s *sub) window() (last, all measure) {
	for _, m := range s.measures {
		all.n, all.denied, all.elapsed = min(all.n+m.n, math.MaxInt64), min(all.denied+m.denied, math.MaxInt64), all.elapsed+m.elapsed
	}
	if len(s.measures) > 0 {
		last = s.measures[len(s.measures)-1]
	}
	return last, all
}

// splitDemand is the demand the split uses (milli requests per second):
// the larger of the latest measurement and the mean over the latest
// LowerReports, unless the latest is significantly below that mean (a
// sudden drop, believed at once). One low count of noise then does not
// hand the Envoy's part to the others, to be taken back a second later.
func (s *sub) splitDemand() int64 {
	if len(s.measures) == 0 {
		return s.demand
	}
	last, all := s.window()
	mean := mulDiv(int64(min(all.n, math.MaxInt64/4)), 1_000_000, max(1, all.elapsed.Milliseconds()))
	if significantlyBelow(last, mean) {
		return s.demand
	}
	return max(s.demand, mean)
}

// wantsMore reports whether the Envoy's reports show it needs more than
// rateMilli: its latest report denied requests, or its demand is
// significantly above, over the latest measurement or the latest
// LowerReports. An Envoy whose demand is met gains nothing from a raise
// but a new bucket.
func (s *sub) wantsMore(rateMilli int64) bool {
	if len(s.measures) == 0 {
		return true
	}
	last, all := s.window()
	return last.denied > 0 || significantlyAbove(last, rateMilli) || significantlyAbove(all, rateMilli)
}

// lowerable reports whether the Envoy's reports show its demand below
// rateMilli: over its latest measurement (a sudden drop, lowered at once)
// or over the latest LowerReports together (a sustained one).
func (s *sub) lowerable(rateMilli int64) bool {
	if len(s.measures) == 0 {
		return true
	}
	last, all := s.window()
	return significantlyBelow(last, rateMilli) || significantlyBelow(all, rateMilli)
}

func (s *sub) prune(now time.Time, ttl time.Duration) {
	s.grants = slices.DeleteFunc(s.grants, func(g grant) bool { return !now.Before(g.until) })
	if s.hasCur && !now.Before(s.curSent.Add(ttl)) {
		s.hasCur = false
	}
}

type bucket struct {
	share     Amount
	unlimited bool
	// leased: the share is a replica's lease (SetLeasedShare): nothing is
	// granted that would be reserved past lease.
	leased bool
	lease  time.Time
	subs   map[EnvoyID]*sub
}

// Core splits each bucket's share among the Envoys subscribed to it and
// keeps the record of what it granted. It is pure: no I/O, no goroutine,
// no clock (every method takes now, which must not go backwards). Not
// safe for concurrent use: the driver serialises calls. The zero value
// is not usable; use NewCore.
type Core struct {
	cfg       Config
	buckets   map[BucketKey]*bucket
	closing   bool
	warmUntil time.Time
}

// WarmUp makes the core grant nothing before until; demand, shares and
// subscriptions are recorded meanwhile, and the first decision at or
// after until (a Tick) sends every assignment. A new process cannot know
// what a previous one granted before it stopped (a crash sends no TTL 0),
// so it waits until every such grant has run out: until = start + TTL +
// InFlight of the previous process.
func (c *Core) WarmUp(until time.Time) { c.warmUntil = until }

// NewCore returns a Core with cfg, or the error of cfg.Validate.
func NewCore(cfg Config) (*Core, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Core{cfg: cfg, buckets: map[BucketKey]*bucket{}}, nil
}

// Known reports whether the core has the bucket (a share was set and it
// still has subscribers or reservations).
func (c *Core) Known(k BucketKey) bool { return c.buckets[k] != nil }

// SetShare sets the region's share of a bucket (creating the bucket), or
// marks it unlimited, and re-decides its split. A lowered share is
// reached by the Envoys' reservations TTL + InFlight later at most: what
// was granted cannot be taken back before it runs out.
func (c *Core) SetShare(now time.Time, k BucketKey, share Amount, unlimited bool) []Action {
	return c.setShare(now, k, share, unlimited, false, time.Time{})
}

func (c *Core) setShare(now time.Time, k BucketKey, share Amount, unlimited, leased bool, until time.Time) []Action {
	b := c.buckets[k]
	if b == nil {
		b = &bucket{subs: map[EnvoyID]*sub{}}
		c.buckets[k] = b
	}
	b.leased, b.lease = leased, until
	share.RateMilli, share.BurstMilli = max(0, share.RateMilli), max(0, share.BurstMilli)
	b.share, b.unlimited = share, unlimited
	return c.decide(now, k, b, nil)
}

// SetLeasedShare is SetShare for a share held as a lease that ends at
// until (a replica's part of the region's share, ReplicaStore): the
// bucket grants nothing whose reservation (TTL + InFlight from its
// decision) would outlast until, extensions included, so that every
// assignment made under the lease has run out when it ends. A zero until
// grants nothing (the replica's first lease is not known yet).
func (c *Core) SetLeasedShare(now time.Time, k BucketKey, share Amount, unlimited bool, until time.Time) []Action {
	return c.setShare(now, k, share, unlimited, true, until)
}

// Demand is the sum of the split demand (milli requests per second) of
// the bucket's connected Envoys, what a replica publishes for the
// replicas' split; 0 for an unknown bucket.
func (c *Core) Demand(k BucketKey) int64 {
	var d int64
	if b := c.buckets[k]; b != nil {
		for _, s := range b.subs {
			if s.connected && !s.abandoned {
				d = satAdd(d, s.splitDemand())
			}
		}
	}
	return d
}

// Ceiling bounds what the bucket's Envoys may hold (rate and burst, as
// Reserved) at any instant from now on, as long as its share is not
// raised: the larger of the share and what is reserved at now (new
// grants keep the sum within the share, or within what it already is
// while a lowered share is not reached, and reservations only fall). A
// leased bucket whose lease no longer admits a grant made at now is
// bounded by what is reserved alone.
func (c *Core) Ceiling(now time.Time, k BucketKey) Amount {
	b := c.buckets[k]
	if b == nil {
		return Amount{}
	}
	r := c.Reserved(now, k)
	if b.leased && now.Add(c.cfg.TTL+c.cfg.InFlight).After(b.lease) {
		return r
	}
	return maxAmount(b.share, r)
}

// Report records one Envoy's usage of a bucket whose share is set
// (SetShare first; a report of an unknown bucket is ignored) and
// re-decides the bucket's split.
func (c *Core) Report(now time.Time, e EnvoyID, k BucketKey, u Usage) []Action {
	b := c.buckets[k]
	if b == nil || c.closing {
		return nil
	}
	s := b.subs[e]
	if s == nil {
		s = &sub{lastActive: now}
		b.subs[e] = s
	}
	n := u.Allowed + u.Denied
	if n < u.Allowed { // overflow
		n = math.MaxUint64
	}
	if s.abandoned && n == 0 {
		// A report that crossed the abandon: Envoy drops the bucket and
		// reports it again only with a new request.
		return nil
	}
	s.connected, s.abandoned = true, false
	if n > 0 {
		s.lastActive = now
	}
	s.accN = min(s.accN+min(n, math.MaxInt64/4), math.MaxInt64/4)
	s.accDenied = min(s.accDenied+min(u.Denied, math.MaxInt64/4), s.accN)
	s.accElapsed += u.Elapsed
	if !s.hasDemand || s.accElapsed >= c.cfg.MinElapsed {
		elapsed := max(s.accElapsed, c.cfg.MinElapsed)
		s.demand = mulDiv(int64(s.accN), 1_000_000, max(1, elapsed.Milliseconds()))
		s.measures = append(s.measures, measure{n: s.accN, denied: s.accDenied, elapsed: elapsed})
		if len(s.measures) > c.cfg.LowerReports {
			s.measures = slices.Delete(s.measures, 0, len(s.measures)-c.cfg.LowerReports)
		}
		s.hasDemand, s.accN, s.accDenied, s.accElapsed = true, 0, 0, 0
	}
	return c.decide(now, k, b, nil)
}

// Disconnect records that an Envoy's stream ended. Its grants stay
// reserved until they run out (the Envoy keeps enforcing its assignments
// until their TTL); its buckets are re-decided for the others.
func (c *Core) Disconnect(now time.Time, e EnvoyID) []Action {
	var out []Action
	for _, k := range c.sortedKeys() {
		b := c.buckets[k]
		if s := b.subs[e]; s != nil {
			s.connected, s.hasCur = false, false
			out = c.decide(now, k, b, out)
		}
	}
	return out
}

// Tick runs out expired grants, abandons idle subscriptions, extends
// assignments past half their TTL and re-decides every bucket. Call it
// more often than TTL/2 (the driver calls it every TTL/4 at most).
func (c *Core) Tick(now time.Time) []Action {
	var out []Action
	for _, k := range c.sortedKeys() {
		b := c.buckets[k]
		for _, e := range sortedEnvoys(b) {
			s := b.subs[e]
			if s.connected && !s.abandoned && !now.Before(s.lastActive.Add(c.cfg.IdleTimeout)) {
				s.abandoned, s.hasCur = true, false
				out = append(out, Action{Envoy: e, Bucket: k, Abandon: true})
			}
		}
		out = c.decide(now, k, b, out)
		if len(b.subs) == 0 {
			delete(c.buckets, k)
		}
	}
	return out
}

// Shutdown expires every live assignment at once (TTL 0) so that Envoys
// fall back to their expired_assignment_behavior instead of enforcing a
// split that nobody will update; after it the core grants nothing.
func (c *Core) Shutdown(now time.Time) []Action {
	c.closing = true
	var out []Action
	for _, k := range c.sortedKeys() {
		b := c.buckets[k]
		for _, e := range sortedEnvoys(b) {
			s := b.subs[e]
			if s.connected && !s.abandoned && s.hasCur {
				out = append(out, Action{Envoy: e, Bucket: k, Unlimited: b.unlimited, Amount: s.cur, TTL: 0})
				s.hasCur = false
			}
		}
	}
	return out
}

// Reserved is the sum over the bucket's Envoys (connected or not) of what
// they may be admitting at now, the quantity the invariant bounds.
func (c *Core) Reserved(now time.Time, k BucketKey) Amount {
	var r Amount
	if b := c.buckets[k]; b != nil {
		for _, s := range b.subs {
			s.prune(now, c.cfg.TTL)
			r = r.add(s.reserved())
		}
	}
	return r
}

// Share is the share set for a bucket.
func (c *Core) Share(k BucketKey) (Amount, bool) {
	if b := c.buckets[k]; b != nil {
		return b.share, true
	}
	return Amount{}, false
}

func (c *Core) sortedKeys() []BucketKey {
	keys := make([]BucketKey, 0, len(c.buckets))
	for k := range c.buckets {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func sortedEnvoys(b *bucket) []EnvoyID {
	ids := make([]EnvoyID, 0, len(b.subs))
	for e := range b.subs {
		ids = append(ids, e)
	}
	slices.Sort(ids)
	return ids
}

// worthRaise reports whether raising cur to target is worth a new bucket
// for an Envoy that needs more: by more than a quarter of the threshold.
func (c *Core) worthRaise(cur, target int64) bool {
	return target-cur > mulDiv(cur, c.cfg.ThresholdPermille, 4000)
}

// close reports whether a and b are within the threshold of each other.
func (c *Core) close(a, b int64) bool {
	d := a - b
	if d < 0 {
		d = -d
	}
	return d <= mulDiv(max(a, b), c.cfg.ThresholdPermille, 1000)
}

// decide re-splits bucket k and appends the actions to out. The steps,
// each of which keeps the invariant (package doc):
//  1. grants that ran out are dropped; subscriptions with no grant left
//     and no stream are forgotten;
//  2. targets: the share split max-min fair over the active Envoys'
//     demand (split);
//  3. an Envoy within the threshold of its target keeps its assignment,
//     unless the kept ones would exceed the share;
//  4. every changed assignment, and every unchanged one past half its
//     TTL (an extension), is a candidate grant; since a new grant outlives
//     every earlier one, it is checked at every future instant where the
//     reservations change (now and each expiry): where the candidates
//     would lift the sum of reservations above the share (or above what
//     it is, while a lowered share is not reached), their raises above
//     their own reservation at that instant are cut in proportion;
//  5. the candidates are sent.
func (c *Core) decide(now time.Time, k BucketKey, b *bucket, out []Action) []Action {
	ttl := c.cfg.TTL
	for e, s := range b.subs {
		s.prune(now, ttl)
		if !s.connected && len(s.grants) == 0 {
			delete(b.subs, e)
		}
	}
	if c.closing || now.Before(c.warmUntil) || b.leased && now.Add(ttl+c.cfg.InFlight).After(b.lease) {
		return out
	}
	var active []EnvoyID
	for _, e := range sortedEnvoys(b) {
		if s := b.subs[e]; s.connected && !s.abandoned {
			active = append(active, e)
		}
	}
	if len(active) == 0 {
		return out
	}
	extendAt := func(s *sub) bool { return !s.hasCur || !now.Before(s.curSent.Add(ttl/2)) }
	if b.unlimited {
		for _, e := range active {
			if s := b.subs[e]; extendAt(s) {
				s.hasCur, s.curSent, s.cur = true, now, Amount{}
				out = append(out, Action{Envoy: e, Bucket: k, Unlimited: true, TTL: ttl})
			}
		}
		return out
	}
	demands := make([]int64, len(active))
	for i, e := range active {
		demands[i] = b.subs[e].splitDemand()
	}
	splitShare := b.share
	splitShare.BurstMilli -= mulDiv(splitShare.BurstMilli, c.cfg.BurstSparePermille, 1000)
	targets := split(splitShare, demands)
	plan := slices.Clone(targets)
	// Keep the rate of an assignment within the threshold of its target,
	// of one whose target is lower while the Envoy's reports do not show
	// its demand significantly below it (noise; only while the target is
	// the Envoy's demand with its part of the spare: a target cut to the
	// fair part because others need more is followed), and of one whose target
	// is higher while its reports do not show that it needs more; with
	// its burst, unless the target's is more than twice it (a burst cut
	// to fit earlier: then a burst-only raise, sent only if it fits
	// whole, below). Unless the kept ones would not fit in the share:
	// then the noise ones go first, then all.
	burstOnly := make([]bool, len(active))
	keep := func(noise bool) bool {
		var kept Amount
		sticky := false
		for i, e := range active {
			s := b.subs[e]
			plan[i], burstOnly[i] = targets[i], false
			up := targets[i].RateMilli > s.cur.RateMilli
			if s.hasCur && (!up && c.close(s.cur.RateMilli, targets[i].RateMilli) ||
				up && (!c.worthRaise(s.cur.RateMilli, targets[i].RateMilli) || !s.wantsMore(s.cur.RateMilli)) ||
				noise && !up && !s.lowerable(s.cur.RateMilli) && demands[i] <= targets[i].RateMilli) {
				plan[i], sticky = s.cur, true
				// The burst the target gives at the rate kept.
				want := targets[i].BurstMilli
				if up {
					want = mulDiv(want, s.cur.RateMilli, targets[i].RateMilli)
				}
				if want > 2*s.cur.BurstMilli {
					plan[i].BurstMilli, burstOnly[i] = want, true
				}
			}
			if s.hasCur {
				// A raise is cut below to what fits; counted here at
				// what the Envoy has.
				kept = kept.add(Amount{min(plan[i].RateMilli, s.cur.RateMilli), min(plan[i].BurstMilli, s.cur.BurstMilli)})
			} else {
				kept = kept.add(plan[i])
			}
		}
		return !sticky || kept.fits(b.share)
	}
	if !keep(true) && !keep(false) {
		copy(plan, targets)
		clear(burstOnly)
	}
	// Candidates: every active Envoy whose assignment changes or is due
	// for extension, at its plan.
	type cand struct {
		s     *sub
		e     EnvoyID
		bo    bool   // a burst-only raise
		plan  Amount // wire(plan)
		g     Amount // plan, its raises cut
		fresh bool   // starts a new Envoy bucket (not an extension)
	}
	var cands []cand
	for i, e := range active {
		s := b.subs[e]
		p := wire(plan[i])
		if s.hasCur && p == s.cur && !extendAt(s) {
			continue
		}
		cands = append(cands, cand{s: s, e: e, bo: burstOnly[i], plan: p, g: p})
	}
	if len(cands) == 0 {
		return out
	}
	// Every candidate's grant outlives every grant already made. At each
	// instant t from now on (now and every expiry: between them the
	// reservations only fall) the Envoy's rate is max(R(t), g) and its
	// burst R(t) + g for a new bucket, R(t) for an extension while the
	// grant it extends has not run out and R(t) + g after. At no such
	// instant may the sum rise above the share (or above what it already
	// is, when a lowered share has not been reached yet): at each instant
	// the raises are cut, in proportion, to fit. Cutting only lowers sums,
	// so the instants already checked stay within their bounds. Rates
	// first; then, since a cut makes an extension a new bucket, the
	// bursts are checked again from the start until no extension is cut.
	times := []time.Time{now}
	for _, s := range b.subs {
		for _, g := range s.grants {
			times = append(times, g.until)
		}
	}
	slices.SortFunc(times, func(x, y time.Time) int { return x.Compare(y) })
	times = slices.Compact(times)
	sums := make([]Amount, len(times))
	for j, t := range times {
		for _, s := range b.subs {
			sums[j] = sums[j].add(s.reservedAt(t))
		}
	}
	for j, t := range times {
		sum := sums[j]
		budget := max(b.share.RateMilli, sum.RateMilli)
		var raise int64
		for i := range cands {
			raise += max(0, cands[i].g.RateMilli-cands[i].s.reservedAt(t).RateMilli)
		}
		if sum.RateMilli+raise <= budget {
			continue
		}
		room := budget - sum.RateMilli
		for i := range cands {
			r := cands[i].s.reservedAt(t).RateMilli
			if x := cands[i].g.RateMilli - r; x > 0 {
				cands[i].g.RateMilli = r + mulDiv(x, room, raise)
			}
		}
	}
	// A raise cut to no more than a quarter of the threshold over what
	// the Envoy has is not worth a new bucket: it keeps its assignment
	// (extended when due).
	{
		kept := cands[:0]
		for _, cd := range cands {
			if s := cd.s; s.hasCur && cd.plan.RateMilli > s.cur.RateMilli && cd.g.RateMilli >= s.cur.RateMilli && !c.worthRaise(s.cur.RateMilli, cd.g.RateMilli) {
				if !extendAt(s) {
					continue
				}
				cd.g, cd.plan, cd.bo = s.cur, s.cur, false
			}
			kept = append(kept, cd)
		}
		cands = kept
	}
	// An extension reaches the Envoy before the assignment it extends
	// expires there only if sent InFlight before that.
	classify := func(cd *cand) {
		cd.fresh = !(cd.s.hasCur && wire(cd.g) == cd.s.cur && now.Add(c.cfg.InFlight).Before(cd.s.curSent.Add(ttl)))
	}
	for i := range cands {
		classify(&cands[i])
	}
	// A burst-only raise is worth a new bucket only if it fits whole
	// beside the other new buckets (room is least at now: reservations
	// only fall later); otherwise the assignment is kept (and extended
	// when due). Bursts cut to fit would be raised again as room is
	// freed, each time a new bucket.
	room := max(b.share.BurstMilli, sums[0].BurstMilli) - sums[0].BurstMilli
	for i := range cands {
		if cands[i].fresh && !cands[i].bo {
			room -= cands[i].g.BurstMilli
		}
	}
	kept := cands[:0]
	for _, cd := range cands {
		if cd.bo && cd.g.RateMilli == cd.s.cur.RateMilli {
			// (A rate cut below the Envoy's makes it a lowering, sent
			// as cut.)
			if cd.g.BurstMilli <= room {
				room -= cd.g.BurstMilli
			} else if extendAt(cd.s) {
				cd.g, cd.plan = cd.s.cur, cd.s.cur
				classify(&cd)
			} else {
				continue
			}
		}
		kept = append(kept, cd)
	}
	cands = kept
	if len(cands) == 0 {
		return out
	}
	rated := make([]Amount, len(cands))
	for i := range cands {
		rated[i] = cands[i].g
	}
	for again := true; again; {
		again = false
		for i := range cands {
			cands[i].g = rated[i]
		}
		for j, t := range times {
			sum := sums[j].BurstMilli
			budget := max(b.share.BurstMilli, sum)
			var raise int64
			adds := func(cd *cand) bool {
				return cd.fresh || !t.Before(cd.s.grants[len(cd.s.grants)-1].until)
			}
			for i := range cands {
				if adds(&cands[i]) {
					raise = satAdd(raise, cands[i].g.BurstMilli)
				}
			}
			if satAdd(sum, raise) <= budget {
				continue
			}
			room := budget - sum
			for i := range cands {
				if cd := &cands[i]; adds(cd) {
					cd.g.BurstMilli = mulDiv(cd.g.BurstMilli, room, raise)
					if !cd.fresh && cd.g.BurstMilli < cd.plan.BurstMilli {
						cd.fresh, again = true, true
					}
				}
			}
			if again {
				break
			}
		}
	}
	for _, cd := range cands {
		s, next := cd.s, wire(cd.g)
		if s.hasCur && next == s.cur && !extendAt(s) {
			continue
		}
		if s.hasCur && next == (Amount{}) && cd.g.RateMilli > 0 && cd.plan.BurstMilli >= 1000 {
			// The burst room is short for a new bucket: the Envoy keeps
			// the assignment it has (still reserved) until room is freed.
			continue
		}
		if !cd.fresh {
			s.grants[len(s.grants)-1].until = now.Add(ttl + c.cfg.InFlight)
		} else {
			s.grants = append(s.grants, grant{amt: next, until: now.Add(ttl + c.cfg.InFlight)})
		}
		s.hasCur, s.cur, s.curSent = true, next, now
		out = append(out, Action{Envoy: cd.e, Bucket: k, Amount: next, TTL: ttl})
	}
	return out
}

// wire rounds an amount down to what the token bucket on the wire
// carries: whole tokens of burst, and nothing at all (DENY_ALL) below one
// token or a zero rate.
func wire(a Amount) Amount {
	a.BurstMilli -= a.BurstMilli % 1000
	if a.RateMilli <= 0 || a.BurstMilli < 1000 {
		return Amount{}
	}
	return a
}

// split divides share among Envoys of the given demands (milli requests
// per second): the rate max-min fair (water-filling: nobody gets more
// than it asks while another gets less than it asks), and what all demand
// leaves over split equally, so every Envoy has room to grow until its
// next report; the burst gives every Envoy one request first (when the
// burst has that many) and the rest in proportion to the rates. Sums never
// exceed the share (every division rounds down). Pure.
func split(share Amount, demands []int64) []Amount {
	n := int64(len(demands))
	out := make([]Amount, n)
	if n == 0 {
		return out
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return int(sign(demands[a] - demands[b])) })
	left := share.RateMilli
	for j, i := range order {
		fair := left / (n - int64(j))
		d := max(0, demands[i])
		if d <= fair {
			out[i].RateMilli = d
			left -= d
			continue
		}
		for _, i2 := range order[j:] {
			out[i2].RateMilli = fair
			left -= fair
		}
		break
	}
	if each := left / n; each > 0 {
		for i := range out {
			out[i].RateMilli += each
		}
	}
	floor := min(1000, share.BurstMilli/n)
	rest := share.BurstMilli - floor*n
	var rateSum int64
	for _, a := range out {
		rateSum += a.RateMilli
	}
	for i := range out {
		out[i].BurstMilli = floor
		if rateSum > 0 {
			out[i].BurstMilli += mulDiv(rest, out[i].RateMilli, rateSum)
		} else {
			out[i].BurstMilli += rest / n
		}
	}
	return out
}

func sign(x int64) int64 {
	switch {
	case x < 0:
		return -1
	case x > 0:
		return 1
	}
	return 0
}
