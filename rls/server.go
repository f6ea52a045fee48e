package rls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/limiter/httplimit"
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// Limiter decides; its store, deadline, breaker, fallback, deny
	// cache and overrides apply to every request. Required. Its own
	// policy set is the set of Quotient policy documents that rules name
	// with rate_limit.policy (change it with Server.SetPolicies, not on
	// the limiter); the envoyproxy rules' policies are passed with each
	// request.
	Limiter *limiter.Limiter
	// Config is the configuration in force until SetConfig. Required.
	Config *Config
	// ResponseHeaders adds the draft-10 RateLimit-Policy and RateLimit
	// fields to every response (response_headers_to_add), and Retry-After
	// to over-limit responses, as envoyproxy's
	// LIMIT_RESPONSE_HEADERS_ENABLED does with its own fields. Default off.
	ResponseHeaders bool
	// MaxDelay is the longest a response is held for a shaping
	// (leaky_bucket) policy that admits with a delay, so that the
	// upstream sees the policy's drain rate; it is also bounded by the
	// caller's deadline (keep Envoy's timeout above it). Default 0:
	// answer at once (a leaky bucket then admits its queue as a burst).
	MaxDelay time.Duration
}

// Server implements envoy.service.ratelimit.v3.RateLimitService. It is
// safe for concurrent use; the configuration can be swapped at any time
// with SetConfig and every request sees one whole configuration.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer

	l        *limiter.Limiter
	cfg      atomic.Pointer[Config]
	pols     atomic.Pointer[map[string]*limiter.Policy] // the limiter's set by id
	headers  bool
	maxDelay time.Duration
	setMu    sync.Mutex // serialises SetConfig and SetPolicies

	overrides sync.Map // overrideKey -> *limiter.Policy
	nOverride atomic.Int64
	pool      sync.Pool // *call
}

// maxOverridePolicies bounds the cache of policies built for the
// per-descriptor limit overrides of requests.
const maxOverridePolicies = 4096

// ErrUnknownPolicy is wrapped by the errors of a configuration that names
// a Quotient policy missing from the policy set, and of a policy set that
// lacks a policy the configuration names.
var ErrUnknownPolicy = errors.New("rls: unknown policy")

// NewServer returns a Server. It fails when Limiter or Config is nil, when
// MaxDelay is negative, and when Config names (rate_limit.policy) a
// policy that is not in the limiter's policy set.
func NewServer(c ServerConfig) (*Server, error) {
	if c.Limiter == nil {
		return nil, errors.New("rls: ServerConfig.Limiter is required")
	}
	if c.Config == nil {
		return nil, errors.New("rls: ServerConfig.Config is required")
	}
	if c.MaxDelay < 0 {
		return nil, fmt.Errorf("rls: ServerConfig.MaxDelay must be >= 0, got %v", c.MaxDelay)
	}
	s := &Server{l: c.Limiter, headers: c.ResponseHeaders, maxDelay: c.MaxDelay}
	pols := byID(c.Limiter.Policies())
	if err := missing(c.Config, pols); err != nil {
		return nil, err
	}
	s.pols.Store(&pols)
	s.cfg.Store(c.Config)
	s.pool.New = func() any { return &call{} }
	return s, nil
}

func byID(ps []*limiter.Policy) map[string]*limiter.Policy {
	m := make(map[string]*limiter.Policy, len(ps))
	for _, p := range ps {
		m[p.ID] = p
	}
	return m
}

// missing names the first policy c names that pols lacks.
func missing(c *Config, pols map[string]*limiter.Policy) error {
	id, path := c.MissingPolicy(func(id string) bool { return pols[id] != nil })
	if id == "" {
		return nil
	}
	return fmt.Errorf("%w: %q, named by rate_limit.policy of %s, is not in the policy set (--policies or the coordinators' snapshot)", ErrUnknownPolicy, id, path)
}

