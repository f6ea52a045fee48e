package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Clock tells the time. The zero Config uses the system clock.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Config configures a Limiter. Start from DefaultConfig; a zero field takes
// its default, a negative one (where noted) turns the feature off.
type Config struct {
	// Store holds the buckets. Default: a new MemoryStore.
	Store Store
	// Clock gives the time for in-process decisions (the MemoryStore's
	// time, the breaker, the deny cache, the fallback and usage epochs).
	// Default: the system clock. The RedisStore always decides with Redis
	// server time; store deadlines are wall-clock.
	Clock Clock
	// Regions is the number of regions that share every global policy;
	// a key without a share record gets 1/Regions of the global rate and
	// burst (rounded down). Default 1.
	Regions int
	// Region is this region's name: replicated (global fixed-window)
	// counts are kept per region under it. 1 to 64 of [A-Za-z0-9._-].
	// Default "local".
	Region string

	// The resilience layer (deadline, breaker, fallback, deny cache)
	// applies to remote stores only (any Store but the MemoryStore, which
	// cannot fail).

	// Deadline bounds every store call. No Check waits longer than
	// Deadline plus scheduling time: the call runs in its own goroutine
	// and is abandoned when the deadline passes. Default 5 ms.
	Deadline time.Duration
	// Breaker configures the circuit breaker. Default DefaultBreakerConfig.
	Breaker BreakerConfig
	// Instances is the number of gateway instances of the region; a
	// FailLocal policy falls back to rate and burst / Instances per
	// instance. Default 1.
	Instances int
	// OpenFactor multiplies rate and burst for FailOpen fallbacks, per
	// instance. Default 2.
	OpenFactor float64
	// FallbackMaxKeys bounds the in-process fallback limiters, one per
	// (policy, subject). Default 100000.
	FallbackMaxKeys int
	// DenyCacheMaxKeys bounds the local deny cache, one entry per (policy,
	// subject). Default 100000; negative disables the cache.
	DenyCacheMaxKeys int

	// UsageEpoch is the epoch length for usage of global policies: epoch =
	// floor(unix_ms / UsageEpoch in ms). Default 10 s.
	UsageEpoch time.Duration
	// UsageMaxKeys bounds the usage counts held in memory (pending
	// flushes included), one per (epoch, policy, subject) of a global
	// policy. Each costs about 180 bytes of heap (176 B measured with
	// 16-byte API keys, BenchmarkUsageMemoryPerKey) and about 250 B while
	// a flush runs, so the default 1<<20 holds at most about 185 MB. Size
	// it above the distinct keys of global policies one gateway sees in
	// about two epochs (an epoch's counts stay until flushed, every
	// UsageFlusher interval). Beyond it, a new key's usage is dropped:
	// counted in quotient_limiter_usage_overflow_keys_total and
	// _requests_total, and the epoch is marked incomplete for the
	// coordinator (UsageOverflow), which then holds the region's shares
	// instead of shrinking the keys it cannot see. Default 1<<20.
	UsageMaxKeys int

	// Events receives sampled decisions. Default SlogSink{Logger}.
	Events EventSink
	// EventSampleRate is the fraction of decisions sent to Events.
	// Default 0.01; negative disables events.
	EventSampleRate float64
	// EventSeed seeds the sampler (deterministic tests). Default 1.
	EventSeed uint64
	// Logger receives the limiter's own log lines and, by default, the
	// events. Default: discard.
	Logger *slog.Logger
	// Metrics, when set, receives the limiter's metrics (see metrics.go).
	// Default: none.
	Metrics prometheus.Registerer
	// Overrides, when set, is asked for a per-subject override of every
	// policy a request selects (the admin API's POST /v1/overrides). Default:
	// none.
	Overrides Overrides
}

// registerStoreMetrics registers the RedisStore's own counters (see
// metrics.go): refunds that failed and, for a pipelined store, calls shed
// because its queue was full.
func registerStoreMetrics(reg prometheus.Registerer, rs *RedisStore) error {
	if err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "quotient_limiter_refund_failures_total",
		Help: "Refunds of a request split across Redis Cluster nodes that failed, each leaving one subject charged for a refused request.",
	}, func() float64 { return float64(rs.RefundFailures()) })); err != nil {
		return err
	}
	if rs.pipe == nil {
		return nil
	}
	return reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "quotient_limiter_pipeline_shed_total",
		Help: "Store calls the pipeline refused at once because MaxQueue calls were waiting (answered by the fallback).",
	}, func() float64 { return float64(rs.pipe.shed.Load()) }))
}

// Overrides gives the per-subject overrides of policies.
type Overrides interface {
	// Override returns the policy to enforce instead of the policy with id
	// policyID for subject at now, and true; or false when there is none.
	// The returned policy must be validated and keep policyID, so that it
	// counts in the same buckets. It is called on every Check for every
	// selected policy: it must be fast, must not block, and must be safe
	// for concurrent use. The limiter does not modify what it returns.
	Override(subject Subject, policyID string, now time.Time) (*Policy, bool)
}

// DefaultConfig is an in-memory limiter on the system clock, one region,
// with the documented defaults filled in.
func DefaultConfig() Config {
	return Config{
		Regions:          1,
		Deadline:         5 * time.Millisecond,
		Breaker:          DefaultBreakerConfig(),
		Instances:        1,
		OpenFactor:       2,
		FallbackMaxKeys:  100_000,
		DenyCacheMaxKeys: 100_000,
		UsageEpoch:       10 * time.Second,
		UsageMaxKeys:     1 << 20,
		EventSampleRate:  0.01,
		EventSeed:        1,
	}
}

