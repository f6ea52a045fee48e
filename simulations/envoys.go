package simulations

// The RLQS tier (scenario field envoys): a region with Envoys serves its
// traffic through N simulated Envoy proxies and the production rate limit
// quota service (rls/quota.Server, driven through quota.Conn with the
// region's virtual clock and its own Tick), instead of gateways.
//
// What is modelled, as the README's RLQS section documents the
// recommended Envoy configuration (examples/envoy/rlqs.yaml):
//
//   - Every Envoy keeps one bucket per (key, policy), bucket_id
//     {"policy": <id>, "key": <key>}, matched by the server through an
//     RLS configuration with one rule per policy (rate_limit: {policy: id}),
//     so the server takes the policy's rate and burst and the region's
//     share of it exactly as `quotient rls` does.
//   - A new bucket follows no_assignment_behavior: a local token bucket of
//     5 tokens filled by 1 per second, and is reported at once; after that
//     every Envoy reports all its buckets every envoy_report_s (the Envoys'
//     phases staggered evenly over the interval): allowed, denied and
//     time_elapsed since the bucket's previous report.
//   - A TokenBucket assignment replaces the bucket with a full one of
//     max_tokens, filled continuously at tokens_per_fill / fill_interval
//     (Envoy's token bucket); the same strategy again only extends its TTL.
//     ALLOW_ALL and DENY_ALL admit or refuse everything. An expired
//     assignment (or TTL 0) falls back to expired_assignment_behavior,
//     the same 5-token, 1/s bucket; an AbandonAction drops the bucket.
//   - A request takes one token; a region's requests are spread evenly
//     over its Envoys (each request picks one uniformly, from its own
//     seeded generator).
//   - rlqs_replicas RLQS servers under the region (default 1), Envoy j
//     streaming to server j mod N; with more than one, the servers split
//     the region's share by demand through claims (quota.ClaimTable on
//     the region's clock, the in-memory twin of quota.RedisClaims), every
//     server ticking at the same instants in order. The store is not
//     failed by store_down (its share reads and usage writes are).
//   - Messages between an Envoy and the server take no time (one region;
//     the server's InFlight bound, 1 s, is far above it).
//   - The server's usage flush (limiter.UsageSink) adds to the region's
//     usage as the gateways' flushes do, so the coordinator sees the RLQS
//     traffic; its share records are the ones the coordinator wrote
//     (read every ShareRefresh, with their TTL), and while the region's
//     store is down (store_down) share reads and usage writes fail as
//     Redis calls would. The server ticks every 250 ms of the region's
//     clock, as Server.Run does, aligned so that its 1 s usage flushes
//     fall on whole seconds (an epoch boundary sees every report before
//     it).
//
// Decisions are scored as gateway decisions are (the Recorder).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rls"
	"github.com/quotientlabs/quotient/rls/quota"
)

// EnvoyDomain is the RLS domain of the simulated Envoys' buckets.
const EnvoyDomain = "quotient-sim"

// Envoy settings of the recommended configuration (examples/envoy/rlqs.yaml).
const (
	envoyFallbackTokens = 5   // no_assignment / expired fallback: max_tokens
	envoyFallbackRate   = 1.0 // tokens per second
	serverTickNs        = int64(250 * time.Millisecond)
)

// envoyRulesConfig is the RLS configuration of the tier: one rule per
// token_bucket policy, bucket {"policy": id, "key": <key>}.
func envoyRulesConfig(pols []*limiter.Policy) (*rls.Config, error) {
	var b strings.Builder
	b.WriteString("domain: " + EnvoyDomain + "\ndescriptors:\n")
	for _, p := range pols {
		if p.Algorithm != limiter.TokenBucket {
			continue
		}
		fmt.Fprintf(&b, "  - key: policy\n    value: %q\n    descriptors:\n      - key: key\n        rate_limit: {policy: %q}\n", p.ID, p.ID)
	}
	return rls.Parse([]rls.File{{Name: "envoys.yaml", Data: []byte(b.String())}}, rls.ParseOptions{})
}

// simClock is a region's clock as its RLQS server reads it; the driver
// sets now before every call.
type simClock struct{ now time.Time }