// SetConfig replaces the configuration; requests in flight finish with
// the one they started with. It refuses (ErrUnknownPolicy, the old one
// stays) a configuration that names a policy missing from the policy set.
// It clears the limiter's deny cache and fallback limiters (through
// SetPolicies of the limiter's own, unchanged set), so that a raised limit
// admits at once a descriptor that the old limit had rejected until the
// end of its window.
func (s *Server) SetConfig(c *Config) error {
	if c == nil {
		return errors.New("rls: SetConfig of a nil configuration")
	}
	s.setMu.Lock()
	defer s.setMu.Unlock()
	if err := missing(c, *s.pols.Load()); err != nil {
		return err
	}
	s.cfg.Store(c)
	if err := s.l.SetPolicies(s.l.Policies()); err != nil {
		// The limiter's own set was validated when it was set.
		panic("rls: the limiter rejected its own policy set: " + err.Error())
	}
	pols := byID(s.l.Policies()) // the limiter's new copies
	s.pols.Store(&pols)
	return nil
}

// SetPolicies replaces the Quotient policy set that rules name with
// rate_limit.policy (it becomes the limiter's own set). It refuses a set
// that lacks a policy the configuration in force names (ErrUnknownPolicy)
// or that the limiter refuses; the old set then stays. Safe for concurrent
// use; requests in flight finish with the policy they found.
func (s *Server) SetPolicies(ps []*limiter.Policy) error {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	pols := byID(ps)
	if err := missing(s.cfg.Load(), pols); err != nil {
		return err
	}
	if err := s.l.SetPolicies(ps); err != nil {
		return err
	}
	// Decide with the limiter's own copies (see limiter.SetPolicies), so
	// that a caller changing ps afterwards changes nothing.
	pols = byID(s.l.Policies())
	s.pols.Store(&pols)
	return nil
}

// Config is the configuration in force.
func (s *Server) Config() *Config { return s.cfg.Load() }

// unit is one (subject, policy) decided for one or more descriptors.
type unit struct {
	subject limiter.Subject
	policy  *limiter.Policy
	cost    int64
	group   int // index into call.groups
	pd      *limiter.PolicyDecision
}

// desc is what the server knows of one request descriptor.
type desc struct {
	rule      *Rule           // nil: no rule applies (or it was replaced)
	policy    *limiter.Policy // what decides it in the store; nil: none
	limit     *rlsv3.RateLimitResponse_RateLimit
	window    int64 // seconds
	unit      int   // index into call.units; -1 when not decided by the store
	alwaysOvr bool  // requests_per_unit 0
}

type costGroup struct {
	cost     int64
	subjects []limiter.SubjectPolicies
}

type call struct {
	descs  []desc
	units  []unit
	groups []costGroup
	d      limiter.Decision
	all    []limiter.PolicyDecision
}

func (c *call) reset() {
	clear(c.units)
	clear(c.all)
	c.descs, c.units, c.groups, c.all = c.descs[:0], c.units[:0], c.groups[:0], c.all[:0]
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "rls: "+format, args...)
}

// validate checks req and returns the cost of each descriptor.
func validate(req *rlsv3.RateLimitRequest, costs []int64) ([]int64, error) {
	switch {
	case req.GetDomain() == "":
		return nil, invalid("domain is empty")
	case len(req.GetDomain()) > MaxDomainBytes:
		return nil, invalid("domain is %d bytes, more than %d", len(req.GetDomain()), MaxDomainBytes)
	case len(req.GetDescriptors()) == 0:
		return nil, invalid("no descriptors")
	case len(req.GetDescriptors()) > MaxDescriptors:
		return nil, invalid("%d descriptors, more than %d", len(req.GetDescriptors()), MaxDescriptors)
	case int64(req.GetHitsAddend()) > limiter.MaxCost:
		return nil, invalid("hits_addend %d is more than %d", req.GetHitsAddend(), int64(limiter.MaxCost))
	}
	base := max(1, int64(req.GetHitsAddend()))
	for i, d := range req.GetDescriptors() {
		if d == nil {
			return nil, invalid("descriptors[%d] is null", i)
		}
		switch n := len(d.GetEntries()); {
		case n == 0:
			return nil, invalid("descriptors[%d] has no entries", i)
		case n > MaxEntries:
			return nil, invalid("descriptors[%d] has %d entries, more than %d", i, n, MaxEntries)
		}
		size := 0
		for j, e := range d.GetEntries() {
			size += len(e.GetKey()) + len(e.GetValue())
			switch {
			case e == nil:
				return nil, invalid("descriptors[%d].entries[%d] is null", i, j)
			case e.GetKey() == "":
				return nil, invalid("descriptors[%d].entries[%d].key is empty", i, j)
			case len(e.GetKey()) > MaxEntryBytes:
				return nil, invalid("descriptors[%d].entries[%d].key is %d bytes, more than %d", i, j, len(e.GetKey()), MaxEntryBytes)
			case len(e.GetValue()) > MaxEntryBytes:
				return nil, invalid("descriptors[%d].entries[%d].value is %d bytes, more than %d", i, j, len(e.GetValue()), MaxEntryBytes)
			}
		}
		if size > MaxDescriptorBytes {
			return nil, invalid("descriptors[%d]: keys and values are %d bytes together, more than %d", i, size, MaxDescriptorBytes)
		}
		if d.GetIsNegativeHits() {
			return nil, invalid("descriptors[%d].is_negative_hits is not supported (a refund would let a caller mint quota)", i)
		}
		cost := base
		if h := d.GetHitsAddend(); h != nil {
			if h.GetValue() > limiter.MaxCost {
				return nil, invalid("descriptors[%d].hits_addend %d is more than %d", i, h.GetValue(), int64(limiter.MaxCost))
			}
			cost = int64(h.GetValue())
		}
		if o := d.GetLimit(); o != nil {
			if _, err := overrideWindow(o); err != nil {
				return nil, invalid("descriptors[%d].limit: %v", i, err)
			}
		}
		costs = append(costs, cost)
	}
	return costs, nil
}