// Validate fills defaults and rejects bad values, naming the field.
func (c *Config) Validate() error {
	d := DefaultConfig()
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
	if c.Region == "" {
		c.Region = "local"
	}
	if !idPattern.MatchString(c.Region) {
		return fmt.Errorf("limiter: config: Region %q must be 1 to 64 characters of A-Z a-z 0-9 . _ -", c.Region)
	}
	if c.Deadline == 0 {
		c.Deadline = d.Deadline
	}
	if c.Deadline < 0 {
		return fmt.Errorf("limiter: config: Deadline must be > 0, got %v", c.Deadline)
	}
	if err := c.Breaker.validate(); err != nil {
		return err
	}
	if c.Instances == 0 {
		c.Instances = d.Instances
	}
	if c.Instances < 0 {
		return fmt.Errorf("limiter: config: Instances must be >= 1, got %d", c.Instances)
	}
	if c.OpenFactor == 0 {
		c.OpenFactor = d.OpenFactor
	}
	if c.OpenFactor < 0 || c.OpenFactor > 1000 {
		return fmt.Errorf("limiter: config: OpenFactor must be in (0, 1000], got %v", c.OpenFactor)
	}
	if c.FallbackMaxKeys == 0 {
		c.FallbackMaxKeys = d.FallbackMaxKeys
	}
	if c.FallbackMaxKeys < 0 {
		return fmt.Errorf("limiter: config: FallbackMaxKeys must be >= 1, got %d", c.FallbackMaxKeys)
	}
	if c.DenyCacheMaxKeys == 0 {
		c.DenyCacheMaxKeys = d.DenyCacheMaxKeys
	}
	if c.UsageEpoch == 0 {
		c.UsageEpoch = d.UsageEpoch
	}
	if c.UsageEpoch < time.Millisecond {
		return fmt.Errorf("limiter: config: UsageEpoch must be at least 1ms, got %v", c.UsageEpoch)
	}
	if c.UsageMaxKeys == 0 {
		c.UsageMaxKeys = d.UsageMaxKeys
	}
	if c.UsageMaxKeys < 0 {
		return fmt.Errorf("limiter: config: UsageMaxKeys must be >= 1, got %d", c.UsageMaxKeys)
	}
	if c.EventSampleRate == 0 {
		c.EventSampleRate = d.EventSampleRate
	}
	if c.EventSampleRate > 1 {
		return fmt.Errorf("limiter: config: EventSampleRate must be at most 1, got %v", c.EventSampleRate)
	}
	if c.EventSeed == 0 {
		c.EventSeed = d.EventSeed
	}
	if c.Logger == nil {
		c.Logger = discardLogger()
	}
	if c.Events == nil {
		c.Events = SlogSink{Logger: c.Logger}
	}
	return nil
}

// Limiter decides requests against a set of policies. It is safe for
// concurrent use; the policy set can be swapped at any time with
// SetPolicies and every Check sees one whole set.
type Limiter struct {
	store Store
	clock Clock
	// rset is the region set in force (Config.Regions and Config.Region,
	// or what SetRegions made them).
	rset atomic.Pointer[regionState]
	// overrides is Config.Overrides (nil: none).
	overrides Overrides
	policies  atomic.Pointer[[]*Policy]

	remote   bool         // the resilience layer applies
	mem      *MemoryStore // store, when it is the MemoryStore (else nil)
	deadline time.Duration
	breaker  *Breaker
	deny     *denyCache // nil: disabled
	fb       *fallback
	usage    *usageCounter
	events   EventSink
	sampler  *sampler
	metrics  *metrics // nil: none
	logger   *slog.Logger
}

// ErrNoPolicies is returned by SetPolicies for a policy that was not
// validated.
var ErrNoPolicies = errors.New("limiter: policy not validated")

// New returns a Limiter enforcing policies, which must come from
// ParsePolicies or have passed Validate. The Limiter keeps deep copies of
// them (see SetPolicies): changing a policy after New changes nothing the
// Limiter decides. It fails when cfg is invalid, when a policy is not
// validated (ErrNoPolicies) or no longer valid (ErrInvalidPolicy), or when
// its metrics cannot be registered.
func New(cfg Config, policies []*Policy) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	mem, inMemory := cfg.Store.(*MemoryStore)
	l := &Limiter{
		store:     cfg.Store,
		mem:       mem,
		clock:     cfg.Clock,
		overrides: cfg.Overrides,
		remote:    !inMemory,
		deadline:  cfg.Deadline,
		fb:        newFallback(cfg.FallbackMaxKeys, cfg.OpenFactor, cfg.Instances, cfg.Regions),
		usage:     newUsageCounter(cfg.UsageEpoch, cfg.UsageMaxKeys),
		events:    cfg.Events,
		sampler:   newSampler(cfg.EventSampleRate, cfg.EventSeed),
		logger:    cfg.Logger,
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("limiter: config: Metrics: %w", err)
	}
	l.metrics = m
	if rs, ok := cfg.Store.(*RedisStore); ok && cfg.Metrics != nil {
		if err := registerStoreMetrics(cfg.Metrics, rs); err != nil {
			return nil, fmt.Errorf("limiter: config: Metrics: %w", err)
		}
	}
	l.rset.Store(&regionState{n: int64(cfg.Regions), name: cfg.Region})
	if l.breaker, err = NewBreaker(cfg.Breaker); err != nil {
		return nil, err
	}
	if m != nil {
		l.breaker.onChange = m.breakerState
		l.usage.onDrop = m.usageOverflow
	}
	if cfg.DenyCacheMaxKeys > 0 {
		l.deny = newDenyCache(cfg.DenyCacheMaxKeys)
	}
	if err := l.SetPolicies(policies); err != nil {
		return nil, err
	}
	return l, nil
}

