package simulations

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/quotientlabs/quotient/internal/rawcheck"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
)

// DefaultStart is the virtual wall-clock time at which runs start: a UTC
// midnight, so fixed windows of an hour or a day start with the run.
var DefaultStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Options configure a run. The zero value is usable.
type Options struct {
	// NewCoordinator builds each region's coordinator. Default:
	// DefaultCoordinator.
	NewCoordinator NewCoordinator
	// Progress, when set, is called after every simulated second with the
	// seconds done and the total. It runs on the engine's goroutine.
	Progress func(done, total int64)
	// Start is the virtual time of t=0 (true time; each region's clock adds
	// its skew). Default DefaultStart. Whole seconds only.
	Start time.Time
	// ColdStart starts the coordinators at t=0 with the traffic. By
	// default they start HeadStartEpochs epochs earlier, so a run measures
	// a running system receiving the scenario's traffic rather than a
	// whole fleet of coordinators booting at once (a booting rebalancer
	// stays in fallback for its warm-up epochs).
	ColdStart bool
}

// HeadStartEpochs is how many epochs before t=0 the coordinators start
// unless Options.ColdStart is set: the default warm-up,
// rebalancer.DefaultConfig().WarmupEpochs (2K-1 = 9 since the partition
// rule's majority; a test pins the two together).
const HeadStartEpochs = 9

// ErrInternal wraps failures of the engine or of the code it drives (a
// store or coordinator error), as opposed to bad input.
var ErrInternal = errors.New("simulations: internal error")

const nsPerSec = int64(time.Second)

// Event kinds, in the order they run when they fall on the same instant.
const (
	evSecond   uint8 = iota // end of a simulated second: sample shares
	evDeliver               // the bus delivers a message
	evEnvoy                 // the RLQS tier: a server tick or an Envoy's report (envoys.go)
	evBoundary              // a region's epoch boundary
	evWake                  // a coordinator's wake-up
	evArrival               // a request arrives
)

type event struct {
	at   int64 // ns since start, true time
	kind uint8
	seq  uint64
	idx  int32
}

func (a *event) before(b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	if a.kind != b.kind {
		return a.kind < b.kind
	}
	return a.seq < b.seq
}

// eventHeap is a binary min-heap of events by (at, kind, seq): a total
// order, so runs are deterministic.
type eventHeap struct {
	ev  []event
	seq uint64
}

func (h *eventHeap) push(at int64, kind uint8, idx int) {
	h.seq++
	h.ev = append(h.ev, event{at: at, kind: kind, seq: h.seq, idx: int32(idx)})
	i := len(h.ev) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.ev[i].before(&h.ev[p]) {
			break
		}
		h.ev[i], h.ev[p] = h.ev[p], h.ev[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	top := h.ev[0]
	n := len(h.ev) - 1
	h.ev[0] = h.ev[n]
	h.ev = h.ev[:n]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && h.ev[l].before(&h.ev[m]) {
			m = l
		}
		if r < n && h.ev[r].before(&h.ev[m]) {
			m = r
		}
		if m == i {
			break
		}
		h.ev[i], h.ev[m] = h.ev[m], h.ev[i]
		i = m
	}
	return top
}

type keyState struct {
	tracked []int // recorder indexes, one per policy
	// calls are the request's subjects and their policies, decided in one
	// limiter call, all or nothing across them as in production.
	calls []limiter.SubjectPolicies
}

type entryState struct {
	tr      *Traffic
	keys    []keyState
	zipfCDF []float64 // groups: cumulative key popularity
	mixCDF  []float64 // groups: cumulative region mix
	keyRng  *rand.Rand
	mixRng  *rand.Rand
}

type interval struct{ from, to int64 } // ns, [from, to)

type shareRec struct {
	milli    int64
	expireNs int64 // true time; math.MaxInt64: none
}