var protoUnits = map[typev3.RateLimitUnit]Unit{
	typev3.RateLimitUnit_SECOND: Second,
	typev3.RateLimitUnit_MINUTE: Minute,
	typev3.RateLimitUnit_HOUR:   Hour,
	typev3.RateLimitUnit_DAY:    Day,
	typev3.RateLimitUnit_MONTH:  Month,
	typev3.RateLimitUnit_YEAR:   Year,
}

var responseUnits = map[Unit]rlsv3.RateLimitResponse_RateLimit_Unit{
	Second: rlsv3.RateLimitResponse_RateLimit_SECOND,
	Minute: rlsv3.RateLimitResponse_RateLimit_MINUTE,
	Hour:   rlsv3.RateLimitResponse_RateLimit_HOUR,
	Day:    rlsv3.RateLimitResponse_RateLimit_DAY,
	Week:   rlsv3.RateLimitResponse_RateLimit_WEEK,
	Month:  rlsv3.RateLimitResponse_RateLimit_MONTH,
	Year:   rlsv3.RateLimitResponse_RateLimit_YEAR,
}

// overrideWindow is the window of a request's limit override in seconds:
// its unit times unit_multiplier (default 1).
func overrideWindow(o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) (int64, error) {
	u, ok := protoUnits[o.GetUnit()]
	if !ok {
		return 0, fmt.Errorf("unit %v is not supported (want SECOND, MINUTE, HOUR, DAY, MONTH or YEAR)", o.GetUnit())
	}
	mult := int64(1)
	if m := o.GetUnitMultiplier(); m != nil {
		mult = int64(m.GetValue())
	}
	w := u.Seconds() * mult
	if mult < 1 || w > limiter.MaxWindowSec {
		return 0, fmt.Errorf("unit_multiplier %d: the window must be 1 s to %d s", mult, limiter.MaxWindowSec)
	}
	return w, nil
}

type overrideKey struct {
	rpu    uint32
	window int64
}

// overridePolicy is the policy of a request's limit override: a fixed
// window of rpu per window seconds, id "envoy.override.<rpu>.<window>s".
// Its counters are per descriptor, as envoyproxy's, and per limit: the
// limit is in the id so that a rejection the deny cache remembers under
// one limit never answers for another (envoyproxy keeps one counter per
// descriptor and window whatever the override says).
func (s *Server) overridePolicy(rpu uint32, window int64) (*limiter.Policy, error) {
	k := overrideKey{rpu, window}
	if p, ok := s.overrides.Load(k); ok {
		return p.(*limiter.Policy), nil
	}
	p, err := policyFor("envoy.override."+strconv.FormatUint(uint64(rpu), 10)+"."+strconv.FormatInt(window, 10)+"s", rpu, window, false)
	if err != nil {
		return nil, err
	}
	if s.nOverride.Load() < maxOverridePolicies {
		if _, loaded := s.overrides.LoadOrStore(k, p); !loaded {
			s.nOverride.Add(1)
		}
	}
	return p, nil
}