// SetPolicies replaces the policy set atomically. Policies must be
// validated (ParsePolicies, ParsePolicy or Policy.Validate); on error the
// old set stays in force. The limiter keeps its own deep copy of each
// policy, validated again as copied (so a policy changed after its
// Validate is refused with the error naming policies[i]), and decides
// with the copies only: the caller may change or reuse the policies and
// the slice afterwards without changing anything the limiter decides.
// Policies and PolicyDecision.Policy return the copies. The deny cache and
// the fallback limiters are cleared, so a loosened policy takes effect at
// once. Safe for concurrent use with every other method.
func (l *Limiter) SetPolicies(policies []*Policy) error {
	cp := make([]*Policy, len(policies))
	for i, p := range policies {
		if p == nil || !p.validated {
			return fmt.Errorf("%w: policies[%d]", ErrNoPolicies, i)
		}
		c := p.clone()
		var pr problems
		c.validate(fmt.Sprintf("policies[%d]", i), &pr)
		if err := pr.err(); err != nil {
			return err
		}
		cp[i] = c
	}
	l.policies.Store(&cp)
	if l.deny != nil {
		l.deny.clear()
	}
	l.fb.clear()
	l.metrics.forget()
	return nil
}

// Policies returns the policy set in force: the limiter's own copies (see
// SetPolicies), shared with every decision. The caller must not modify
// them or the slice; to change a policy, pass a new set to SetPolicies.
func (l *Limiter) Policies() []*Policy { return *l.policies.Load() }

// Now is the limiter's clock time.
func (l *Limiter) Now() time.Time { return l.clock.Now() }

// BreakerState is the circuit breaker's state at the limiter's clock time.
func (l *Limiter) BreakerState() BreakerState { return l.breaker.State(l.clock.Now()) }

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
	// SourceFallback: the store could not answer (error, deadline, open
	// circuit breaker); the policy's failure mode decided.
	SourceFallback Source = "fallback"
	// SourceNone: no policy applied.
	SourceNone Source = "none"
)

// PolicyDecision is one policy's part of a Decision.
type PolicyDecision struct {
	// Policy is the policy evaluated: for a policy of the limiter's set,
	// the limiter's own copy (the pointer Policies returns, not the one
	// given to New or SetPolicies); for one passed to a call (AllowN,
	// CheckSubjectsInto) or returned by Overrides, that policy. Shared
	// with other decisions: do not modify it.
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
	// Remaining cost units after this request, at most Limit (a fallback
	// that fails open counts against a larger in-process quota: see
	// Policy.OnStoreFailure; it reports at most the policy's own).
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
	// FailedClosed is set when the store could not answer and the
	// policy's failure mode is closed: the policy rejects (or, in shadow
	// mode, would reject) because nothing could decide.
	FailedClosed bool
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
	// grouped by subject. On a Redis Cluster whose nodes split the
	// request's subjects, the subjects after the first one that rejects
	// are not evaluated and have no entry, and the subjects before it,
	// whose consumption was refunded, report Remaining as before the
	// request and ResetAfter as if it had consumed (an upper bound).
	Policies []PolicyDecision
}

