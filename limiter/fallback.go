package limiter

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// fallback holds the in-process limiters that answer while the store
// cannot (seed design 7.6), one golang.org/x/time/rate token bucket per
// (policy, subject), sized by the policy's failure mode:
//
//   - open:  rate x OpenFactor and burst x OpenFactor (default 2), per
//     gateway instance;
//   - local: rate / Instances and burst / Instances (at least one token);
//   - closed: no limiter; the policy rejects.
//
// Window policies use the equivalent bucket: rate limit/window_s per
// second (limit per 31 days for calendar months) and burst limit (what the
// window admits at once). Leaky buckets
// fall back to a token bucket of the same rate and burst: no shaping delay
// while the store is down. Global bucket policies use the region's default
// share (rate and burst / Regions).
//
// A request is all or nothing across all its subjects here as in the
// store (see decide).
//
// Memory is bounded by maxKeys limiters; when full, limiters that are full
// again (idle) are dropped first, then arbitrary ones: a dropped limiter
// starts full, which costs at most one extra burst for that subject.
type fallback struct {
	maxKeys    int
	openFactor float64
	instances  float64
	regions    float64

	mu   sync.Mutex
	lims map[denyKey]*fallbackLimiter
}

type fallbackLimiter struct {
	policy *Policy
	lim    *rate.Limiter
	burst  int
}

func newFallback(maxKeys int, openFactor float64, instances, regions int) *fallback {
	return &fallback{maxKeys: maxKeys, openFactor: openFactor, instances: float64(instances), regions: float64(regions), lims: make(map[denyKey]*fallbackLimiter)}
}

// params is the fallback rate (tokens per second) and burst (tokens) of p.
func (f *fallback) params(p *Policy) (float64, int) {
	var r, b float64
	if p.Algorithm.isBucket() {
		r, b = float64(p.rateMilli)/1000, float64(p.burstMilli)/1000
		if p.Scope == ScopeGlobal && f.regions > 1 {
			r, b = r/f.regions, b/f.regions
		}
	} else {
		// Calendar months count as 31 days (NominalWindowSec): the rate
		// is never overstated.
		r, b = float64(p.Limit)/float64(p.NominalWindowSec()), float64(p.Limit)
	}
	switch p.OnStoreFailure {
	case FailLocal:
		r, b = r/f.instances, b/f.instances
	default:
		r, b = r*f.openFactor, b*f.openFactor
	}
	return r, max(1, int(math.Floor(b)))
}

// get returns the limiter of (p, subject), creating it full.
func (f *fallback) get(k denyKey, p *Policy, now time.Time) *fallbackLimiter {
	fl := f.lims[k]
	if fl != nil && fl.policy == p {
		return fl
	}
	if fl == nil && len(f.lims) >= f.maxKeys {
		f.evict(now)
	}
	r, b := f.params(p)
	fl = &fallbackLimiter{policy: p, lim: rate.NewLimiter(rate.Limit(r), b), burst: b}
	f.lims[k] = fl
	return fl
}

func (f *fallback) evict(now time.Time) {
	dropped := 0
	scanned := 0
	for k, fl := range f.lims {
		if fl.lim.TokensAt(now) >= float64(fl.burst) {
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
// closedRetry is the Retry-After of a fail-closed rejection.
func (f *fallback) decide(now time.Time, subjects []Subject, policies []*Policy, costs []int64, closedRetry time.Duration, out []PolicyDecision) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	var limBuf [16]*fallbackLimiter
	lims := limBuf[:0]
	allowed := true
	for i, p := range policies {
		cost := costs[i]
		subj := subjects[i]
		pd := PolicyDecision{Policy: p, Subject: subj, Cost: cost, Limit: p.capacity(), Source: SourceFallback}
		if p.OnStoreFailure == FailClosed {
			lims = append(lims, nil)
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
		lims = append(lims, fl)
		tokens := fl.lim.TokensAt(now)
		pd.Allowed = float64(cost) <= tokens
		pd.Remaining = int64(math.Floor(max(0, tokens)))
		lr := float64(fl.lim.Limit())
		if !pd.Allowed {
			if cost > int64(fl.burst) {
				pd.Never = true
			}
			pd.RetryAfter = secondsDur((float64(cost) - tokens) / lr)
			if p.Mode == Enforce {
				allowed = false
			}
		}
		pd.ResetAfter = secondsDur((float64(fl.burst) - tokens) / lr)
		if pd.Never {
			pd.RetryAfter = pd.ResetAfter
		}
		out[i] = pd
	}
	if !allowed {
		return false
	}
	for i, fl := range lims {
		pd := &out[i]
		if fl == nil || !pd.Allowed || pd.Cost == 0 {
			continue
		}
		fl.lim.AllowN(now, int(pd.Cost))
		tokens := fl.lim.TokensAt(now)
		pd.Remaining = int64(math.Floor(max(0, tokens)))
		pd.ResetAfter = secondsDur((float64(fl.burst) - tokens) / float64(fl.lim.Limit()))
	}
	return true
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

// secondsDur converts seconds to a duration rounded up to the millisecond.
func secondsDur(s float64) time.Duration {
	if s <= 0 || math.IsNaN(s) {
		return 0
	}
	if s > 1e9 {
		s = 1e9
	}
	return ceilMs(time.Duration(math.Ceil(s * 1e9)))
}
