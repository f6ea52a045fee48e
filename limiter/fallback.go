package limiter

import (
	"math"
	"sync"
	"time"
)

// fallback holds the in-process limiters that answer while the store
// cannot (seed design 7.6), one per (policy, subject). Each runs the
// policy's own algorithm (algorithm.go, the MemoryStore's code) in process
// at the limiter's clock, with the policy's parameters scaled by its
// failure mode:
//
//   - open:  rate and burst (buckets) or limit (windows) x OpenFactor
//     (default 2), per gateway instance;
//   - local: rate and burst, or limit, / Instances (at least one token,
//     at least one unit);
//   - closed: no limiter; the policy rejects.
//
// So each algorithm keeps its shape while the store is down:
//
//   - token_bucket: a bucket of the scaled rate and burst;
//   - leaky_bucket: a queue of the scaled burst drained at the scaled
//     rate; an admitted request carries the delay of the work queued
//     ahead of it in this process (Decision.Delay), so traffic is still
//     shaped, at the fallback rate;
//   - fixed_window: the same UTC-aligned windows (days, calendar
//     months), counting at most the scaled limit per window;
//   - sliding_window_counter: the same weighted estimate over the same
//     window, at the scaled limit;
//   - sliding_window_log: a sliding window counter of the same window
//     and scaled limit (the log's memory is O(limit) per key, which a
//     fallback bounded by key count cannot afford; the counter's estimate
//     is the log's to within the previous window's spread).
//
// A limiter starts empty (full bucket, empty queue, zero counts) when the
// store first fails for its key: what the store had already counted in the
// current window is not known in process, except its rejections: a
// request the store rejected (the deny cache) is rejected again until the
// store's retry time before the fallback is asked (Limiter.fallbackAll). Global bucket policies use the
// region's default share (rate and burst / Regions); global windows count
// this instance's admissions against the scaled limit.
//
// A request is all or nothing across all its subjects here as in the
// store (see decide).
//
// Memory is bounded by maxKeys limiters; when full, limiters whose state
// has expired (full again, or past their window) are dropped first, then
// arbitrary ones: a dropped limiter starts empty again, which costs at
// most one extra burst (or window limit) for that subject.
type fallback struct {
	maxKeys    int
	openFactor float64
	instances  float64
	regions    float64

	mu   sync.Mutex
	lims map[denyKey]*fallbackLimiter
}

// fallbackLimiter is one (policy, subject)'s in-process state: the
// algorithm's op with the fallback's parameters, and its state (nil until
// the first admission, or once expired).
type fallbackLimiter struct {
	op       op
	st       *state
	expireMs int64 // when st expires (ms)
	lastUs   int64 // the latest time decided at (µs)
}

func newFallback(maxKeys int, openFactor float64, instances, regions int) *fallback {
	return &fallback{maxKeys: maxKeys, openFactor: openFactor, instances: float64(instances), regions: float64(regions), lims: make(map[denyKey]*fallbackLimiter)}
}

// params is the fallback rate (tokens per second) and burst (tokens) of
// bucket policy p.
func (f *fallback) params(p *Policy) (float64, int) {
	r, b := float64(p.rateMilli)/1000, float64(p.burstMilli)/1000
	if p.Scope == ScopeGlobal && f.regions > 1 {
		r, b = r/f.regions, b/f.regions
	}
	r, b = f.scale(p, r), f.scale(p, b)
	return r, max(1, int(math.Floor(b)))
}

// scale applies p's failure mode to one parameter.
func (f *fallback) scale(p *Policy, v float64) float64 {
	if p.OnStoreFailure == FailLocal {
		return v / f.instances
	}
	return v * f.openFactor
}

// fallbackOp is the op the fallback runs for p: p's algorithm (a sliding
// window counter for a sliding window log) with scaled parameters, never
// global (no share, no replicated counts: nothing but this process).
func (f *fallback) fallbackOp(p *Policy) op {
	o := op{algo: p.Algorithm, policy: p.ID, enforce: p.Mode == Enforce}
	if p.Algorithm.isBucket() {
		r, b := f.params(p)
		o.rate = max(1, int64(math.Round(r*1000)))
		o.burst = int64(b) * 1000
		return o
	}
	if o.algo == SlidingWindowLog {
		o.algo = SlidingWindowCounter
	}
	o.limit = max(1, int64(math.Floor(f.scale(p, float64(p.Limit)))))
	o.windowMs = p.WindowSec * 1000
	return o
}

// get returns the limiter of (p, subject), creating it empty, or anew
// when p's fallback op differs from the one the limiter was made for (an
// override, an edited policy). Limiters are told apart by what they
// compute, not by the *Policy: the limiter's own copy of a policy (Check)
// and the caller's (Allow, CheckSubjectsInto) share one limiter, and a
// policy changed after its limiter was made never runs a stale op.
func (f *fallback) get(k denyKey, p *Policy, now time.Time) *fallbackLimiter {
	o := f.fallbackOp(p)
	fl := f.lims[k]
	if fl != nil && fl.op == o {
		return fl
	}
	if fl == nil && len(f.lims) >= f.maxKeys {
		f.evict(now)
	}
	fl = &fallbackLimiter{op: o}
	f.lims[k] = fl
	return fl
}

