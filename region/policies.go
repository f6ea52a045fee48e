package region

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotientlabs/quotient/dailyquota"
	dqredis "github.com/quotientlabs/quotient/dailyquota/redisio"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/region/admin"
	"github.com/quotientlabs/quotient/shares"
)

// policySet is the set of policies the coordinator works with, and the
// global limits the rebalancer Core reads from it.
//
// Precedence: with the policy log (Config.PolicyLog), the policies in force
// in the log (the admin API's catalog) as soon as the log holds any record
// (catalog generation > 0: the same rule the gateways' Reloader follows, so
// coordinators and gateways switch together); until then, and without the
// policy log, Config.Policies (the --policies file, a bootstrap).
//
// Overrides: with the policy log in force, SubjectLimit gives the limit of
// every override of a global bucket policy not deleted, as the gateways
// compute it (admin.Override.Apply on the policy in force, which the
// gateways' Reloader does on the same catalog's snapshot), until the
// override's expiry, judged like the gateways by now: so the shares follow
// the limit the gateways enforce for the subject, and an expired or
// deleted override gives the policy's limit back.
//
// Limit and SubjectLimit are safe for concurrent use and never block (an
// atomic map swap), as rebalancer.Policies requires; refresh is called
// after every change of the catalog.
type policySet struct {
	file    []*limiter.Policy
	cat     *admin.Catalog // nil without the policy log
	regions int

	limits    atomic.Pointer[rebalancer.PolicyMap]
	overrides atomic.Pointer[map[subjectKey]overrideLimit]

	// refreshMu makes refreshes one at a time: the admin API's and the
	// policy-log follower's run concurrently, and one that read the
	// catalog before the other's write must not store its older view
	// after the newer one (TestAdminWriteReachesTheShares saw the first
	// write missing when the PUT returned, once in a run of the region
	// tests).
	refreshMu sync.Mutex

	mu      sync.Mutex
	windows string        // signature of the replicated fixed windows
	changed chan struct{} // capacity 1: the replicated fixed windows changed
}

var _ rebalancer.SubjectPolicies = (*policySet)(nil)

type subjectKey struct{ policy, subject string }

// overrideLimit is an override's limit and when it stops applying.
type overrideLimit struct {
	lim     shares.Limit
	expires time.Time
}

func newPolicySet(file []*limiter.Policy, cat *admin.Catalog, regions int) *policySet {
	p := &policySet{file: file, cat: cat, regions: regions, changed: make(chan struct{}, 1)}
	p.refresh()
	return p
}

// current returns the policies in force (see the type doc).
func (p *policySet) current() []*limiter.Policy {
	if p.cat == nil || p.cat.Generation() == 0 {
		return p.file
	}
	var out []*limiter.Policy
	for _, e := range p.cat.Policies() {
		if e.Policy != nil {
			out = append(out, e.Policy)
		}
	}
	return out
}

// fromLog reports whether the policies in force come from the log.
func (p *policySet) fromLog() bool { return p.cat != nil && p.cat.Generation() > 0 }

// Limit implements rebalancer.Policies.
func (p *policySet) Limit(policyID string) (shares.Limit, bool) {
	l, ok := (*p.limits.Load())[policyID]
	return l, ok
}

// SubjectLimit implements rebalancer.SubjectPolicies: the limit of the
// override of policyID for subject (its store-key form) while in force.
func (p *policySet) SubjectLimit(policyID, subject string, now time.Time) (shares.Limit, bool) {
	m := p.overrides.Load()
	if m == nil || len(*m) == 0 {
		return shares.Limit{}, false
	}
	o, ok := (*m)[subjectKey{policyID, subject}]
	if !ok || !now.Before(o.expires) {
		return shares.Limit{}, false
	}
	return o.lim, true
}

// overrideLimits returns the limits of the overrides of the global bucket
// policies in force (see the type doc). An override that does not fit its
// policy is skipped, as the gateways skip it.
func (p *policySet) overrideLimits(cur []*limiter.Policy) map[subjectKey]overrideLimit {
	out := map[subjectKey]overrideLimit{}
	if !p.fromLog() {
		return out
	}
	byID := map[string]*limiter.Policy{}
	for _, q := range cur {
		byID[q.ID] = q
	}
	for _, e := range p.cat.AllOverrides() {
		o := e.Override
		base, ok := byID[o.Policy]
		if !ok {
			continue
		}
		q, err := o.Apply(base)
		if err != nil {
			continue
		}
		limits, _ := GlobalLimits([]*limiter.Policy{q}, p.regions)
		if lim, ok := limits[q.ID]; ok {
			out[subjectKey{o.Policy, o.Subject}] = overrideLimit{lim: lim, expires: o.ExpiresAt}
		}
	}
	return out
}

// windowPolicies returns the global fixed windows to replicate.
func (p *policySet) windowPolicies() []dailyquota.Policy {
	return dqredis.Policies(p.current())
}

// refresh recomputes the limits from the catalog as it is now and signals
// a change of the replicated fixed windows on changed. Safe for concurrent
// use: refreshes run one at a time, so the last to finish read the newest
// catalog.
func (p *policySet) refresh() {
	p.refreshMu.Lock()
	defer p.refreshMu.Unlock()
	cur := p.current()
	limits, _ := GlobalLimits(cur, p.regions)
	p.limits.Store(&limits)
	ovs := p.overrideLimits(cur)
	p.overrides.Store(&ovs)
	sig := fmt.Sprint(dqredis.Policies(cur))
	p.mu.Lock()
	defer p.mu.Unlock()
	if sig != p.windows {
		p.windows = sig
		select {
		case p.changed <- struct{}{}:
		default:
		}
	}
}