type regionState struct {
	skewNs      int64
	store       *limiter.MemoryStore
	lim         *limiter.Limiter
	coord       Coordinator
	coordDown   []interval
	storeDown   []interval
	usageDemand []int64 // per tracked key, this epoch
	usageAdmit  []int64
	touched     []int
	shares      map[int]shareRec // named tracked keys only
	// The coordinator's crashes (coordinator_down): info builds its
	// replacement, restarts counts the outages it came back from, and log
	// holds every message delivered to the region (kept only when it has
	// outages), which a restarted coordinator re-reads as production's
	// consumer re-reads its topic.
	info     RegionInfo
	restarts int
	// lastReport is when (region clock) this region's coordinators last
	// published a usage report, if reported (RegionInfo.LastReport).
	lastReport   time.Time
	reported     bool
	log          []logged
	nextBoundary int64
	epochNs      int64
}

// logged is a message delivered to a region at true time at, sent at sent.
type logged struct {
	sent, at int64
	msg      Message
}

func down(iv []interval, t int64) bool {
	for _, i := range iv {
		if t >= i.from && t < i.to {
			return true
		}
	}
	return false
}

type stream struct {
	entry    int
	region   int // -1: a group, the region is drawn per request
	steps    []Step
	seg      int // current step, -1 before the first
	segStart int64
	k        int64 // uniform: arrivals so far in the segment
	uniform  bool
	rng      *rand.Rand
}

func (s *stream) segEnd() int64 {
	if s.seg+1 < len(s.steps) {
		return int64(math.Round(s.steps[s.seg+1].AtSec * float64(nsPerSec)))
	}
	return math.MaxInt64
}

// next returns the first arrival after from, or -1 when the schedule stays
// at 0 for ever. Poisson arrivals restart at every step (the process is
// memoryless); uniform ones are evenly spaced in the step, half an interval
// from its start, so a step of d seconds at rate r has exactly r*d arrivals
// when r*d is whole.
func (s *stream) next(from int64) int64 {
	for {
		end := s.segEnd()
		rate := 0.0
		if s.seg >= 0 {
			rate = s.steps[s.seg].Rate
		}
		if rate > 0 {
			var cand int64
			if s.uniform {
				s.k++
				cand = s.segStart + int64(math.Round((float64(s.k)-0.5)*float64(nsPerSec)/rate))
			} else {
				cand = from + int64(s.rng.ExpFloat64()/rate*float64(nsPerSec))
			}
			if cand < end {
				return cand
			}
		}
		if end == math.MaxInt64 {
			return -1
		}
		s.seg++
		s.segStart, from, s.k = end, end, 0
	}
}

type inflight struct {
	to   int
	sent int64 // true time
	msg  Message
}

type engine struct {
	ctx      context.Context
	sc       *Scenario
	opt      Options
	startNs  int64
	endNs    int64
	rec      *Recorder
	subjects []limiter.Subject // per tracked key
	regions  []*regionState
	entries  []entryState
	streams  []stream
	events   eventHeap
	msgs     []inflight
	freeMsgs []int
	busRng   *rand.Rand
	named    []int
	tier     *envoyTier // nil without envoys
	err      error
}

// rng returns a generator for one purpose, seeded from the scenario seed
// and the purpose's name, so adding a purpose never shifts another's draws.
func rng(seed int64, purpose string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(purpose))
	return rand.New(rand.NewPCG(uint64(seed), h.Sum64()))
}

// Run simulates sc in virtual time and returns its report (Wall is left 0
// for the caller). The same scenario and options give the same report.
// Errors wrap ErrInternal; ctx cancels a run between simulated seconds.
func Run(ctx context.Context, sc *Scenario, opt Options) (*Report, error) {
	e, err := newEngine(ctx, sc, opt)
	if err != nil {
		return nil, err
	}
	if err := e.run(); err != nil {
		return nil, err
	}
	return e.rec.Report(e.startNs / nsPerSec), nil
}