// reset makes d the decision of a request no policy applies to, keeping
// d.Policies' storage. (Field by field: assigning a Decision literal
// builds it on the stack and copies it.)
func (d *Decision) reset() {
	d.Allowed = true
	d.Delay = 0
	d.Source = SourceNone
	d.Policies = d.Policies[:0]
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

// FailedClosed reports whether the request was rejected because an
// enforced fail-closed policy could not be decided (the store was
// unavailable): a service error rather than the client's excess.
func (d *Decision) FailedClosed() bool {
	if d.Allowed {
		return false
	}
	for i := range d.Policies {
		p := &d.Policies[i]
		if p.FailedClosed && p.Policy.Mode == Enforce {
			return true
		}
	}
	return false
}

// ErrCanceled is returned by Check when the caller's context ended before
// a decision: nothing was decided (the store may or may not have
// consumed).
var ErrCanceled = errors.New("limiter: check canceled")

// Check decides req at the limiter's clock time. See CheckAt.
func (l *Limiter) Check(ctx context.Context, req Request) (Decision, error) {
	var d Decision
	err := l.CheckInto(ctx, l.clock.Now(), req, &d)
	return d, err
}

// CheckAt decides req at now. See CheckInto.
func (l *Limiter) CheckAt(ctx context.Context, now time.Time, req Request) (Decision, error) {
	var d Decision
	err := l.CheckInto(ctx, now, req, &d)
	return d, err
}

// maxSubjects is the number of subject kinds.
const maxSubjects = 4

// SubjectPolicies is one subject of a request and the policies, already
// selected, that limit it: one entry of CheckSubjectsInto.
type SubjectPolicies struct {
	Subject  Subject
	Policies []*Policy
}

// CheckInto decides req at now into d, reusing d.Policies' storage (so a
// caller that pools Decisions makes a deny-cache hit allocate nothing).
// It selects the policies that match the request, groups them by subject
// (the identity's subjects, in the policy set's order of subject kinds)
// and decides the request as one, all or nothing across the subjects (see
// CheckSubjectsInto for the steps). The only error is ErrCanceled
// (wrapping the context's error) when ctx ends first; with the
// MemoryStore no error occurs. A store failure never surfaces as an
// error: the fallback answers.
func (l *Limiter) CheckInto(ctx context.Context, now time.Time, req Request, d *Decision) error {
	var start time.Time
	if l.metrics != nil {
		start = time.Now()
	}
	d.reset()
	policies := *l.policies.Load()
	var kinds [maxSubjects]SubjectKind
	nk := 0
	// matched[i/64] bit i%64: policies[i] matches the request (Matches
	// runs once per policy).
	var matchedBuf [2]uint64
	matched := matchedBuf[:]
	if n := (len(policies) + 63) / 64; n > len(matchedBuf) {
		matched = make([]uint64, n)
	}
	nm := 0 // policies matched
	for i, p := range policies {
		if !p.Matches(req.Identity.Tier, req.Method, req.Path) {
			continue
		}
		nm++
		matched[i/64] |= 1 << (i % 64)
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
	// The request's policies, flattened: subjs[i] is the subject of
	// pols[i], one subject's policies consecutive. Flat arrays (not a
	// slice of groups) keep both on the stack: arrays of 4 for most
	// requests, of 16 (zeroed only when needed: 640 bytes) beyond.
	var polBuf [4]*Policy
	var subjBuf [4]Subject
	pols, subjs := polBuf[:0], subjBuf[:0]
	if nm > len(polBuf) {
		var polBuf16 [16]*Policy
		var subjBuf16 [16]Subject
		pols, subjs = polBuf16[:0], subjBuf16[:0]
	}
	for _, kind := range kinds[:nk] {
		subj, ok := req.Identity.Subject(kind)
		if !ok {
			continue
		}
		for i, p := range policies {
			if p.Subject == kind && matched[i/64]&(1<<(i%64)) != 0 {
				if l.overrides != nil {
					if o, ok := l.overrides.Override(subj, p.ID, now); ok && o != nil && o.validated && o.ID == p.ID {
						p = o
					}
				}
				pols, subjs = append(pols, p), append(subjs, subj)
			}
		}
	}
	return l.finish(ctx, now, start, pols, subjs, &req, d)
}

// CheckSubjectsInto decides one request whose subjects and policies the
// caller has already selected (an RLS server maps the descriptors of one
// ShouldRateLimit call to subjects and policies and calls it once), into
// d, as CheckInto does after selection. Overrides (Config.Overrides) are
// applied per subject. req gives the route (for policy costs), Cost and
// Peek; its Identity is ignored. Entries with no policies are skipped;
// subjects are decided in the order given (on a split cluster, the order
// of the calls: put first the subject most likely to reject, so fewer
// requests need a refund). Safe for concurrent use.
//
// The request is all or nothing across its subjects: if any enforced
// policy of any subject rejects, no policy of any subject consumes
// (shadow policies consume only when the request is admitted). Steps:
//
//  1. deny cache (remote stores): if an enforced policy of any subject
//     rejected that subject recently for at most this cost and its retry
//     time has not come, the request is rejected locally
//     (SourceDenyCache) without a store call for any subject, and only the
//     cached policies are reported;
//  2. the store, bounded by Config.Deadline, unless the circuit breaker
//     is open (SourceStore): one atomic call when every subject lives on
//     one Redis node (or in the MemoryStore); on a Redis Cluster whose
//     nodes split the subjects, one call per subject in order, stopping
//     at the first rejection (later subjects are then not reported) and
//     refunding earlier subjects (see refund.go: the window and what is
//     exact). A rejected request may then take up to twice the deadline;
//  3. when the store fails, times out or the breaker is open, the
//     in-process fallback of each policy's failure mode, for all
//     subjects at once and all or nothing across them too (SourceFallback;
//     see fallback.go).
//
// With no policy the request is allowed (SourceNone). Usage of global
// policies is counted (demand: every attempt's cost; admitted: the cost
// consumed, so 0 for any rejected request), the decision is observed in
// the metrics and sampled to the event sink. Errors: ErrNoPolicies for a
// policy that was not validated, an error naming a subject listed twice or
// a policy listed twice for one subject, and ErrCanceled as for CheckInto.
func (l *Limiter) CheckSubjectsInto(ctx context.Context, now time.Time, subjects []SubjectPolicies, req Request, d *Decision) error {
	var start time.Time
	if l.metrics != nil {
		start = time.Now()
	}
	d.reset()
	pols, subjs, err := l.flatten(subjects, now, true)
	if err != nil {
		return err
	}
	req.Identity = Identity{}
	return l.finish(ctx, now, start, pols, subjs, &req, d)
}

// flatten checks subjects and returns its policies and, for each, its
// subject, applying overrides when asked.
func (l *Limiter) flatten(subjects []SubjectPolicies, now time.Time, overrides bool) ([]*Policy, []Subject, error) {
	var pols []*Policy
	var subjs []Subject
	for i, sp := range subjects {
		if len(sp.Policies) == 0 {
			continue
		}
		if slices.Contains(subjs, sp.Subject) {
			return nil, nil, fmt.Errorf("limiter: subjects[%d]: subject %s listed twice", i, sp.Subject.Key())
		}
		for j, p := range sp.Policies {
			if p == nil || !p.validated {
				return nil, nil, fmt.Errorf("%w: subjects[%d].Policies[%d]", ErrNoPolicies, i, j)
			}
			for _, q := range sp.Policies[:j] {
				if q.ID == p.ID {
					return nil, nil, fmt.Errorf("limiter: subjects[%d]: policy %q listed twice", i, p.ID)
				}
			}
			if overrides && l.overrides != nil {
				if o, ok := l.overrides.Override(sp.Subject, p.ID, now); ok && o != nil && o.validated && o.ID == p.ID {
					p = o
				}
			}
			pols, subjs = append(pols, p), append(subjs, sp.Subject)
		}
	}
	return pols, subjs, nil
}

// finish decides the selected policies (subjs[i] is the subject of
// pols[i]) and observes the decision.
func (l *Limiter) finish(ctx context.Context, now, start time.Time, pols []*Policy, subjs []Subject, req *Request, d *Decision) error {
	if err := l.decide(ctx, now, pols, subjs, req, d); err != nil {
		*d = Decision{Policies: d.Policies[:0]}
		return err
	}
	if !d.Allowed {
		d.Delay = 0
	}
	if l.metrics != nil {
		l.metrics.observe(d, time.Since(start))
	}
	if len(d.Policies) > 0 && l.eventsEnabled() && l.sampler.sample() {
		l.events.Emit(newEvent(now, req, d))
	}
	return nil
}

// eventsEnabled reports whether an event can go anywhere: false for the
// default sink on a logger that drops Info records (the default discard
// logger), so that neither the sampler's shared counter is touched nor an
// event built (about 1.3 KB of allocations) for nothing. For any other
// sink the sampler draws on every decision with policies, so its sequence
// is the same as before.
func (l *Limiter) eventsEnabled() bool {
	s, ok := l.events.(SlogSink)
	return !ok || (s.Logger != nil && s.Logger.Enabled(context.Background(), slog.LevelInfo))
}

// The raw paths below are not part of the public API: this module's
// simulator, the coordinator's usage endpoint and tests reach them through
// internal/rawcheck, with which rawhooks.go registers them.

// checkSubjectAt evaluates the given policies for one subject at now,
// bypassing policy selection, with one cost for all of them (0 peeks). It
// is the raw path: one store call, with none of the resilience layer (no
// deadline, breaker, fallback or deny cache), no usage counting, metrics,
// events or overrides; a store error is returned with a zero Decision.
func (l *Limiter) checkSubjectAt(ctx context.Context, now time.Time, subject Subject, policies []*Policy, cost int64) (Decision, error) {
	for i, p := range policies {
		if p == nil || !p.validated {
			return Decision{}, fmt.Errorf("%w: policies[%d]", ErrNoPolicies, i)
		}
	}
	d := Decision{Allowed: true, Source: SourceNone}
	req := Request{Cost: cost, Peek: cost == 0}
	subjs := make([]Subject, len(policies))
	for i := range subjs {
		subjs[i] = subject
	}
	if _, err := l.evalAll(ctx, now, policies, subjs, &req, &d, false); err != nil {
		return Decision{}, err
	}
	return d, nil
}

// checkSubjectsAt is checkSubjectAt for several subjects of one request
// (the simulator's requests that several subjects limit): one store
// decision, all or nothing across the subjects as in Check, with one cost
// for every policy (0 peeks), and none of the resilience layer, usage,
// metrics, events or overrides. Errors: those of CheckSubjectsInto's
// checks, and a store error with a zero Decision.
func (l *Limiter) checkSubjectsAt(ctx context.Context, now time.Time, subjects []SubjectPolicies, cost int64) (Decision, error) {
	pols, subjs, err := l.flatten(subjects, now, false)
	if err != nil {
		return Decision{}, err
	}
	d := Decision{Allowed: true, Source: SourceNone}
	if len(pols) == 0 {
		return d, nil
	}
	req := Request{Cost: cost, Peek: cost == 0}
	if _, err := l.evalAll(ctx, now, pols, subjs, &req, &d, false); err != nil {
		return Decision{}, err
	}
	return d, nil
}

// checkSubjectsFallbackAt answers the policies of several subjects of one
// request at now as Check does while the store cannot answer: each
// policy's on_store_failure decides (open and local through in-process
// limiters at now, closed rejects with FailedClosed set), all or nothing
// across the subjects. It skips usage counting, metrics, events and
// overrides. The simulator models a store outage with it.
func (l *Limiter) checkSubjectsFallbackAt(now time.Time, subjects []SubjectPolicies, cost int64) (Decision, error) {
	pols, subjs, err := l.flatten(subjects, now, false)
	if err != nil {
		return Decision{}, err
	}
	costs := make([]int64, len(pols))
	for i := range costs {
		costs[i] = cost
	}
	d := Decision{Allowed: true, Source: SourceFallback, Policies: make([]PolicyDecision, len(pols))}
	closedRetry := max(time.Second, ceilMs(l.breaker.RetryAfter(now)))
	d.Allowed = l.fb.decide(now, subjs, pols, costs, closedRetry, d.Policies)
	foldDelay(&d, d.Policies)
	return d, nil
}

// costOf is the cost req charges under p.
func costOf(p *Policy, req *Request) int64 {
	switch {
	case req.Peek:
		return 0
	case req.Cost > 0:
		return req.Cost
	}
	return p.CostOf(req.Method, req.Path)
}

// worse is the less exact of two sources (fallback > deny cache > store).
func worse(a, b Source) Source {
	rank := func(s Source) int {
		switch s {
		case SourceFallback:
			return 3
		case SourceDenyCache:
			return 2
		case SourceStore:
			return 1
		}
		return 0
	}
	if rank(b) > rank(a) {
		return b
	}
	return a
}

// decide decides the request's policies (see CheckSubjectsInto) and
// appends their PolicyDecisions to d.
func (l *Limiter) decide(ctx context.Context, now time.Time, pols []*Policy, subjs []Subject, req *Request, d *Decision) error {
	if len(pols) == 0 {
		return nil
	}
	if !l.remote {
		_, err := l.evalAll(ctx, now, pols, subjs, req, d, true)
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrCanceled, err)
	}
	nowNs := now.UnixNano()
	if l.deny != nil && !req.Peek && l.denyHit(now, nowNs, pols, subjs, req, d, false) {
		return nil
	}
	ok, probe := l.breaker.Allow(now)
	if ok {
		base := len(d.Policies)
		_, err := l.evalAllDeadline(ctx, now, pols, subjs, req, d)
		if err == nil {
			l.breaker.Record(now, probe, true)
			l.fillDenyCache(nowNs, d.Policies[base:], req)
			return nil
		}
		if ctx.Err() != nil {
			// The caller gave up; not the store's fault.
			l.breaker.Record(now, probe, true)
			return fmt.Errorf("%w: %w", ErrCanceled, ctx.Err())
		}
		l.breaker.recordStoreErr(now, probe, err)
		l.metrics.storeError()
	}
	return l.fallbackAll(now, pols, subjs, req, d)
}

// denyHit answers the whole request from the deny cache if an enforced
// policy of any of its subjects rejects req's cost there: no store call
// is made for any subject, and only the cached policies are reported.
// With stale (the store cannot answer), an entry answers until the
// store's retry time (denyCache.lookupStale).
func (l *Limiter) denyHit(now time.Time, nowNs int64, pols []*Policy, subjs []Subject, req *Request, d *Decision, stale bool) bool {
	hit := false
	lookup := l.deny.lookup
	if stale {
		lookup = l.deny.lookupStale
	}
	for i, p := range pols {
		if p.Mode != Enforce {
			continue
		}
		subj := subjs[i]
		cost := costOf(p, req)
		e, ok := lookup(denyKey{policy: p.ID, kind: subj.Kind, value: subj.Value}, cost, nowNs)
		if !ok {
			continue
		}
		hit = true
		retryAt := e.until
		if e.retryAt != 0 {
			retryAt = e.retryAt
		}
		retry := ceilMs(time.Duration(retryAt - nowNs))
		reset := max(retry, ceilMs(time.Duration(e.resetAt-nowNs)))
		d.Policies = append(d.Policies, PolicyDecision{
			Policy:     p,
			Subject:    subj,
			Cost:       cost,
			Limit:      p.capacity(),
			Remaining:  e.remaining,
			ResetAfter: reset,
			RetryAfter: retry,
			Never:      cost > p.capacity(),
			Source:     SourceDenyCache,
		})
	}
	if !hit {
		return false
	}
	d.Allowed = false
	d.Source = worse(d.Source, SourceDenyCache)
	for i, p := range pols {
		if p.Scope == ScopeGlobal {
			l.usage.add(now, p.ID, subjs[i], costOf(p, req), 0)
		}
	}
	return true
}

// fillDenyCache remembers the enforced policies that rejected.
func (l *Limiter) fillDenyCache(nowNs int64, pds []PolicyDecision, req *Request) {
	if l.deny == nil || req.Peek {
		return
	}
	for i := range pds {
		pd := &pds[i]
		if pd.Allowed || pd.Policy.Mode != Enforce || pd.RetryAfter <= 0 {
			continue
		}
		retryAt := nowNs + int64(pd.RetryAfter)
		until := retryAt
		if pd.Policy.Scope == ScopeGlobal {
			// The region's share of a global policy can grow at any
			// decision of the coordinator, which the gateway does not
			// see: a rejection answers locally for at most a tenth
			// of the usage epoch (the coordinators' epoch: 1 s at the
			// default 10 s), then the store decides again.
			until = min(until, nowNs+l.usage.epochMs*int64(time.Millisecond)/10)
		}
		l.deny.add(denyKey{policy: pd.Policy.ID, kind: pd.Subject.Kind, value: pd.Subject.Value}, denyEntry{
			until:     until,
			retryAt:   retryAt,
			resetAt:   nowNs + int64(pd.ResetAfter),
			cost:      pd.Cost,
			remaining: pd.Remaining,
		}, nowNs)
	}
}

// fallbackAll answers the request in process, all subjects at once. A
// request the store rejected for an enforced policy, with a retry time
// still to come, is rejected again from the deny cache (denyHit, stale)
// before the fallback's own limiters count anything: the store's last
// word stands while it cannot speak (the request's Source is still
// SourceFallback, its cached policies' SourceDenyCache).
func (l *Limiter) fallbackAll(now time.Time, pols []*Policy, subjs []Subject, req *Request, d *Decision) error {
	if l.deny != nil && !req.Peek && l.denyHit(now, now.UnixNano(), pols, subjs, req, d, true) {
		d.Source = worse(d.Source, SourceFallback)
		return nil
	}
	var costBuf [16]int64
	costs := costBuf[:0]
	for _, p := range pols {
		costs = append(costs, costOf(p, req))
	}
	base := len(d.Policies)
	for range pols {
		d.Policies = append(d.Policies, PolicyDecision{})
	}
	closedRetry := max(time.Second, ceilMs(l.breaker.RetryAfter(now)))
	allowed := l.fb.decide(now, subjs, pols, costs, closedRetry, d.Policies[base:])
	if !allowed {
		d.Allowed = false
	}
	foldDelay(d, d.Policies[base:])
	d.Source = worse(d.Source, SourceFallback)
	if !req.Peek {
		for i, p := range pols {
			if p.Scope != ScopeGlobal {
				continue
			}
			pd := &d.Policies[base+i]
			var admitted int64
			if allowed && pd.Allowed {
				admitted = pd.Cost
			}
			l.usage.add(now, p.ID, subjs[i], pd.Cost, admitted)
		}
	}
	return nil
}

// countUsage adds demand (every op's cost, skipped ones included) and
// admitted cost (what was consumed: only when the request is allowed) of
// the request's global policies.
func (l *Limiter) countUsage(now time.Time, req *Request, pols []*Policy, subjs []Subject, ops []op, res []result, allowed bool) {
	if req.Peek {
		return
	}
	for i, p := range pols {
		if p.Scope != ScopeGlobal {
			continue
		}
		var admitted int64
		if allowed && res[i].allowed && !res[i].skipped {
			admitted = ops[i].cost
		}
		l.usage.add(now, p.ID, subjs[i], ops[i].cost, admitted)
	}
}

// storeCall is one store call run in its own goroutine, so that the
// caller can abandon it at the deadline; it owns copies of the buffers.
type storeCall struct {
	subjs   []Subject
	ops     []op
	res     []result
	allowed bool
	err     error
	done    chan struct{}
}

// evalAllDeadline is evalAll (with usage counted) with the store call
// bounded by the deadline, whatever the store does.
func (l *Limiter) evalAllDeadline(ctx context.Context, now time.Time, pols []*Policy, subjs []Subject, req *Request, d *Decision) (bool, error) {
	if rs, ok := l.store.(*RedisStore); ok && rs.pipe != nil {
		// The caller waits only in the pipeline, which ends the wait at
		// the deadline with a pooled timer: no context and timer of its
		// own per call.
		return l.evalAllWith(ctx, now, pols, subjs, req, d, true, func(ctx context.Context, subjs []Subject, ops []op, res []result) (bool, error) {
			cctx := &callCtx{Context: ctx, deadline: time.Now().Add(l.deadline)}
			allowed, err := rs.eval(cctx, now, subjs, ops, res)
			if err != nil && cctx.Err() != nil && ctx.Err() == nil {
				return false, fmt.Errorf("%w: no answer within %v: %v", ErrStoreUnavailable, l.deadline, err)
			}
			return allowed, err
		})
	}
	if rs, ok := l.store.(*RedisStore); ok && rs.boundedByContext {
		// go-redis ends every wait of the call at the context's deadline.
		return l.evalAllWith(ctx, now, pols, subjs, req, d, true, func(ctx context.Context, subjs []Subject, ops []op, res []result) (bool, error) {
			cctx, cancel := context.WithTimeout(ctx, l.deadline)
			defer cancel()
			allowed, err := rs.eval(cctx, now, subjs, ops, res)
			if err != nil && cctx.Err() != nil && ctx.Err() == nil {
				return false, fmt.Errorf("%w: no answer within %v: %v", ErrStoreUnavailable, l.deadline, err)
			}
			return allowed, err
		})
	}
	return l.evalAllWith(ctx, now, pols, subjs, req, d, true, func(ctx context.Context, subjs []Subject, ops []op, res []result) (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, l.deadline)
		c := &storeCall{subjs: append([]Subject(nil), subjs...), ops: append([]op(nil), ops...), res: make([]result, len(res)), done: make(chan struct{})}
		go func() {
			defer cancel()
			c.allowed, c.err = l.store.eval(cctx, now, c.subjs, c.ops, c.res)
			close(c.done)
		}()
		select {
		case <-c.done:
		case <-cctx.Done():
			select {
			case <-c.done:
			default:
				return false, fmt.Errorf("%w: no answer within %v: %v", ErrStoreUnavailable, l.deadline, cctx.Err())
			}
		}
		copy(res, c.res)
		return c.allowed, c.err
	})
}