// subjectValue encodes a descriptor as a subject value: the domain and
// each key=value, query-escaped and joined by '/'. Escaping keeps '/' and
// '=' out of the parts, so the encoding is injective.
func subjectValue(domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry, values []string) string {
	var b strings.Builder
	b.WriteString(url.QueryEscape(domain))
	for i, e := range entries[:len(values)] {
		b.WriteByte('/')
		b.WriteString(url.QueryEscape(e.GetKey()))
		b.WriteByte('=')
		b.WriteString(url.QueryEscape(values[i]))
	}
	return b.String()
}

// ShouldRateLimit implements RateLimitServiceServer. Errors:
// InvalidArgument for a malformed request (nothing is consumed),
// Canceled or DeadlineExceeded when the caller gave up first, Internal
// for a broken invariant. A store failure is never an error: each
// policy's on_store_failure answers (quota policies, the default of
// envoyproxy configurations, fail open onto an in-process limit).
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	var costBuf [8]int64
	costs, err := validate(req, costBuf[:0])
	if err != nil {
		return nil, err
	}
	cfg := s.cfg.Load()
	c := s.pool.Get().(*call)
	defer func() {
		c.reset()
		s.pool.Put(c)
	}()
	c.reset()

	// Rules of each descriptor, then replaces.
	var replaced map[string]bool
	var values []string
	var pols map[string]*limiter.Policy // loaded at the first rate_limit.policy
	for i, d := range req.Descriptors {
		dd := desc{unit: -1}
		entries := d.GetEntries()
		if o := d.GetLimit(); o != nil {
			w, _ := overrideWindow(o)
			dd.rule = &Rule{RequestsPerUnit: o.GetRequestsPerUnit()}
			dd.window = w
			dd.limit = &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: rlsv3.RateLimitResponse_RateLimit_Unit(o.GetUnit())}
			if m := o.GetUnitMultiplier(); m != nil {
				dd.limit.UnitMultiplier = m
			}
			if o.GetRequestsPerUnit() > 0 {
				p, err := s.overridePolicy(o.GetRequestsPerUnit(), w)
				if err != nil {
					return nil, invalid("descriptors[%d].limit: %v", i, err)
				}
				dd.policy = p
			}
			values = values[:0]
			for _, e := range entries {
				values = append(values, e.GetValue())
			}
		} else {
			es := make([]Entry, len(entries))
			for j, e := range entries {
				es[j] = Entry{Key: e.GetKey(), Value: e.GetValue()}
			}
			m := cfg.Lookup(req.Domain, es)
			if m.Rule != nil {
				dd.rule = m.Rule
				dd.window = m.Rule.Unit.Seconds()
				dd.policy = m.Rule.policy
				if id := m.Rule.PolicyID; id != "" {
					if pols == nil {
						pols = *s.pols.Load()
					}
					p := pols[id]
					if p == nil {
						// A new configuration and policy set were swapped
						// between the two loads of this request.
						return nil, status.Errorf(codes.Unavailable, "rls: policy %q changed under the request; retry", id)
					}
					dd.policy = p
					dd.window = p.NominalWindowSec()
					dd.limit = policyLimit(m.Rule.Name, p)
					costs[i] = min(costs[i]*descriptorCost(p, entries), limiter.MaxCost)
				}
				if !m.Rule.Unlimited {
					if dd.limit == nil {
						dd.limit = &rlsv3.RateLimitResponse_RateLimit{Name: m.Rule.Name, RequestsPerUnit: m.Rule.RequestsPerUnit, Unit: responseUnits[m.Rule.Unit]}
					}
					for _, r := range m.Rule.Replaces {
						if replaced == nil {
							replaced = map[string]bool{}
						}
						replaced[r] = true
					}
				}
			}
			values = append(values[:0], m.Values...)
		}
		if dd.rule != nil && !dd.rule.Unlimited && dd.rule.PolicyID == "" && dd.rule.RequestsPerUnit == 0 {
			dd.alwaysOvr = true
		}
		if dd.policy != nil {
			subj := limiter.Subject{Kind: limiter.SubjectDescriptor, Value: subjectValue(req.Domain, entries, values)}
			dd.unit = c.addUnit(subj, dd.policy, costs[i])
		}
		c.descs = append(c.descs, dd)
	}
	if replaced != nil {
		for i := range c.descs {
			dd := &c.descs[i]
			if dd.rule != nil && dd.rule.Name != "" && replaced[dd.rule.Name] {
				if dd.unit >= 0 {
					c.units[dd.unit].cost = -1 // not decided
				}
				*dd = desc{unit: -1}
			}
		}
	}

	// A request that a requests_per_unit: 0 rule rejects consumes nothing
	// anywhere: its other descriptors are only peeked.
	peekAll := false
	for i := range c.descs {
		if c.descs[i].alwaysOvr && !c.descs[i].rule.Shadow {
			peekAll = true
		}
	}
	c.group(peekAll)

	now := s.l.Now()
	rejected := false
	var delay time.Duration
	for gi := range c.groups {
		g := &c.groups[gi]
		peek := g.cost == 0 || rejected
		lreq := limiter.Request{Cost: g.cost, Peek: peek}
		if err := s.l.CheckSubjectsInto(ctx, now, g.subjects, lreq, &c.d); err != nil {
			if errors.Is(err, limiter.ErrCanceled) {
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			return nil, status.Errorf(codes.Internal, "rls: %v", err)
		}
		if !c.d.Allowed {
			rejected = true
		}
		delay = max(delay, c.d.Delay)
		base := len(c.all)
		c.all = append(c.all, c.d.Policies...)
		for i := range c.units {
			u := &c.units[i]
			if u.group != gi || u.cost < 0 {
				continue
			}
			for j := base; j < len(c.all); j++ {
				pd := &c.all[j]
				if pd.Subject == u.subject && pd.Policy.ID == u.policy.ID {
					u.pd = pd
					break
				}
			}
		}
	}
	resp := s.respond(now, c)
	if delay > 0 && s.maxDelay > 0 && resp.OverallCode == rlsv3.RateLimitResponse_OK {
		// A shaping policy admitted this request for later: hold the
		// answer so that the upstream sees the drain rate.
		t := time.NewTimer(min(delay, s.maxDelay))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	return resp, nil
}

// descriptorCost is the cost of one hit of a descriptor under a Quotient
// policy's cost table: the entry of the descriptor's "method" and "path"
// entries (both present), else 1. Envoy's request_headers actions with
// descriptor_key method and path (header_name :method and :path) give
// them; a share_threshold wildcard over them keeps one counter per caller.
func descriptorCost(p *limiter.Policy, entries []*ratelimitv3.RateLimitDescriptor_Entry) int64 {
	if len(p.Cost) == 0 {
		return 1
	}
	var method, path string
	var hasM, hasP bool
	for _, e := range entries {
		switch e.GetKey() {
		case "method":
			method, hasM = e.GetValue(), true
		case "path":
			path, hasP = e.GetValue(), true
		}
	}
	if !hasM || !hasP {
		return 1
	}
	return p.CostOf(method, path)
}

// policyLimit is the current_limit of a descriptor decided by a Quotient
// policy: for windows, the limit per window (the largest unit that
// divides the window, with unit_multiplier for the rest); for buckets, the
// refill rate per the smallest unit that makes it whole (rounded up per
// day when none does).
func policyLimit(name string, p *limiter.Policy) *rlsv3.RateLimitResponse_RateLimit {
	units := []Unit{Year, Month, Week, Day, Hour, Minute, Second}
	if w := p.NominalWindowSec(); w > 0 {
		for _, u := range units {
			if w%u.Seconds() == 0 {
				rl := &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: clampUint32(p.Limit), Unit: responseUnits[u]}
				if m := w / u.Seconds(); m > 1 {
					rl.UnitMultiplier = wrapperspb.UInt32(uint32(m))
				}
				return rl
			}
		}
	}
	milli := p.RateMilli()
	for _, u := range []Unit{Second, Minute, Hour} {
		if (milli*u.Seconds())%1000 == 0 {
			return &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: clampUint32(milli * u.Seconds() / 1000), Unit: responseUnits[u]}
		}
	}
	return &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: clampUint32((milli*Day.Seconds() + 999) / 1000), Unit: responseUnits[Day]}
}

