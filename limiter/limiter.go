package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Clock tells the time. The zero Config uses the system clock.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Config configures a Limiter. Start from DefaultConfig.
type Config struct {
	// Store holds the buckets. Default: a new MemoryStore.
	Store Store
	// Clock gives the time for in-process decisions (the MemoryStore's time
	// and the deadlines). Default: the system clock. The RedisStore always
	// decides with Redis server time.
	Clock Clock
	// Regions is the number of regions that share every global policy;
	// a key without a share record gets 1/Regions of the global rate and
	// burst (rounded down). Default 1.
	Regions int
}

// DefaultConfig is an in-memory limiter on the system clock, one region.
func DefaultConfig() Config {
	return Config{Regions: 1}
}

// Validate fills defaults and rejects bad values.
func (c *Config) Validate() error {
	if c.Store == nil {
		c.Store = NewMemoryStore()
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	if c.Regions == 0 {
		c.Regions = 1
	}
	if c.Regions < 0 || c.Regions > 64 {
		return fmt.Errorf("limiter: config: Regions must be between 1 and 64, got %d", c.Regions)
	}
	return nil
}

// Limiter decides requests against a set of policies. It is safe for
// concurrent use; the policy set can be swapped at any time with
// SetPolicies and every Check sees one whole set.
type Limiter struct {
	store    Store
	clock    Clock
	regions  int64
	policies atomic.Pointer[[]*Policy]
}

// ErrNoPolicies is returned by SetPolicies for a policy that was not
// validated.
var ErrNoPolicies = errors.New("limiter: policy not validated")

// New returns a Limiter enforcing policies, which must come from
// ParsePolicies or have passed Validate.
func New(cfg Config, policies []*Policy) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &Limiter{store: cfg.Store, clock: cfg.Clock, regions: int64(cfg.Regions)}
	if err := l.SetPolicies(policies); err != nil {
		return nil, err
	}
	return l, nil
}

// SetPolicies replaces the policy set atomically. Policies must be
// validated; on error the old set stays in force.
func (l *Limiter) SetPolicies(policies []*Policy) error {
	for i, p := range policies {
		if p == nil || !p.validated {
			return fmt.Errorf("%w: policies[%d]", ErrNoPolicies, i)
		}
	}
	cp := append([]*Policy(nil), policies...)
	l.policies.Store(&cp)
	return nil
}

// Policies returns the policy set in force. The caller must not modify it.
func (l *Limiter) Policies() []*Policy { return *l.policies.Load() }

// Request is one request to decide.
type Request struct {
	// Identity of the caller; policies whose subject kind it lacks do not
	// apply.
	Identity Identity
	// Method and Path select policies (Match) and costs (Policy.Cost).
	Method string
	Path   string
	// Cost, when > 0, replaces every policy's route cost.
	Cost int64
	// Peek evaluates without consuming (cost 0): nothing is written.
	Peek bool
}

// Source says what answered a decision.
type Source string

// Sources.
const (
	// SourceStore: the store decided (Redis or memory).
	SourceStore Source = "store"
	// SourceDenyCache: the subject was rejected recently and is still
	// within its retry time; rejected without a store call.
	SourceDenyCache Source = "deny_cache"
	// SourceFallback: the store could not answer; the policy's failure mode
	// decided.
	SourceFallback Source = "fallback"
	// SourceNone: no policy applied.
	SourceNone Source = "none"
)

// PolicyDecision is one policy's part of a Decision.
type PolicyDecision struct {
	// Policy is the policy evaluated (shared; do not modify).
	Policy *Policy
	// Subject is what the policy counted.
	Subject Subject
	// Allowed reports whether this policy admits the request; for a shadow
	// policy, whether it would.
	Allowed bool
	// Cost charged (or that would be charged), in cost units.
	Cost int64
	// Limit is the policy's quota in cost units: burst for buckets, limit
	// for windows (the global value for global policies).
	Limit int64
	// Remaining cost units after this request.
	Remaining int64
	// ResetAfter is the time until the quota is whole again.
	ResetAfter time.Duration
	// RetryAfter is, when the policy rejects, the time until this cost
	// could be admitted; 0 when it admits.
	RetryAfter time.Duration
	// Never is set when the cost exceeds what the policy can ever admit;
	// RetryAfter is then ResetAfter.
	Never bool
	// Delay is how long a shaping (leaky bucket) policy wants the admitted
	// request held before it is forwarded.
	Delay time.Duration
	// Source says what answered for this policy.
	Source Source
}

// Decision is the answer to one request.
type Decision struct {
	// Allowed is false when an enforced policy rejects.
	Allowed bool
	// Delay is how long to hold an admitted request (the largest delay of
	// the enforced shaping policies).
	Delay time.Duration
	// Source is what answered; with several subjects, the least exact one
	// (fallback over deny cache over store).
	Source Source
	// Policies holds one entry per policy evaluated, in policy-set order
	// grouped by subject.
	Policies []PolicyDecision
}

// RetryAfter is the time after which the rejected request could succeed:
// the largest RetryAfter of the enforced policies that reject. 0 when
// allowed.
func (d *Decision) RetryAfter() time.Duration {
	var ra time.Duration
	if d.Allowed {
		return 0
	}
	for i := range d.Policies {
		p := &d.Policies[i]
		if !p.Allowed && p.Policy.Mode == Enforce && p.RetryAfter > ra {
			ra = p.RetryAfter
		}
	}
	return ra
}