// evalAll decides the policies in one store call (no deadline) and
// records the answers in d; count counts usage.
func (l *Limiter) evalAll(ctx context.Context, now time.Time, pols []*Policy, subjs []Subject, req *Request, d *Decision, count bool) (bool, error) {
	if l.mem != nil {
		return l.evalInMemory(ctx, l.mem, now, pols, subjs, req, d, count)
	}
	return l.evalAllWith(ctx, now, pols, subjs, req, d, count, nil)
}

func (l *Limiter) evalAllWith(ctx context.Context, now time.Time, pols []*Policy, subjs []Subject, req *Request, d *Decision, count bool, eval func(context.Context, []Subject, []op, []result) (bool, error)) (bool, error) {
	// Pooled buffers: subjs may live on the caller's stack, and through a
	// func value or the Store interface it would have to escape. No store
	// keeps them after eval returns (the goroutine of a call abandoned at
	// its deadline works on copies, a pipelined call on its request
	// string).
	b := evalBufPool.Get().(*evalBufs)
	ops, res := l.buildOps(b.ops[:0], b.res[:0], pols, req)
	heapSubjs := append(b.subjs[:0], subjs...)
	defer func() {
		clear(ops)
		clear(heapSubjs)
		b.ops, b.res, b.subjs = ops[:0], res[:0], heapSubjs[:0]
		evalBufPool.Put(b)
	}()
	var allowed bool
	var err error
	if eval != nil {
		allowed, err = eval(ctx, heapSubjs, ops, res)
	} else {
		allowed, err = l.store.eval(ctx, now, heapSubjs, ops, res)
	}
	if err != nil {
		return false, err
	}
	l.record(d, pols, subjs, ops, res, allowed)
	if count {
		l.countUsage(now, req, pols, subjs, ops, res, allowed)
	}
	return allowed, nil
}