// addUnit adds (subject, policy) with cost, merging a descriptor repeated
// in the request into one unit whose cost is the sum (as envoyproxy adds
// each repetition's hits to the same counter).
func (c *call) addUnit(subj limiter.Subject, p *limiter.Policy, cost int64) int {
	for i := range c.units {
		u := &c.units[i]
		if u.subject == subj && u.policy.ID == p.ID && u.cost >= 0 {
			u.cost = min(u.cost+cost, limiter.MaxCost+1)
			return i
		}
	}
	c.units = append(c.units, unit{subject: subj, policy: p, cost: cost})
	return len(c.units) - 1
}

// group sorts the units into calls: one per distinct cost, in order of
// first appearance, zero-cost (peek) units last; with peekAll, one peek
// call for all. A subject that appears with several policies of one cost
// is one SubjectPolicies entry; a unit whose subject and policy id repeat
// another's in the same call (a second override of the same window) is
// decided with that one.
func (c *call) group(peekAll bool) {
	add := func(cost int64, u *unit, ui int) {
		gi := -1
		for i := range c.groups {
			if c.groups[i].cost == cost {
				gi = i
				break
			}
		}
		if gi < 0 {
			c.groups = append(c.groups, costGroup{cost: cost})
			gi = len(c.groups) - 1
		}
		g := &c.groups[gi]
		u.group = gi
		for k := range g.subjects {
			sp := &g.subjects[k]
			if sp.Subject != u.subject {
				continue
			}
			for _, p := range sp.Policies {
				if p.ID == u.policy.ID {
					return
				}
			}
			sp.Policies = append(sp.Policies, u.policy)
			return
		}
		g.subjects = append(g.subjects, limiter.SubjectPolicies{Subject: u.subject, Policies: []*limiter.Policy{u.policy}})
	}
	for pass := 0; pass < 2; pass++ {
		for i := range c.units {
			u := &c.units[i]
			if u.cost < 0 {
				continue
			}
			cost := u.cost
			if peekAll {
				cost = 0
			}
			if (pass == 0) == (cost > 0) {
				add(cost, u, i)
			}
		}
	}
}