// Check decides req at the limiter's clock time. See CheckAt.
func (l *Limiter) Check(ctx context.Context, req Request) (Decision, error) {
	return l.CheckAt(ctx, l.clock.Now(), req)
}

// maxSubjects is the number of subject kinds.
const maxSubjects = 4

// CheckAt decides req at now: it selects the policies that match the
// request, groups them by subject, and evaluates each group in one atomic
// store call. With no matching policy the request is allowed (SourceNone).
// A store error is returned with a zero Decision: nothing was decided.
func (l *Limiter) CheckAt(ctx context.Context, now time.Time, req Request) (Decision, error) {
	policies := *l.policies.Load()
	var kinds [maxSubjects]SubjectKind
	nk := 0
	for _, p := range policies {
		if !p.Matches(req.Identity.Tier, req.Method, req.Path) {
			continue
		}
		seen := false
		for _, k := range kinds[:nk] {
			if k == p.Subject {
				seen = true
				break
			}
		}
		if !seen && nk < maxSubjects {
			kinds[nk] = p.Subject
			nk++
		}
	}
	d := Decision{Allowed: true, Source: SourceNone}
	var group [8]*Policy
	for _, kind := range kinds[:nk] {
		subj, ok := req.Identity.Subject(kind)
		if !ok {
			continue
		}
		g := group[:0]
		for _, p := range policies {
			if p.Subject == kind && p.Matches(req.Identity.Tier, req.Method, req.Path) {
				g = append(g, p)
			}
		}
		if err := l.evalGroup(ctx, now, subj, g, req, &d); err != nil {
			return Decision{}, err
		}
	}
	return d, nil
}

// CheckSubjectAt evaluates the given policies for one subject at now,
// bypassing policy selection, with one cost for all of them (0 peeks). The
// simulator and tools use it; gateways use Check.
func (l *Limiter) CheckSubjectAt(ctx context.Context, now time.Time, subject Subject, policies []*Policy, cost int64) (Decision, error) {
	for i, p := range policies {
		if p == nil || !p.validated {
			return Decision{}, fmt.Errorf("%w: policies[%d]", ErrNoPolicies, i)
		}
	}
	d := Decision{Allowed: true, Source: SourceNone}
	req := Request{Cost: cost, Peek: cost == 0}
	if err := l.evalGroup(ctx, now, subject, policies, req, &d); err != nil {
		return Decision{}, err
	}
	return d, nil
}

func (l *Limiter) evalGroup(ctx context.Context, now time.Time, subj Subject, policies []*Policy, req Request, d *Decision) error {
	if len(policies) == 0 {
		return nil
	}
	var opBuf [8]op
	var resBuf [8]result
	ops, res := opBuf[:0], resBuf[:0]
	if len(policies) > len(opBuf) {
		ops, res = make([]op, 0, len(policies)), make([]result, 0, len(policies))
	}
	for _, p := range policies {
		cost := req.Cost
		if req.Peek {
			cost = 0
		} else if cost <= 0 {
			cost = p.CostOf(req.Method, req.Path)
		}
		ops = append(ops, l.opFor(p, cost))
		res = append(res, result{})
	}
	allowed, err := l.store.eval(ctx, now, subj.Key(), ops, res)
	if err != nil {
		return err
	}
	if !allowed {
		d.Allowed = false
	}
	d.Source = SourceStore
	if d.Policies == nil {
		d.Policies = make([]PolicyDecision, 0, len(policies))
	}
	for i, p := range policies {
		r := &res[i]
		pd := PolicyDecision{
			Policy:     p,
			Subject:    subj,
			Allowed:    r.allowed,
			Cost:       ops[i].cost,
			Limit:      p.capacity(),
			Remaining:  r.remaining,
			ResetAfter: time.Duration(r.resetMs) * time.Millisecond,
			Delay:      time.Duration(r.delayMs) * time.Millisecond,
			Source:     SourceStore,
		}
		if r.retryMs < 0 {
			pd.Never = true
			pd.RetryAfter = pd.ResetAfter
		} else {
			pd.RetryAfter = time.Duration(r.retryMs) * time.Millisecond
		}
		if p.Mode == Enforce && pd.Delay > d.Delay {
			d.Delay = pd.Delay
		}
		d.Policies = append(d.Policies, pd)
	}
	if !d.Allowed {
		d.Delay = 0
	}
	return nil
}

// opFor builds the store operation of one policy.
func (l *Limiter) opFor(p *Policy, cost int64) op {
	o := op{
		algo:     p.Algorithm,
		enforce:  p.Mode == Enforce,
		global:   p.Scope == ScopeGlobal && p.Algorithm.isBucket(),
		cost:     cost,
		rate:     p.rateMilli,
		burst:    p.burstMilli,
		limit:    p.Limit,
		windowMs: p.WindowSec * 1000,
		policy:   p.ID,
	}
	if o.global && l.regions > 1 {
		o.rate = max(1, o.rate/l.regions)
		o.burst = max(1, o.burst/l.regions)
	}
	return o
}