func newEngine(ctx context.Context, sc *Scenario, opt Options) (*engine, error) {
	if opt.NewCoordinator == nil {
		opt.NewCoordinator = DefaultCoordinator
	}
	if opt.Start.IsZero() {
		opt.Start = DefaultStart
	}
	e := &engine{
		ctx:     ctx,
		sc:      sc,
		opt:     opt,
		startNs: opt.Start.Truncate(time.Second).UnixNano(),
		endNs:   sc.DurationSec * nsPerSec,
		rec:     NewRecorder(sc),
		busRng:  rng(sc.Seed, "bus"),
	}
	policies := map[string]*limiter.Policy{}
	for _, p := range sc.Policies {
		policies[p.ID] = p
	}

	// Traffic: keys, their tracked (key, policy) pairs and limiter calls.
	for i := range sc.Traffic {
		tr := &sc.Traffic[i]
		es := entryState{tr: tr}
		names := []string{tr.Key}
		if !tr.Named() {
			names = make([]string, tr.Count)
			for j := range names {
				names[j] = tr.KeyPrefix + strconv.Itoa(j)
			}
			es.zipfCDF = zipfCDF(tr.Count, tr.ZipfS)
			es.mixCDF = cumulative(tr.RegionMix)
			es.keyRng = rng(sc.Seed, fmt.Sprintf("traffic[%d].keys", i))
			es.mixRng = rng(sc.Seed, fmt.Sprintf("traffic[%d].regions", i))
		}
		es.keys = make([]keyState, len(names))
		for j, name := range names {
			ks := &es.keys[j]
			for _, id := range tr.Policies {
				p := policies[id]
				k := e.rec.Track(name, p, tr.Named())
				ks.tracked = append(ks.tracked, k)
				for len(e.subjects) <= k {
					e.subjects = append(e.subjects, limiter.Subject{})
				}
				subj := limiter.Subject{Kind: p.Subject, Value: name}
				e.subjects[k] = subj
				c := -1
				for ci := range ks.calls {
					if ks.calls[ci].Subject == subj {
						c = ci
					}
				}
				if c < 0 {
					ks.calls = append(ks.calls, limiter.SubjectPolicies{Subject: subj})
					c = len(ks.calls) - 1
				}
				ks.calls[c].Policies = append(ks.calls[c].Policies, p)
			}
		}
		e.entries = append(e.entries, es)
		if tr.Named() {
			for r, steps := range tr.Rate {
				if len(steps) > 0 {
					e.streams = append(e.streams, e.newStream(i, r, steps, tr.Arrivals))
				}
			}
		} else {
			e.streams = append(e.streams, e.newStream(i, -1, tr.TotalRate, tr.Arrivals))
		}
	}
	e.named = e.rec.Named()

	// Regions.
	bySubject := map[string]limiter.Subject{}
	for _, subj := range e.subjects {
		bySubject[subj.Key()] = subj
	}
	lookup := func(encoded string) (limiter.Subject, bool) {
		s, ok := bySubject[encoded]
		return s, ok
	}
	epochNs := sc.EpochSec * nsPerSec
	for r := range sc.Regions {
		store := limiter.NewMemoryStore()
		lim, err := limiter.New(limiter.Config{Store: store, Regions: len(sc.Regions), Region: sc.Regions[r]}, nil)
		if err != nil {
			return nil, fmt.Errorf("%w: limiter: %v", ErrInternal, err)
		}
		skewNs := sc.ClockSkewMs[r] * int64(time.Millisecond)
		var storeDown []interval
		for _, f := range sc.Faults {
			if f.Region == r && f.Kind != CoordinatorDown {
				storeDown = append(storeDown, interval{secNs(f.FromSec), secNs(f.ToSec)})
			}
		}
		info := RegionInfo{Self: r, Regions: sc.Regions, Epoch: time.Duration(epochNs), Policies: sc.Policies, Subject: lookup,
			WindowCounts: store.WindowCounts, Served: func() []Usage { return e.served(r) },
			StoreDown: func(now time.Time) bool { return down(storeDown, now.UnixNano()-e.startNs-skewNs) },
			LastReport: func() (time.Time, bool) {
				rs := e.regions[r]
				return rs.lastReport, rs.reported
			}}
		coord, err := opt.NewCoordinator(info)
		if err != nil {
			return nil, fmt.Errorf("%w: coordinator of %s: %v", ErrInternal, sc.Regions[r], err)
		}
		rs := &regionState{
			skewNs:      skewNs,
			store:       store,
			lim:         lim,
			coord:       coord,
			info:        info,
			storeDown:   storeDown,
			usageDemand: make([]int64, len(e.rec.keys)),
			usageAdmit:  make([]int64, len(e.rec.keys)),
			shares:      map[int]shareRec{},
			epochNs:     epochNs,
		}
		for _, f := range sc.Faults {
			if f.Region == r && f.Kind == CoordinatorDown {
				rs.coordDown = append(rs.coordDown, interval{secNs(f.FromSec), secNs(f.ToSec)})
			}
		}
		slices.SortFunc(rs.coordDown, func(a, b interval) int { return cmp.Compare(a.from, b.from) })
		// First boundary: the first multiple of the epoch on the region's
		// clock after the coordinators start.
		clock0 := e.startNs + rs.skewNs
		if !opt.ColdStart {
			clock0 -= HeadStartEpochs * epochNs
		}
		k := clock0/epochNs + 1
		rs.nextBoundary = k*epochNs - e.startNs - rs.skewNs
		e.events.push(rs.nextBoundary, evBoundary, r)
		e.regions = append(e.regions, rs)
	}
	if err := e.newEnvoyTier(); err != nil {
		return nil, err
	}
	for i := range e.streams {
		if t := e.streams[i].next(0); t >= 0 && t < e.endNs {
			e.events.push(t, evArrival, i)
		}
	}
	e.events.push(nsPerSec, evSecond, 0)
	return e, nil
}

