package region

import (
	"fmt"
	"sync"
	"sync/atomic"

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
// Limit is safe for concurrent use and never blocks (an atomic map swap),
// as rebalancer.Policies requires; refresh is called after every change of
// the catalog.
type policySet struct {
	file    []*limiter.Policy
	cat     *admin.Catalog // nil without the policy log
	regions int

	limits atomic.Pointer[rebalancer.PolicyMap]

	mu      sync.Mutex
	windows string        // signature of the replicated fixed windows
	changed chan struct{} // capacity 1: the replicated fixed windows changed
}

var _ rebalancer.Policies = (*policySet)(nil)

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

// windowPolicies returns the global fixed windows to replicate.
func (p *policySet) windowPolicies() []dailyquota.Policy {
	return dqredis.Policies(p.current())
}

// refresh recomputes the limits and signals a change of the replicated
// fixed windows on changed.
func (p *policySet) refresh() {
	cur := p.current()
	limits, _ := GlobalLimits(cur, p.regions)
	p.limits.Store(&limits)
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