func (c *simClock) Now() time.Time { return c.now }

// envoyBucket is one bucket of one Envoy.
type envoyBucket struct {
	id       map[string]string
	strategy *typev3.RateLimitStrategy // the assignment in force; nil: fallback
	expires  int64                     // true ns at which the assignment lapses
	blanket  typev3.RateLimitStrategy_BlanketRule
	tokens   float64
	max      float64
	rate     float64 // tokens per second
	last     int64   // true ns of the last refill
	allowed  uint64
	denied   uint64
	reported int64 // true ns of the bucket's last report (or creation)
	// replaced: the token buckets of earlier assignments that a new
	// strategy replaced before they expired. Their bursts count as held
	// until then (what the Envoy spent of them is not known to the
	// server), so that held counts the full bucket every new assignment
	// grants.
	replaced []heldBurst
}

// heldBurst is the burst of a replaced assignment, held until expires
// (true ns).
type heldBurst struct {
	burstMilli int64
	expires    int64
}

// retire records the assignment in force as replaced at at, if it has
// not expired.
func (b *envoyBucket) retire(at int64) {
	if h := b.held(at); h.BurstMilli > 0 {
		b.replaced = append(b.replaced, heldBurst{burstMilli: h.BurstMilli, expires: b.expires})
	}
}

func (b *envoyBucket) fallback(at int64) {
	b.strategy, b.blanket = nil, 0
	b.tokens, b.max, b.rate, b.last = envoyFallbackTokens, envoyFallbackTokens, envoyFallbackRate, at
}

