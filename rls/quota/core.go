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
	// ThresholdPermille: an assignment is re-sent when its target moves
	// by more than this fraction (in thousandths) of the larger of the old
	// and the new value, in rate or burst; otherwise it is kept (and
	// extended). Default 100 (10 %).
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
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{TTL: 5 * time.Second, InFlight: time.Second, ThresholdPermille: 100, IdleTimeout: time.Minute, MinElapsed: 500 * time.Millisecond}
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

// grant is one assignment sent, reserved until until.
type grant struct {
	amt   Amount
	until time.Time
}

// sub is one Envoy's subscription to one bucket.
type sub struct {
	connected  bool
	abandoned  bool
	demand     int64 // milli requests per second, over the last MinElapsed or more
	hasDemand  bool
	accN       uint64        // requests reported since demand was last set
	accElapsed time.Duration // time those reports cover
	lastActive time.Time
	hasCur     bool // cur was sent and has not expired on the Envoy
	cur        Amount
	curSent    time.Time
	grants     []grant
}

// reserved is what the Envoy may be admitting at now: the largest of its
// grants that have not run out, component by component.
func (s *sub) reserved() Amount {
	var r Amount
	for _, g := range s.grants {
		r = maxAmount(r, g.amt)
	}
	return r
}

// reservedAt is what the Envoy may be admitting at t >= now by the grants
// made so far: the largest of those that have not run out at t.
func (s *sub) reservedAt(t time.Time) Amount {
	var r Amount
	for _, g := range s.grants {
		if t.Before(g.until) {
			r = maxAmount(r, g.amt)
		}
	}
	return r
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
	subs      map[EnvoyID]*sub
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
	b := c.buckets[k]
	if b == nil {
		b = &bucket{subs: map[EnvoyID]*sub{}}
		c.buckets[k] = b
	}
	share.RateMilli, share.BurstMilli = max(0, share.RateMilli), max(0, share.BurstMilli)
	b.share, b.unlimited = share, unlimited
	return c.decide(now, k, b, nil)
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
	s.accElapsed += u.Elapsed
	if !s.hasDemand || s.accElapsed >= c.cfg.MinElapsed {
		elapsed := max(s.accElapsed, c.cfg.MinElapsed)
		s.demand = mulDiv(int64(s.accN), 1_000_000, max(1, elapsed.Milliseconds()))
		s.hasDemand, s.accN, s.accElapsed = true, 0, 0
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

// near reports whether target is within the threshold of cur.
func (c *Core) near(cur, target Amount) bool {
	close := func(a, b int64) bool {
		d := a - b
		if d < 0 {
			d = -d
		}
		return d <= mulDiv(max(a, b), c.cfg.ThresholdPermille, 1000)
	}
	return close(cur.RateMilli, target.RateMilli) && close(cur.BurstMilli, target.BurstMilli)
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
	if c.closing || now.Before(c.warmUntil) {
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
		demands[i] = b.subs[e].demand
	}
	targets := split(b.share, demands)
	plan := slices.Clone(targets)
	var kept Amount
	sticky := false
	for i, e := range active {
		if s := b.subs[e]; s.hasCur && c.near(s.cur, targets[i]) {
			plan[i], sticky = s.cur, true
		}
		kept = kept.add(plan[i])
	}
	if sticky && !kept.fits(b.share) {
		copy(plan, targets)
	}
	// Candidates: every active Envoy whose assignment changes or is due
	// for extension, at its plan.
	type cand struct {
		s *sub
		e EnvoyID
		g Amount
	}
	var cands []cand
	for i, e := range active {
		s := b.subs[e]
		p := wire(plan[i])
		if s.hasCur && p == s.cur && !extendAt(s) {
			continue
		}
		cands = append(cands, cand{s: s, e: e, g: p})
	}
	if len(cands) == 0 {
		return out
	}
	// Every candidate's grant outlives every grant already made, so at
	// each instant t from now on the Envoy reserves max(R(t), g). At no
	// such instant may the sum rise above the share (or above what it
	// already is, when a lowered share has not been reached yet): at each
	// breakpoint (now and every expiry) the raises above R(t) are cut, in
	// proportion, to fit. Cutting only lowers sums, so the instants
	// already checked stay within their bounds.
	times := []time.Time{now}
	for _, s := range b.subs {
		for _, g := range s.grants {
			times = append(times, g.until)
		}
	}
	slices.SortFunc(times, func(x, y time.Time) int { return x.Compare(y) })
	times = slices.Compact(times)
	rate := func(a *Amount) *int64 { return &a.RateMilli }
	burst := func(a *Amount) *int64 { return &a.BurstMilli }
	for _, t := range times {
		var sum Amount
		for _, s := range b.subs {
			sum = sum.add(s.reservedAt(t))
		}
		for _, field := range []func(*Amount) *int64{rate, burst} {
			budget := max(*field(&b.share), *field(&sum))
			var raise int64
			for i := range cands {
				r := cands[i].s.reservedAt(t)
				raise += max(0, *field(&cands[i].g)-*field(&r))
			}
			if *field(&sum)+raise <= budget {
				continue
			}
			room := budget - *field(&sum)
			for i := range cands {
				r := cands[i].s.reservedAt(t)
				if x := *field(&cands[i].g) - *field(&r); x > 0 {
					*field(&cands[i].g) = *field(&r) + mulDiv(x, room, raise)
				}
			}
		}
	}
	for _, cd := range cands {
		s, next := cd.s, wire(cd.g)
		if s.hasCur && next == s.cur && !extendAt(s) {
			continue
		}
		s.hasCur, s.cur, s.curSent = true, next, now
		s.grants = append(s.grants, grant{amt: next, until: now.Add(ttl + c.cfg.InFlight)})
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