func clampUint32(v int64) uint32 {
	switch {
	case v <= 0:
		return 0
	case v > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(v)
}

// windowReset is the time from now to the end of the Unix-aligned window
// of w seconds that holds now.
func windowReset(now time.Time, w int64) time.Duration {
	if w <= 0 {
		return 0
	}
	ms := now.UnixMilli()
	wm := w * 1000
	return time.Duration(wm-((ms%wm)+wm)%wm) * time.Millisecond
}

func (s *Server) respond(now time.Time, c *call) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(c.descs))}
	var retry time.Duration
	for i := range c.descs {
		dd := &c.descs[i]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		switch {
		case dd.rule == nil:
		case dd.rule.Unlimited:
			st.LimitRemaining = math.MaxUint32
		case dd.alwaysOvr:
			st.CurrentLimit = dd.limit
			reset := windowReset(now, dd.window)
			st.DurationUntilReset = durationpb.New(reset)
			if !dd.rule.Shadow {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				retry = max(retry, reset)
			}
		case dd.unit >= 0:
			st.CurrentLimit = dd.limit
			pd := c.units[dd.unit].pd
			if pd == nil {
				// Not reported (a deny-cache answer names only the
				// subjects it knew; a split cluster request stops at the
				// first rejection): not the reason for the answer.
				st.DurationUntilReset = durationpb.New(windowReset(now, dd.window))
				continue
			}
			st.LimitRemaining = clampUint32(pd.Remaining)
			st.DurationUntilReset = durationpb.New(pd.ResetAfter)
			if !pd.Allowed && pd.Policy.Mode == limiter.Enforce {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	if s.headers {
		d := limiter.Decision{Allowed: resp.OverallCode == rlsv3.RateLimitResponse_OK, Policies: c.all}
		h := http.Header{}
		httplimit.SetFields(h, &d)
		if !d.Allowed {
			ra := max(1, int64((max(retry, d.RetryAfter())+time.Second-1)/time.Second))
			h.Set(httplimit.HeaderRetryAfter, strconv.FormatInt(ra, 10))
		}
		for _, k := range []string{httplimit.HeaderRateLimitPolicy, httplimit.HeaderRateLimit, httplimit.HeaderRetryAfter} {
			if v := h.Get(k); v != "" {
				resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: k, Value: v})
			}
		}
	}
	return resp
}