// admit decides one request at true time at.
func (b *envoyBucket) admit(at int64) bool {
	if b.strategy != nil && at >= b.expires {
		b.fallback(at) // expired_assignment_behavior
	}
	if b.strategy != nil && b.strategy.GetTokenBucket() == nil {
		return b.blanket == typev3.RateLimitStrategy_ALLOW_ALL
	}
	b.tokens = min(b.max, b.tokens+b.rate*float64(at-b.last)/float64(nsPerSec))
	b.last = at
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

// assign applies one assignment received at true time at.
func (b *envoyBucket) assign(at int64, s *typev3.RateLimitStrategy, ttl time.Duration) {
	if ttl <= 0 {
		b.retire(at)
		b.fallback(at)
		return
	}
	if b.strategy != nil && at < b.expires && proto.Equal(b.strategy, s) {
		b.expires = at + int64(ttl) // an extension: the bucket goes on
		return
	}
	b.retire(at)
	b.strategy, b.expires = s, at+int64(ttl)
	if tb := s.GetTokenBucket(); tb != nil {
		a, _ := quota.AmountOf(s)
		b.blanket = 0
		b.max = float64(tb.GetMaxTokens())
		b.tokens, b.rate, b.last = b.max, float64(a.RateMilli)/1000, at
		return
	}
	b.blanket = s.GetBlanketRule()
	if s.GetRequestsPerTimeUnit() != nil { // never sent by the server
		b.blanket = typev3.RateLimitStrategy_DENY_ALL
	}
}

// held is what the bucket's assignment lets the Envoy admit at at (zero
// without one, or on its fallback).
func (b *envoyBucket) held(at int64) quota.Amount {
	if b.strategy == nil || at >= b.expires || b.strategy.GetTokenBucket() == nil {
		return quota.Amount{}
	}
	a, _ := quota.AmountOf(b.strategy)
	return a
}

// heldWithReplaced is held plus the bursts of the replaced assignments
// that have not expired at at: what rls/quota's invariant bounds, since
// every new strategy is a full bucket.
func (b *envoyBucket) heldWithReplaced(at int64) quota.Amount {
	a := b.held(at)
	b.replaced = slices.DeleteFunc(b.replaced, func(h heldBurst) bool { return at >= h.expires })
	for _, h := range b.replaced {
		a.BurstMilli += h.burstMilli
	}
	return a
}

// simEnvoy is one Envoy proxy: its buckets by tracked key and its stream.
type simEnvoy struct {
	conn      *quota.Conn
	buckets   map[int]*envoyBucket
	reports   int64 // messages sent to the server
	responses int64 // messages received from it
	since     int64 // true ns at which it last went from no bucket to one
	activeNs  int64 // time it held a bucket, up to since
}

// envoyRegion is the RLQS tier of one region: its server and Envoys.
// Not safe for concurrent use.
type envoyRegion struct {
	ctx context.Context
	// srvs are the region's RLQS replicas; Envoy j streams to replica
	// j mod len(srvs). With more than one, they split the region's share
	// by demand through claims (quota.ClaimTable on the region's clock,
	// as quota.RedisClaims on the region's Redis).
	srvs    []*quota.Server
	claims  *quota.ClaimTable // the replicas' claims (used with several)
	clock   *simClock
	envoys  []*simEnvoy
	pick    *rand.Rand
	startNs int64 // Unix ns of true t=0 on this region's clock
	atNs    int64 // true time of the current call
	// bucketOf maps a bucket's canonical key to its tracked key.
	bucketOf map[string]int
	idOf     func(k int) map[string]string
}

// envoyRegionConfig is what an envoyRegion is built from.
type envoyRegionConfig struct {
	n        int
	replicas int // RLQS servers (rlqs_replicas)
	regions  int
	epoch    time.Duration
	rules    *rls.Config
	policy   func(id string) *limiter.Policy
	shares   quota.ShareSource
	usage    limiter.UsageSink
	rng      *rand.Rand
	startNs  int64 // region clock of true t=0, Unix ns
	bootNs   int64 // true time the server starts (<= 0)
	idOf     func(k int) map[string]string
}

func newEnvoyRegion(ctx context.Context, c envoyRegionConfig) (*envoyRegion, error) {
	r := &envoyRegion{ctx: ctx, clock: &simClock{now: time.Unix(0, c.startNs+c.bootNs).UTC()}, pick: c.rng,
		startNs: c.startNs, atNs: c.bootNs, bucketOf: map[string]int{}, idOf: c.idOf}
	table := &quota.ClaimTable{Clock: r.clock}
	r.claims = table
	for i := range max(1, c.replicas) {
		sc := quota.ServerConfig{
			Config:     func() *rls.Config { return c.rules },
			Policy:     c.policy,
			Shares:     c.shares,
			Usage:      c.usage,
			Regions:    func() int { return c.regions },
			UsageEpoch: c.epoch,
			Clock:      r.clock,
			Logger:     slog.New(slog.DiscardHandler),
		}
		if c.replicas > 1 {
			sc.Claims = table.Replica(fmt.Sprintf("replica-%d", i))
		}
		srv, err := quota.NewServer(sc)
		if err != nil {
			return nil, err
		}
		r.srvs = append(r.srvs, srv)
	}
	for j := range c.n {
		conn, err := r.srvs[j%len(r.srvs)].Open()
		if err != nil {
			return nil, err
		}
		r.envoys = append(r.envoys, &simEnvoy{conn: conn, buckets: map[int]*envoyBucket{}})
	}
	return r, nil
}

func (r *envoyRegion) at(at int64) {
	r.atNs = at
	r.clock.now = time.Unix(0, r.startNs+at).UTC()
}

// request decides one request of tracked key k arriving at Envoy j (-1:
// drawn uniformly) at true time at.
func (r *envoyRegion) request(at int64, j, k int) (bool, error) {
	if j < 0 {
		j = r.pick.IntN(len(r.envoys))
	}
	r.at(at)
	env := r.envoys[j]
	b := env.buckets[k]
	fresh := b == nil
	if fresh {
		b = &envoyBucket{id: r.idOf(k), reported: at}
		b.fallback(at) // no_assignment_behavior
		if len(env.buckets) == 0 {
			env.since = at
		}
		env.buckets[k] = b
		r.bucketOf[rls.BucketKey(EnvoyDomain, b.id)] = k
	}
	ok := b.admit(at)
	if ok {
		b.allowed++
	} else {
		b.denied++
	}
	if fresh { // Envoy reports a new bucket at once
		return ok, r.send(at, env, []int{k})
	}
	return ok, nil
}

// report sends Envoy j's periodic report of every bucket it holds.
func (r *envoyRegion) report(at int64, j int) error {
	r.at(at)
	env := r.envoys[j]
	keys := slices.Sorted(maps.Keys(env.buckets))
	if len(keys) == 0 {
		return nil
	}
	return r.send(at, env, keys)
}

func (r *envoyRegion) send(at int64, env *simEnvoy, keys []int) error {
	msg := &rlqsv3.RateLimitQuotaUsageReports{Domain: EnvoyDomain}
	for _, k := range keys {
		b := env.buckets[k]
		msg.BucketQuotaUsages = append(msg.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: maps.Clone(b.id)},
			TimeElapsed:        durationpb.New(time.Duration(at - b.reported)),
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied, b.reported = 0, 0, at
	}
	env.reports++
	if err := env.conn.Receive(r.ctx, msg); err != nil {
		return fmt.Errorf("rlqs server refused a report: %w", err)
	}
	r.drain(at)
	return nil
}

// tick runs the server's Tick and delivers what it decided.
func (r *envoyRegion) tick(at int64) {
	r.at(at)
	for _, srv := range r.srvs {
		srv.Tick(r.ctx, r.clock.now)
	}
	r.drain(at)
}

// drain delivers every pending response to its Envoy at once.
func (r *envoyRegion) drain(at int64) {
	for _, env := range r.envoys {
		resp := env.conn.Take()
		if resp == nil {
			continue
		}
		env.responses++
		for _, ba := range resp.GetBucketAction() {
			k, ok := r.bucketOf[rls.BucketKey(EnvoyDomain, ba.GetBucketId().GetBucket())]
			b := env.buckets[k]
			if !ok || b == nil {
				continue // Envoy ignores actions for buckets it does not hold
			}
			if ba.GetAbandonAction() != nil {
				delete(env.buckets, k)
				if len(env.buckets) == 0 {
					env.activeNs += at - env.since
				}
				continue
			}
			qa := ba.GetQuotaAssignmentAction()
			b.assign(at, qa.GetRateLimitStrategy(), qa.GetAssignmentTimeToLive().AsDuration())
		}
	}
}

// held sums, over the Envoys, what their assignments of tracked key k let
// them admit at true time at, the bursts of replaced assignments that have
// not expired included: the quantity rls/quota's invariant bounds.
func (r *envoyRegion) held(at int64, k int) quota.Amount {
	var sum quota.Amount
	for _, env := range r.envoys {
		if b := env.buckets[k]; b != nil {
			h := b.heldWithReplaced(at)
			sum.RateMilli += h.RateMilli
			sum.BurstMilli += h.BurstMilli
		}
	}
	return sum
}

// errStoreDown is what the tier's Redis adapters return while the
// region's store is down.
var errStoreDown = errors.New("simulations: the region's store is down (store_down)")

// tierShares is the region's share records as the RLQS server reads them
// (quota.ShareSource): what the coordinator wrote, with its TTL.
type tierShares struct {
	t *envoyTier
	r int
}

var _ quota.ShareSource = (*tierShares)(nil)

func (s *tierShares) ReadShares(_ context.Context, qs []quota.ShareQuery) ([]quota.ShareRecord, error) {
	reg := s.t.regions[s.r]
	if s.t.storeDown(s.r, reg.clock.now) {
		return nil, errStoreDown
	}
	out := make([]quota.ShareRecord, len(qs))
	for i, q := range qs {
		k, ok := s.t.bySubject[q.Subject.Key()+"\x00"+q.PolicyID]
		if !ok {
			continue
		}
		if rec, ok := s.t.shares[s.r][k]; ok && reg.atNs < rec.expireNs {
			out[i] = quota.ShareRecord{Amount: quota.Amount{RateMilli: rec.rate, BurstMilli: rec.burst}, Found: true}
		}
	}
	return out, nil
}

// tierUsage adds the RLQS server's usage flushes to the region's usage
// (limiter.UsageSink), as the gateways' flushes land in Redis.
type tierUsage struct {
	t *envoyTier
	r int
}

var _ limiter.UsageSink = (*tierUsage)(nil)

func (u *tierUsage) WriteUsage(_ context.Context, counts []limiter.UsageCount) ([]limiter.UsageCount, error) {
	if u.t.storeDown(u.r, u.t.regions[u.r].clock.now) {
		return counts, errStoreDown
	}
	for _, c := range counts {
		if k, ok := u.t.bySubject[c.Subject.Key()+"\x00"+c.PolicyID]; ok {
			u.t.addUsage(u.r, k, c.Demand, c.Admitted)
		}
	}
	return nil, nil
}

type tierShare struct {
	rate, burst int64 // milli units
	expireNs    int64 // true time
}

// envoyTimer is one periodic event of the tier: a server tick (envoy -1)
// or an Envoy's report.
type envoyTimer struct {
	region, envoy int
	everyNs       int64
}

// envoyTier is the RLQS tier of a run: per region (nil: gateways) its
// server and Envoys.
type envoyTier struct {
	regions   []*envoyRegion
	timers    []envoyTimer
	bySubject map[string]int // descriptor subject key "\x00" policy -> tracked key
	shares    []map[int]tierShare
	storeDown func(r int, now time.Time) bool
	addUsage  func(r, k int, demand, admitted int64)
	// observe, when set (tests), runs after every event of the tier and
	// every request through it, with the region it touched.
	observe func(at int64, r int)
}

// newEnvoyTier builds the tier of e's scenario, or nil without envoys,
// and schedules its timers.
func (e *engine) newEnvoyTier() error {
	sc := e.sc
	if !slices.ContainsFunc(sc.Envoys, func(n int) bool { return n > 0 }) {
		return nil
	}
	rules, err := envoyRulesConfig(sc.Policies)
	if err != nil {
		return fmt.Errorf("%w: envoys: %v", ErrInternal, err)
	}
	policies := map[string]*limiter.Policy{}
	for _, p := range sc.Policies {
		policies[p.ID] = p
	}
	t := &envoyTier{regions: make([]*envoyRegion, len(sc.Regions)), bySubject: map[string]int{},
		shares: make([]map[int]tierShare, len(sc.Regions))}
	t.storeDown = func(r int, now time.Time) bool { return e.regions[r].info.StoreDown(now) }
	t.addUsage = func(r, k int, demand, admitted int64) {
		rs := e.regions[r]
		if rs.usageDemand[k] == 0 {
			rs.touched = append(rs.touched, k)
		}
		rs.usageDemand[k] += demand
		rs.usageAdmit[k] += admitted
	}
	idOf := func(k int) map[string]string {
		return map[string]string{"policy": e.rec.keys[k].policy.ID, "key": e.subjects[k].Value}
	}
	for k := range e.rec.keys {
		if e.rec.keys[k].policy.Algorithm != limiter.TokenBucket {
			continue
		}
		b, ok := rules.LookupBucket(EnvoyDomain, idOf(k))
		if !ok {
			return fmt.Errorf("%w: envoys: bucket %v matches no rule", ErrInternal, idOf(k))
		}
		t.bySubject[b.Subject.Key()+"\x00"+e.rec.keys[k].policy.ID] = k
	}
	bootNs := int64(0)
	if !e.opt.ColdStart {
		bootNs = -HeadStartEpochs * sc.EpochSec * nsPerSec
	}
	reportNs := secNs(sc.EnvoyReportSec)
	for r, n := range sc.Envoys {
		if n == 0 {
			continue
		}
		t.shares[r] = map[int]tierShare{}
		reg, err := newEnvoyRegion(e.ctx, envoyRegionConfig{
			n: n, replicas: sc.RLQSReplicas, regions: len(sc.Regions), epoch: time.Duration(sc.EpochSec * nsPerSec), rules: rules,
			policy: func(id string) *limiter.Policy { return policies[id] },
			shares: &tierShares{t: t, r: r}, usage: &tierUsage{t: t, r: r},
			rng:     rng(sc.Seed, "envoys."+sc.Regions[r]),
			startNs: e.startNs + e.regions[r].skewNs, bootNs: bootNs, idOf: idOf,
		})
		if err != nil {
			return fmt.Errorf("%w: envoys of %s: %v", ErrInternal, sc.Regions[r], err)
		}
		t.regions[r] = reg
		// Server ticks on whole seconds of the region's clock, then every
		// 250 ms.
		m := (e.startNs + e.regions[r].skewNs) % nsPerSec
		if m < 0 {
			m += nsPerSec
		}
		e.tierTimer(t, envoyTimer{region: r, envoy: -1, everyNs: serverTickNs}, (nsPerSec-m)%nsPerSec)
		for j := range n {
			e.tierTimer(t, envoyTimer{region: r, envoy: j, everyNs: reportNs}, int64(j+1)*reportNs/int64(n+1))
		}
	}
	e.tier = t
	return nil
}

func (e *engine) tierTimer(t *envoyTier, tm envoyTimer, first int64) {
	t.timers = append(t.timers, tm)
	if first < e.endNs {
		e.events.push(first, evEnvoy, len(t.timers)-1)
	}
}

// envoyEvent runs tier timer i at true time at and schedules its next run.
func (e *engine) envoyEvent(at int64, i int) {
	tm := e.tier.timers[i]
	reg := e.tier.regions[tm.region]
	if tm.envoy < 0 {
		reg.tick(at)
	} else if err := reg.report(at, tm.envoy); err != nil && e.err == nil {
		e.err = fmt.Errorf("%w: envoys of %s: %v", ErrInternal, e.sc.Regions[tm.region], err)
	}
	if next := at + tm.everyNs; next < e.endNs {
		e.events.push(next, evEnvoy, i)
	}
	if e.tier.observe != nil {
		e.tier.observe(at, tm.region)
	}
}

// envoyDecide serves a request of region through its Envoys, when the
// region has them, and records it; it reports false for a gateway region.
func (e *engine) envoyDecide(at int64, region int, es *entryState, key int) bool {
	if e.tier == nil || e.tier.regions[region] == nil {
		return false
	}
	k := es.keys[key].tracked[0]
	ok, err := e.tier.regions[region].request(at, -1, k)
	if err != nil {
		if e.err == nil {
			e.err = fmt.Errorf("%w: envoys of %s: %v", ErrInternal, e.sc.Regions[region], err)
		}
		return true
	}
	e.rec.Decision()
	e.rec.Record(k, region, at/nsPerSec, 1, ok)
	if e.tier.observe != nil {
		e.tier.observe(at, region)
	}
	return true
}

// envoyShare records a share update of region r's coordinator for the
// tier's share reads.
func (e *engine) envoyShare(at int64, r int, u ShareUpdate) {
	if e.tier == nil || e.tier.shares[r] == nil {
		return
	}
	k, ok := e.rec.Lookup(u.Subject.Value, u.Policy)
	if !ok {
		return
	}
	exp := int64(math.MaxInt64)
	if u.TTL > 0 {
		exp = at + int64(u.TTL)
	}
	e.tier.shares[r][k] = tierShare{rate: u.RateMilli, burst: u.BurstMilli, expireNs: exp}
}

// EnvoyStats are the RLQS tier's message counts of one run, per region
// (zero for gateway regions).
type EnvoyStats struct {
	Envoys    []int
	Reports   []int64 // Envoy to server messages
	Responses []int64 // server to Envoy messages
	// ActiveSec is the time the region's Envoys held at least one
	// bucket, summed over its Envoys (an Envoy without a bucket sends
	// nothing).
	ActiveSec []float64
}

func (e *engine) envoyStats() EnvoyStats {
	n := len(e.sc.Regions)
	s := EnvoyStats{Envoys: make([]int, n), Reports: make([]int64, n), Responses: make([]int64, n), ActiveSec: make([]float64, n)}
	if e.tier == nil {
		return s
	}
	for r, reg := range e.tier.regions {
		if reg == nil {
			continue
		}
		s.Envoys[r] = len(reg.envoys)
		for _, env := range reg.envoys {
			s.Reports[r] += env.reports
			s.Responses[r] += env.responses
			active := env.activeNs
			if len(env.buckets) > 0 {
				active += e.endNs - env.since
			}
			s.ActiveSec[r] += float64(active) / float64(nsPerSec)
		}
	}
	return s
}