// evalBufs are the buffers of one evalAllWith, pooled.
type evalBufs struct {
	ops   []op
	res   []result
	subjs []Subject
}

var evalBufPool = sync.Pool{New: func() any { return new(evalBufs) }}

// evalInMemory is evalAll for the MemoryStore, called directly so that
// the buffers stay on the stack (through the Store interface they would
// escape to the heap on every decision).
func (l *Limiter) evalInMemory(ctx context.Context, ms *MemoryStore, now time.Time, pols []*Policy, subjs []Subject, req *Request, d *Decision, count bool) (bool, error) {
	var opBuf [4]op
	var resBuf [4]result
	ops, res := opBuf[:0], resBuf[:0]
	if len(pols) > len(opBuf) {
		ops, res = make([]op, 0, len(pols)), make([]result, 0, len(pols))
	}
	ops, res = l.buildOps(ops, res, pols, req)
	allowed, err := ms.eval(ctx, now, subjs, ops, res)
	if err != nil {
		return false, err
	}
	l.record(d, pols, subjs, ops, res, allowed)
	if count {
		l.countUsage(now, req, pols, subjs, ops, res, allowed)
	}
	return allowed, nil
}

// buildOps appends the store operations of policies for req, and as many
// zero results. The ops are built in place (an op is 96 bytes) under one
// region set: a concurrent SetRegions changes all of a request's ops or
// none.
func (l *Limiter) buildOps(ops []op, res []result, policies []*Policy, req *Request) ([]op, []result) {
	rs := l.rset.Load()
	n := len(ops)
	ops = slices.Grow(ops, len(policies))[:n+len(policies)]
	res = slices.Grow(res, len(policies))[:n+len(policies)]
	for i, p := range policies {
		fillOp(&ops[n+i], p, costOf(p, req), rs)
		res[n+i] = result{}
	}
	return ops, res
}