func secNs(s float64) int64 { return int64(math.Round(s * float64(nsPerSec))) }

func (e *engine) newStream(entry, region int, steps []Step, arr Arrivals) stream {
	s := stream{entry: entry, region: region, steps: steps, seg: -1, uniform: arr == Uniform,
		rng: rng(e.sc.Seed, fmt.Sprintf("traffic[%d].arrivals.%d", entry, region))}
	if steps[0].AtSec == 0 {
		s.seg = 0
	}
	return s
}

func zipfCDF(n int, s float64) []float64 {
	cdf := make([]float64, n)
	sum := 0.0
	for i := range cdf {
		sum += math.Pow(float64(i+1), -s)
		cdf[i] = sum
	}
	for i := range cdf {
		cdf[i] /= sum
	}
	return cdf
}

func cumulative(w []float64) []float64 {
	out := make([]float64, len(w))
	sum := 0.0
	for i, v := range w {
		sum += v
		out[i] = sum
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

// pick returns the first index whose cumulative weight exceeds u.
func pick(cdf []float64, u float64) int {
	lo, hi := 0, len(cdf)-1
	for lo < hi {
		m := (lo + hi) / 2
		if cdf[m] > u {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

func (e *engine) run() error {
	for len(e.events.ev) > 0 {
		ev := e.events.pop()
		if ev.at > e.endNs {
			break
		}
		switch ev.kind {
		case evSecond:
			if err := e.second(ev.at); err != nil {
				return err
			}
		case evDeliver:
			e.deliver(ev.at, int(ev.idx))
		case evEnvoy:
			e.envoyEvent(ev.at, int(ev.idx))
		case evBoundary:
			e.tick(ev.at, int(ev.idx), true)
		case evWake:
			e.tick(ev.at, int(ev.idx), false)
		case evArrival:
			e.arrival(ev.at, int(ev.idx))
		}
		if e.err != nil {
			return e.err
		}
	}
	return nil
}

// second ends simulated second at/1s - 1: it samples the shares of named
// keys, reports progress and checks for cancellation.
func (e *engine) second(at int64) error {
	sec := at/nsPerSec - 1
	n := int64(len(e.regions))
	for _, k := range e.named {
		p := e.rec.keys[k].policy
		for r, rs := range e.regions {
			var share int64
			if s, ok := rs.shares[k]; ok && at < s.expireNs {
				share = s.milli
			} else if p.Algorithm == limiter.FixedWindow {
				share = p.Limit * 1000 // no share: the limit, on replicated counts
			} else {
				share = max(1, p.RateMilli()/n)
			}
			e.rec.RecordShare(k, r, sec, share)
		}
	}
	if e.opt.Progress != nil {
		e.opt.Progress(sec+1, e.sc.DurationSec)
	}
	if err := e.ctx.Err(); err != nil {
		return fmt.Errorf("%w: %v", ErrInternal, err)
	}
	if at < e.endNs {
		e.events.push(at+nsPerSec, evSecond, 0)
	}
	return nil
}

func (e *engine) regionNow(r int, at int64) time.Time {
	return time.Unix(0, e.startNs+at+e.regions[r].skewNs).UTC()
}

func (e *engine) arrival(at int64, si int) {
	s := &e.streams[si]
	es := &e.entries[s.entry]
	region, key := s.region, 0
	if region < 0 {
		key = pick(es.zipfCDF, es.keyRng.Float64())
		region = pick(es.mixCDF, es.mixRng.Float64())
	}
	e.decide(at, region, es, key)
	if t := s.next(at); t >= 0 && t < e.endNs {
		e.events.push(t, evArrival, si)
	}
}

// decide runs one request through the region's limiter (or its fallback
// while the store is down) and records it.
func (e *engine) decide(at int64, region int, es *entryState, key int) {
	if e.envoyDecide(at, region, es, key) {
		return
	}
	rs := e.regions[region]
	now := time.Unix(0, e.startNs+at+rs.skewNs)
	ks := &es.keys[key]
	cost := es.tr.Cost
	var d limiter.Decision
	var err error
	if down(rs.storeDown, at) {
		// The production fallback: each policy's on_store_failure.
		d, err = rawcheck.CheckSubjectsFallbackAt(rs.lim, now, ks.calls, cost)
	} else {
		d, err = rawcheck.CheckSubjectsAt(rs.lim, e.ctx, now, ks.calls, cost)
	}
	if err != nil {
		e.err = fmt.Errorf("%w: limiter in %s: %v", ErrInternal, e.sc.Regions[region], err)
		return
	}
	allowed := d.Allowed
	e.rec.Decision()
	sec := at / nsPerSec
	for _, k := range ks.tracked {
		e.rec.Record(k, region, sec, cost, allowed)
		if rs.usageDemand[k] == 0 {
			rs.touched = append(rs.touched, k)
		}
		rs.usageDemand[k] += cost
		if allowed {
			rs.usageAdmit[k] += cost
		}
	}
}

func (e *engine) tick(at int64, r int, boundary bool) {
	rs := e.regions[r]
	if boundary {
		rs.nextBoundary = at + rs.epochNs
		e.events.push(rs.nextBoundary, evBoundary, r)
	}
	var usage []Usage
	if boundary {
		slices.Sort(rs.touched)
		usage = make([]Usage, 0, len(rs.touched))
		for _, k := range rs.touched {
			usage = append(usage, Usage{Policy: e.rec.keys[k].policy.ID, Subject: e.subjects[k], Demand: rs.usageDemand[k], Admitted: rs.usageAdmit[k]})
			rs.usageDemand[k], rs.usageAdmit[k] = 0, 0
		}
		rs.touched = rs.touched[:0]
	}
	if !e.up(at, r) {
		return // the epoch's usage is lost with the coordinator
	}
	now := e.regionNow(r, at)
	e.apply(at, r, now, rs.coord.Tick(now, boundary, usage))
}

// up reports whether region r's coordinator runs at true time at. A
// coordinator_down outage is a crash: when it ends, the region gets a new
// coordinator (state lost, so it warms up as a restarted process does),
// which first re-reads the messages delivered to the region within its
// ReplayWindow before the restart (see Replayer), in order.
func (e *engine) up(at int64, r int) bool {
	rs := e.regions[r]
	for rs.restarts < len(rs.coordDown) && rs.coordDown[rs.restarts].to <= at {
		iv := rs.coordDown[rs.restarts]
		rs.restarts++
		coord, err := e.opt.NewCoordinator(rs.info)
		if err != nil {
			if e.err == nil {
				e.err = fmt.Errorf("%w: coordinator of %s restarted at %v: %v", ErrInternal, e.sc.Regions[r], time.Duration(iv.to), err)
			}
			return false
		}
		rs.coord = coord
		now := e.regionNow(r, at)
		for _, m := range rs.log {
			if m.at < at {
				e.apply(at, r, now, replay(coord, now, m.msg, time.Duration(iv.to-m.sent), time.Duration(iv.to-iv.from)))
			}
		}
	}
	return !down(rs.coordDown, at)
}

// apply carries out what region r's coordinator asked at true time at
// (region time now): publish, install shares, schedule a wake-up.
func (e *engine) apply(at int64, r int, now time.Time, res TickResult) {
	rs := e.regions[r]
	if res.Err != nil {
		if e.err == nil {
			e.err = fmt.Errorf("%w: coordinator of %s at %v: %v", ErrInternal, e.sc.Regions[r], now, res.Err)
		}
		return
	}
	for _, payload := range res.Publish {
		if _, ok := payload.(*rebalancer.Report); ok {
			rs.lastReport, rs.reported = now, true
		}
		e.send(at, r, payload)
	}
	for _, u := range res.Shares {
		rs.store.SetShare(now, u.Subject, u.Policy, u.RateMilli, u.BurstMilli, u.TTL)
		e.envoyShare(at, r, u)
		if k, ok := e.rec.Lookup(u.Subject.Value, u.Policy); ok && e.rec.keys[k].named {
			exp := int64(math.MaxInt64)
			if u.TTL > 0 {
				exp = at + int64(u.TTL)
			}
			rs.shares[k] = shareRec{milli: u.RateMilli, expireNs: exp}
		}
	}
	for _, w := range res.Windows {
		rs.store.MergeWindowCount(now, w.Subject, w.Policy, w.WindowStartMs, w.WindowMs, w.Region, w.Count)
	}
	for _, c := range res.Caps {
		rs.store.SetWindowCap(now, c.Subject, c.Policy, c.WindowStartMs, c.WindowMs, c.Cap)
	}
	if !res.Wake.IsZero() {
		w := res.Wake.UnixNano() - e.startNs - rs.skewNs
		if w > at && w < rs.nextBoundary {
			e.events.push(w, evWake, r)
		}
	}
}

func (e *engine) partitioned(a, b int, at int64) bool {
	for _, p := range e.sc.Network.Partitions {
		if at < secNs(p.FromSec) || at >= secNs(p.ToSec) {
			continue
		}
		if slices.Contains(p.Regions, a) != slices.Contains(p.Regions, b) {
			return true
		}
	}
	return false
}

// send puts a payload from region from on the bus to every other region:
// each delivery is lost with probability loss, duplicated with probability
// duplicate, delayed by latency +- jitter (uniform, never negative), and
// dropped when a partition separates the two regions when it is sent or
// when it would arrive.
func (e *engine) send(at int64, from int, payload any) {
	n := &e.sc.Network
	for to := range e.regions {
		if to == from || e.partitioned(from, to, at) {
			continue
		}
		if e.busRng.Float64() < n.Loss {
			continue
		}
		copies := 1
		if e.busRng.Float64() < n.Duplicate {
			copies = 2
		}
		for range copies {
			delayMs := max(0, n.LatencyMs+(2*e.busRng.Float64()-1)*n.JitterMs)
			slot := len(e.msgs)
			if f := len(e.freeMsgs); f > 0 {
				slot = e.freeMsgs[f-1]
				e.freeMsgs = e.freeMsgs[:f-1]
				e.msgs[slot] = inflight{to: to, sent: at, msg: Message{From: from, Payload: payload}}
			} else {
				e.msgs = append(e.msgs, inflight{to: to, sent: at, msg: Message{From: from, Payload: payload}})
			}
			e.events.push(at+int64(delayMs*float64(time.Millisecond)), evDeliver, slot)
		}
	}
}

func (e *engine) deliver(at int64, slot int) {
	m := e.msgs[slot]
	e.msgs[slot] = inflight{}
	e.freeMsgs = append(e.freeMsgs, slot)
	if e.partitioned(m.msg.From, m.to, at) {
		return
	}
	rs := e.regions[m.to]
	up := e.up(at, m.to)
	if len(rs.coordDown) > 0 {
		rs.log = append(rs.log, logged{sent: m.sent, at: at, msg: m.msg})
	}
	if !up {
		return
	}
	now := e.regionNow(m.to, at)
	e.apply(at, m.to, now, rs.coord.Receive(now, m.msg))
}