func (f *fallback) evict(now time.Time) {
	nowMs := now.UnixMilli()
	dropped := 0
	scanned := 0
	for k, fl := range f.lims {
		if fl.st == nil || fl.expireMs <= nowMs {
			delete(f.lims, k)
			dropped++
		}
		if scanned++; scanned >= 64 {
			break
		}
	}
	if dropped > 0 {
		return
	}
	for k := range f.lims {
		delete(f.lims, k)
		return
	}
}

// decide answers the policies of one request in process (subjects[i] is
// the subject of policies[i]: one or several subjects), all or nothing
// like the store, across the subjects too: if an enforced policy of any
// subject rejects, no limiter of any subject is consumed. One mutex guards
// every limiter, so the check and the consumption are one step.
// closedRetry is the Retry-After of a fail-closed rejection. Admitted
// leaky-bucket policies carry their shaping delay in out[i].Delay.
func (f *fallback) decide(now time.Time, subjects []Subject, policies []*Policy, costs []int64, closedRetry time.Duration, out []PolicyDecision) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	nowUs := now.UnixMicro()
	nowMs := nowUs / 1000
	var limBuf [16]*fallbackLimiter
	var advBuf [16]state
	var resBuf [16]result
	lims, adv, res := limBuf[:0], advBuf[:0], resBuf[:0]
	allowed := true
	for i, p := range policies {
		subj := subjects[i]
		pd := PolicyDecision{Policy: p, Subject: subj, Cost: costs[i], Limit: p.capacity(), Source: SourceFallback}
		if p.OnStoreFailure == FailClosed {
			lims, adv, res = append(lims, nil), append(adv, state{}), append(res, result{})
			pd.FailedClosed = true
			pd.RetryAfter = closedRetry
			pd.ResetAfter = closedRetry
			if p.Mode == Enforce {
				allowed = false
			}
			out[i] = pd
			continue
		}
		fl := f.get(denyKey{policy: p.ID, kind: subj.Kind, value: subj.Value}, p, now)
		o := fl.op
		o.cost = costs[i]
		cur := fl.st
		if cur != nil && fl.expireMs <= nowMs {
			cur = nil
		}
		// A limiter's time never goes back: a request that reaches the
		// fallback after a later one (its store call took longer) is
		// decided at the later time, as Redis decides at the time the
		// call runs, not at the time it was sent.
		fl.lastUs = max(fl.lastUs, nowUs)
		s := advance(&o, cur, fl.lastUs, o.rate, o.burst)
		admit, r := decide(&o, &s, fl.lastUs, o.rate, o.burst)
		r.allowed = admit
		if !admit && p.Mode == Enforce {
			allowed = false
		}
		lims, adv, res = append(lims, fl), append(adv, s), append(res, r)
		out[i] = pd
	}
	for i, fl := range lims {
		if fl == nil {
			continue
		}
		o := fl.op
		o.cost = costs[i]
		r := &res[i]
		final := adv[i]
		at := fl.lastUs
		if allowed && r.allowed && o.cost > 0 {
			final = consume(&o, final, at, o.rate)
			ttl := report(&o, &final, at, o.rate, o.burst, r)
			fl.st, fl.expireMs = &final, at/1000+ttl
		} else {
			report(&o, &final, at, o.rate, o.burst, r)
		}
		pd := &out[i]
		pd.Allowed = r.allowed
		// An open fallback counts against OpenFactor x the quota; the
		// client is never told more than the policy's quota remains
		// (RateLimit fields and RLS statuses state Limit beside it).
		pd.Remaining = min(r.remaining, pd.Limit)
		pd.ResetAfter = time.Duration(r.resetMs) * time.Millisecond
		switch {
		case r.allowed:
		case r.retryMs < 0:
			pd.Never = true
			pd.RetryAfter = pd.ResetAfter
		default:
			pd.RetryAfter = time.Duration(r.retryMs) * time.Millisecond
		}
		if allowed && r.allowed {
			pd.Delay = time.Duration(r.delayMs) * time.Millisecond
		}
	}
	return allowed
}

// setRegions changes the region count of global policies' fallbacks and
// drops every fallback limiter, so that none keeps the old share.
func (f *fallback) setRegions(n int) {
	f.mu.Lock()
	f.regions = float64(n)
	clear(f.lims)
	f.mu.Unlock()
}

func (f *fallback) clear() {
	f.mu.Lock()
	clear(f.lims)
	f.mu.Unlock()
}

func (f *fallback) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.lims)
}

// foldDelay raises d.Delay to the largest delay of the enforced policies
// in pds (the fallback's leaky buckets), as record does for the store's.
func foldDelay(d *Decision, pds []PolicyDecision) {
	for i := range pds {
		if pds[i].Policy.Mode == Enforce && pds[i].Delay > d.Delay {
			d.Delay = pds[i].Delay
		}
	}
	if !d.Allowed {
		d.Delay = 0
	}
}