// record appends the store's answers for the request's policies to d;
// policies the store skipped are not reported.
func (l *Limiter) record(d *Decision, pols []*Policy, subjs []Subject, ops []op, res []result, allowed bool) {
	if !allowed {
		d.Allowed = false
	}
	d.Source = worse(d.Source, SourceStore)
	if d.Policies == nil {
		d.Policies = make([]PolicyDecision, 0, len(pols))
	}
	for i, p := range pols {
		r := &res[i]
		if r.skipped {
			continue
		}
		// Filled in place: a PolicyDecision is 136 bytes.
		d.Policies = append(d.Policies, PolicyDecision{})
		pd := &d.Policies[len(d.Policies)-1]
		pd.Policy = p
		pd.Subject = subjs[i]
		pd.Allowed = r.allowed
		pd.Cost = ops[i].cost
		pd.Limit = p.capacity()
		pd.Remaining = r.remaining
		pd.ResetAfter = time.Duration(r.resetMs) * time.Millisecond
		pd.Delay = time.Duration(r.delayMs) * time.Millisecond
		pd.Source = SourceStore
		if r.retryMs < 0 {
			pd.Never = true
			pd.RetryAfter = pd.ResetAfter
		} else {
			pd.RetryAfter = time.Duration(r.retryMs) * time.Millisecond
		}
		if p.Mode == Enforce && pd.Delay > d.Delay {
			d.Delay = pd.Delay
		}
	}
	if !d.Allowed {
		d.Delay = 0
	}
}

// opFor builds the store operation of one policy.
func (l *Limiter) opFor(p *Policy, cost int64) op {
	var o op
	fillOp(&o, p, cost, l.rset.Load())
	return o
}

// fillOp writes the store operation of one policy under the region set
// rs into *o (all of it: *o may hold a previous request's op).
func fillOp(o *op, p *Policy, cost int64, rs *regionState) {
	*o = op{}
	o.algo = p.Algorithm
	o.enforce = p.Mode == Enforce
	o.global = p.Scope == ScopeGlobal
	o.cost = cost
	o.rate, o.burst = p.rateMilli, p.burstMilli
	o.limit = p.Limit
	o.windowMs = p.WindowSec * 1000
	o.policy = p.ID
	o.region = rs.name
	if o.global && o.algo.isBucket() && rs.n > 1 {
		o.rate = max(1, o.rate/rs.n)
		o.burst = max(1, o.burst/rs.n)
	}
}
