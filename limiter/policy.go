package limiter

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/quotientlabs/quotient/internal/calendar"
)

// Algorithm names a rate limiting algorithm. See the package documentation.
type Algorithm string

// The five algorithms.
const (
	TokenBucket          Algorithm = "token_bucket"
	LeakyBucket          Algorithm = "leaky_bucket"
	FixedWindow          Algorithm = "fixed_window"
	SlidingWindowLog     Algorithm = "sliding_window_log"
	SlidingWindowCounter Algorithm = "sliding_window_counter"
)

// isBucket reports whether a uses rate_per_sec and burst (rather than limit
// and window_s).
func (a Algorithm) isBucket() bool { return a == TokenBucket || a == LeakyBucket }

// tag is the short name of the algorithm in store keys; keys of different
// algorithms never collide, so changing a policy's algorithm starts fresh.
func (a Algorithm) tag() string {
	switch a {
	case TokenBucket:
		return "tb"
	case LeakyBucket:
		return "lb"
	case FixedWindow:
		return "fw"
	case SlidingWindowLog:
		return "sl"
	case SlidingWindowCounter:
		return "sc"
	}
	return "??"
}

// SubjectKind names what a policy limits.
type SubjectKind string

// Subject kinds. SubjectIP is an IPv4 address or an IPv6 /64 prefix.
const (
	SubjectAPIKey  SubjectKind = "api_key"
	SubjectAccount SubjectKind = "account"
	SubjectUser    SubjectKind = "user"
	SubjectIP      SubjectKind = "ip"
)

// Class is the policy class; it decides the default behaviour when the store
// cannot answer (seed design 7.6).
type Class string

// Policy classes.
const (
	// ClassQuota is a per-customer quota; by default it fails open onto a
	// coarse in-process limit.
	ClassQuota Class = "quota"
	// ClassCapacity protects a backend; by default it falls back to an
	// in-process limit of its rate divided by the number of instances.
	ClassCapacity Class = "capacity"
	// ClassSecurity guards logins, OTPs and password resets; by default it
	// fails closed, and it is never exposed in response headers.
	ClassSecurity Class = "security"
)

// FailureMode is what a policy does while the store cannot answer.
type FailureMode string

// Failure modes.
const (
	// FailOpen admits, subject to a coarse in-process limit of twice the
	// policy's rate per instance.
	FailOpen FailureMode = "open"
	// FailClosed rejects with a clear error.
	FailClosed FailureMode = "closed"
	// FailLocal admits under an in-process limit of the policy's rate divided
	// by the number of instances.
	FailLocal FailureMode = "local"
)

// Mode says whether a policy rejects.
type Mode string

// Modes.
const (
	// Enforce rejects requests over the limit.
	Enforce Mode = "enforce"
	// Shadow evaluates and reports ("would reject") but never rejects.
	Shadow Mode = "shadow"
)

// Scope says whether a limit holds per region or across all regions.
type Scope string

// Scopes.
const (
	// ScopeRegion: every region enforces the whole limit on its own.
	ScopeRegion Scope = "region"
	// ScopeGlobal: the limit holds across regions; each region enforces its
	// share (see package shares).
	ScopeGlobal Scope = "global"
)

// Match selects the requests a policy applies to. An empty field matches
// everything.
type Match struct {
	// Tier is the caller's plan tier ("free", "pro", "anonymous", ...).
	Tier string `json:"tier,omitempty"`
	// Routes are path globs; '*' matches any run of characters, '/'
	// included, so "/v1/*" matches every path below /v1/.
	Routes []string `json:"routes,omitempty"`
	// Methods are HTTP methods in upper case.
	Methods []string `json:"methods,omitempty"`
}

// Policy is one rate limit policy document (seed design 4.3). Parse policies
// with [ParsePolicies] or [ParsePolicy], which validate them and fill
// defaults; a Policy built by hand must pass [Policy.Validate] before use.
//
// Ownership: a Policy is a value its creator owns. [New] and
// [Limiter.SetPolicies] keep deep copies (fields, Match slices, the Cost
// map), validated again as copied, so changing or reusing a Policy (or its
// slices and map) after handing it to them changes nothing the limiter
// decides. What the limiter hands back, [Limiter.Policies] and
// [PolicyDecision.Policy], are its own copies, shared by concurrent
// decisions: read them, never modify them. A policy passed to one call
// ([Limiter.AllowN], [Limiter.CheckSubjectsInto], ...) or returned by
// [Overrides] is read during that call, which keeps no reference to it
// afterwards but the Decision's; it must not be modified while such a call
// runs. A validated Policy that nobody modifies is safe for concurrent
// reads.
type Policy struct {
	// ID names the policy: 1 to 64 characters of [A-Za-z0-9._-].
	ID string `json:"id"`
	// Version increases with every change; 0 when unversioned.
	Version int64 `json:"version,omitempty"`
	// Description is free text for operators.
	Description string `json:"description,omitempty"`
	// Match selects the requests the policy applies to.
	Match Match `json:"match,omitempty"`
	// Subject is what the policy limits; default api_key.
	Subject SubjectKind `json:"subject,omitempty"`
	// Algorithm is required.
	Algorithm Algorithm `json:"algorithm"`
	// RatePerSec is the refill (token bucket) or drain (leaky bucket) rate
	// in tokens per second, with at most three decimals; buckets only.
	RatePerSec float64 `json:"rate_per_sec,omitempty"`
	// Burst is the bucket capacity in tokens, with at most three decimals;
	// buckets only; default RatePerSec rounded up to a whole token.
	Burst float64 `json:"burst,omitempty"`
	// Limit is the number of cost units per window; windows only.
	Limit int64 `json:"limit,omitempty"`
	// WindowSec is the window length in seconds; windows only. Fixed
	// windows are aligned to the Unix epoch, so 86400 is the UTC day.
	// Zero when Window is set.
	WindowSec int64 `json:"window_s,omitempty"`
	// Window names a calendar window instead of WindowSec; fixed_window
	// only, and exactly one of Window and WindowSec. The one value is
	// [WindowMonth]: the UTC calendar month, from the 1st at 00:00 UTC to
	// the 1st of the next month at 00:00 UTC (28 to 31 days), for region
	// and global scope alike.
	Window string `json:"window,omitempty"`
	// Cost maps "METHOD /route-glob" to the cost units of a matching
	// request; unlisted requests cost 1. The first matching entry in
	// lexical order of the keys wins, exact routes before globs.
	Cost map[string]int64 `json:"cost,omitempty"`
	// Class defaults to quota.
	Class Class `json:"class,omitempty"`
	// OnStoreFailure defaults by class: quota open, capacity local,
	// security closed.
	OnStoreFailure FailureMode `json:"on_store_failure,omitempty"`
	// Mode defaults to enforce in policy files. (The admin API starts new
	// versions in shadow mode unless told otherwise.)
	Mode Mode `json:"mode,omitempty"`
	// Scope defaults to region.
	Scope Scope `json:"scope,omitempty"`

	// Filled by Validate.
	rateMilli  int64 // tokens per second x 1000
	burstMilli int64 // tokens x 1000
	costs      []routeCost
	validated  bool
}

type routeCost struct {
	method string
	route  string
	cost   int64
}

// Bounds of policy parameters, so that all arithmetic stays exact in the
// integers a double holds (see the package documentation).
const (
	MaxRatePerSec = 1e9
	MaxBurst      = 1e6
	MaxLimit      = 1e12
	MaxWindowSec  = 366 * 86400
	MaxCost       = 1e8
	// MaxSlidingLogLimit bounds the limit of a sliding_window_log policy:
	// its log keeps one entry per admitted request and every check loads
	// and sums the whole log, so a check's Redis time grows with the
	// limit. On the 2-core development machine (loaded, Redis 7.0) one
	// check at 100 entries took 0.25 ms of Redis time, at 1,000 entries
	// 1.3 ms and at 10,000 entries 16-22 ms (BenchmarkSlidingLogSize); 1,000
	// keeps the worst check well inside the 5 ms store deadline. Larger
	// limits belong to sliding_window_counter, which keeps two counters.
	MaxSlidingLogLimit = 1000
)

// WindowMonth is the Window of a fixed_window policy whose windows are the
// UTC calendar months.
const WindowMonth = "month"

// NominalMonthSec is the length, in seconds, that stands for a
// calendar-month window where one number must stand for every month (the
// w parameter of RateLimit-Policy, the rate of the in-process fallback):
// 31 days, the longest month, so limit/NominalMonthSec never overstates the
// policy's rate.
const NominalMonthSec = 31 * 86400

var idPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
var methodPattern = regexp.MustCompile(`^[A-Z]{1,16}$`)

// FieldError is one problem in a policy document, at a JSON path such as
// "policies[2].rate_per_sec".
type FieldError struct {
	Path string
	Msg  string
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Msg }

// ErrInvalidPolicy is wrapped by every policy validation error.
var ErrInvalidPolicy = errors.New("limiter: invalid policy")

// PolicyError lists every problem found in a policy document.
type PolicyError struct {
	Fields []*FieldError
}

func (e *PolicyError) Error() string {
	var b strings.Builder
	b.WriteString("limiter: invalid policy: ")
	for i, f := range e.Fields {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(f.Error())
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalidPolicy) hold.
func (e *PolicyError) Unwrap() error { return ErrInvalidPolicy }

type problems struct{ list []*FieldError }

func (p *problems) add(path, format string, args ...any) {
	p.list = append(p.list, &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	return &PolicyError{Fields: p.list}
}

// ParsePolicies parses a policy file: a JSON array of policy documents (a
// single object is accepted as a one-element array). It is strict: unknown
// or repeated fields, wrong types, values out of range, parameters of another
// algorithm and duplicate ids are errors. Every problem found is reported in
// one *PolicyError whose paths look like "policies[1].burst".
func ParsePolicies(data []byte) ([]*Policy, error) {
	data = bytes.TrimSpace(data)
	var p problems
	if err := checkDuplicateKeys(data); err != nil {
		p.add("policies", "%v", err)
		return nil, p.err()
	}
	var raws []json.RawMessage
	if len(data) > 0 && data[0] == '{' {
		raws = []json.RawMessage{data}
	} else if err := json.Unmarshal(data, &raws); err != nil {
		p.add("policies", "not a JSON array of policy objects: %v", jsonMsg(err))
		return nil, p.err()
	}
	out := make([]*Policy, 0, len(raws))
	seen := map[string]int{}
	for i, raw := range raws {
		path := fmt.Sprintf("policies[%d]", i)
		pol, typed := decodePolicy(raw, path, &p)
		if pol == nil {
			continue
		}
		if typed {
			// Values of the wrong type were reported already; checking
			// ranges of the zero values left behind would only add noise.
			pol.validate(path, &p)
		}
		if pol.ID != "" {
			if j, dup := seen[pol.ID]; dup {
				p.add(path+".id", "duplicate id %q (also policies[%d])", pol.ID, j)
			} else {
				seen[pol.ID] = i
			}
		}
		out = append(out, pol)
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	return out, nil
}

// ParsePolicy parses and validates one policy document, strictly, like
// ParsePolicies; paths in errors start at "policy".
func ParsePolicy(data []byte) (*Policy, error) {
	var p problems
	if err := checkDuplicateKeys(bytes.TrimSpace(data)); err != nil {
		p.add("policy", "%v", err)
		return nil, p.err()
	}
	pol, typed := decodePolicy(data, "policy", &p)
	if pol != nil && typed {
		pol.validate("policy", &p)
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	return pol, nil
}

// policyFields are the JSON names a policy document may use.
var policyFields = map[string]bool{
	"id": true, "version": true, "description": true, "match": true, "subject": true,
	"algorithm": true, "rate_per_sec": true, "burst": true, "limit": true, "window_s": true, "window": true,
	"cost": true, "class": true, "on_store_failure": true, "mode": true, "scope": true,
}

// decodePolicy decodes the fields of one policy object, reporting unknown
// fields and values of the wrong type. It returns the policy with every
// field that decoded (nil when raw is not an object), and whether all values
// had the right types.
func decodePolicy(raw json.RawMessage, path string, p *problems) (*Policy, bool) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		p.add(path, "not a JSON object")
		return nil, false
	}
	pol := &Policy{}
	ok := true
	for _, name := range sortedKeys(fields) {
		val := fields[name]
		if !policyFields[name] {
			p.add(path+"."+name, "unknown field")
			continue
		}
		var target any
		switch name {
		case "id":
			target = &pol.ID
		case "version":
			target = &pol.Version
		case "description":
			target = &pol.Description
		case "subject":
			target = &pol.Subject
		case "algorithm":
			target = &pol.Algorithm
		case "rate_per_sec":
			target = &pol.RatePerSec
		case "burst":
			target = &pol.Burst
		case "limit":
			target = &pol.Limit
		case "window_s":
			target = &pol.WindowSec
		case "window":
			target = &pol.Window
		case "cost":
			target = &pol.Cost
		case "class":
			target = &pol.Class
		case "on_store_failure":
			target = &pol.OnStoreFailure
		case "mode":
			target = &pol.Mode
		case "scope":
			target = &pol.Scope
		case "match":
			if !decodeMatch(val, path+".match", &pol.Match, p) {
				ok = false
			}
			continue
		}
		if err := json.Unmarshal(val, target); err != nil {
			p.add(path+"."+name, "%s", jsonMsg(err))
			ok = false
		}
	}
	return pol, ok
}

func decodeMatch(raw json.RawMessage, path string, m *Match, p *problems) bool {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		p.add(path, "not a JSON object")
		return false
	}
	ok := true
	for _, name := range sortedKeys(fields) {
		var target any
		switch name {
		case "tier":
			target = &m.Tier
		case "routes":
			target = &m.Routes
		case "methods":
			target = &m.Methods
		default:
			p.add(path+"."+name, "unknown field")
			ok = false
			continue
		}
		if err := json.Unmarshal(fields[name], target); err != nil {
			p.add(path+"."+name, "%s", jsonMsg(err))
			ok = false
		}
	}
	return ok
}

// jsonMsg turns a json error into a short message without Go type names
// where possible.
func jsonMsg(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("wrong type: got JSON %s, want %s", te.Value, goTypeName(te.Type.String()))
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("malformed JSON at byte %d: %v", se.Offset, err)
	}
	return err.Error()
}

func goTypeName(t string) string {
	switch {
	case strings.HasPrefix(t, "int"):
		return "an integer"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case strings.HasPrefix(t, "map"):
		return "an object"
	case strings.HasPrefix(t, "[]"):
		return "an array"
	case strings.HasPrefix(t, "string"), strings.HasPrefix(t, "limiter."):
		return "a string"
	}
	return t
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// checkDuplicateKeys rejects JSON objects that repeat a key, which
// encoding/json would silently resolve to the last value.
func checkDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		object bool
		keys   map[string]bool
		expect bool // next string token in an object is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			if err.Error() == "EOF" {
				return nil
			}
			return fmt.Errorf("malformed JSON: %v", err)
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		isKey := top != nil && top.object && top.expect
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				if top != nil && top.object {
					top.expect = true
				}
				stack = append(stack, &frame{object: true, keys: map[string]bool{}, expect: true})
				continue
			case '[':
				if top != nil && top.object {
					top.expect = true
				}
				stack = append(stack, &frame{})
				continue
			default:
				stack = stack[:len(stack)-1]
				continue
			}
		case string:
			if isKey {
				if top.keys[t] {
					return fmt.Errorf("field %q appears twice in one object", t)
				}
				top.keys[t] = true
				top.expect = false
				continue
			}
		}
		if top != nil && top.object {
			top.expect = true
		}
	}
}

// clone is a deep copy of p: nothing of it shares memory with p, so
// changing p (or re-validating it, which rewrites costs in place) leaves
// the copy as it was. nil slices and maps stay nil.
func (p *Policy) clone() *Policy {
	c := *p
	c.Match.Routes = slices.Clone(p.Match.Routes)
	c.Match.Methods = slices.Clone(p.Match.Methods)
	c.Cost = maps.Clone(p.Cost)
	c.costs = slices.Clone(p.costs)
	return &c
}

// Validate checks a policy built by hand and fills its defaults, like
// ParsePolicy does. It returns a *PolicyError listing every problem.
func (p *Policy) Validate() error {
	var pr problems
	p.validate("policy", &pr)
	return pr.err()
}

func (p *Policy) validate(path string, pr *problems) {
	if !idPattern.MatchString(p.ID) {
		if p.ID == "" {
			pr.add(path+".id", "required")
		} else {
			pr.add(path+".id", "%q: must be 1 to 64 characters of A-Z a-z 0-9 . _ -", p.ID)
		}
	}
	if p.Version < 0 {
		pr.add(path+".version", "must be >= 0, got %d", p.Version)
	}
	if p.Subject == "" {
		p.Subject = SubjectAPIKey
	}
	switch p.Subject {
	case SubjectAPIKey, SubjectAccount, SubjectUser, SubjectIP:
	default:
		pr.add(path+".subject", "unknown subject %q (want api_key, account, user or ip)", p.Subject)
	}
	if p.Class == "" {
		p.Class = ClassQuota
	}
	switch p.Class {
	case ClassQuota, ClassCapacity, ClassSecurity:
	default:
		pr.add(path+".class", "unknown class %q (want quota, capacity or security)", p.Class)
	}
	if p.OnStoreFailure == "" {
		switch p.Class {
		case ClassCapacity:
			p.OnStoreFailure = FailLocal
		case ClassSecurity:
			p.OnStoreFailure = FailClosed
		default:
			p.OnStoreFailure = FailOpen
		}
	}
	switch p.OnStoreFailure {
	case FailOpen, FailClosed, FailLocal:
	default:
		pr.add(path+".on_store_failure", "unknown value %q (want open, closed or local)", p.OnStoreFailure)
	}
	if p.Mode == "" {
		p.Mode = Enforce
	}
	if p.Mode != Enforce && p.Mode != Shadow {
		pr.add(path+".mode", "unknown mode %q (want enforce or shadow)", p.Mode)
	}
	if p.Scope == "" {
		p.Scope = ScopeRegion
	}
	if p.Scope != ScopeRegion && p.Scope != ScopeGlobal {
		pr.add(path+".scope", "unknown scope %q (want region or global)", p.Scope)
	}
	p.validateMatch(path+".match", pr)

	switch p.Algorithm {
	case TokenBucket, LeakyBucket:
		p.validateBucket(path, pr)
	case FixedWindow, SlidingWindowLog, SlidingWindowCounter:
		p.validateWindow(path, pr)
		if p.Scope == ScopeGlobal && p.Algorithm != FixedWindow {
			pr.add(path+".scope", "global scope is supported for token_bucket, leaky_bucket and fixed_window, not %s", p.Algorithm)
		}
	case "":
		pr.add(path+".algorithm", "required (token_bucket, leaky_bucket, fixed_window, sliding_window_log or sliding_window_counter)")
	default:
		pr.add(path+".algorithm", "unknown algorithm %q (want token_bucket, leaky_bucket, fixed_window, sliding_window_log or sliding_window_counter)", p.Algorithm)
	}
	p.validateCosts(path+".cost", pr)
	p.validated = len(pr.list) == 0
}

func (p *Policy) validateMatch(path string, pr *problems) {
	for i, r := range p.Match.Routes {
		if !strings.HasPrefix(r, "/") && r != "*" {
			pr.add(fmt.Sprintf("%s.routes[%d]", path, i), "%q: a route glob starts with '/' (or is \"*\")", r)
		}
	}
	for i, m := range p.Match.Methods {
		if !methodPattern.MatchString(m) {
			pr.add(fmt.Sprintf("%s.methods[%d]", path, i), "%q: want an HTTP method in upper case", m)
		}
	}
}

// toMilli converts a value with at most three decimals to thousandths.
func toMilli(v float64) (int64, bool) {
	m := math.Round(v * 1000)
	return int64(m), math.Abs(v*1000-m) < 1e-6*math.Max(1, math.Abs(m))
}

func (p *Policy) validateBucket(path string, pr *problems) {
	if p.Limit != 0 {
		pr.add(path+".limit", "not a parameter of %s (it takes rate_per_sec and burst)", p.Algorithm)
	}
	if p.WindowSec != 0 {
		pr.add(path+".window_s", "not a parameter of %s (it takes rate_per_sec and burst)", p.Algorithm)
	}
	if p.Window != "" {
		pr.add(path+".window", "not a parameter of %s (it takes rate_per_sec and burst)", p.Algorithm)
	}
	switch {
	case math.IsNaN(p.RatePerSec) || p.RatePerSec <= 0:
		pr.add(path+".rate_per_sec", "must be > 0, got %v", p.RatePerSec)
	case p.RatePerSec > MaxRatePerSec:
		pr.add(path+".rate_per_sec", "must be at most %g, got %v", float64(MaxRatePerSec), p.RatePerSec)
	default:
		m, exact := toMilli(p.RatePerSec)
		if !exact || m < 1 {
			pr.add(path+".rate_per_sec", "at most three decimals and at least 0.001, got %v", p.RatePerSec)
		}
		p.rateMilli = m
	}
	if p.Burst == 0 && p.RatePerSec > 0 {
		p.Burst = math.Ceil(p.RatePerSec)
	}
	switch {
	case math.IsNaN(p.Burst) || p.Burst <= 0:
		pr.add(path+".burst", "must be > 0, got %v", p.Burst)
	case p.Burst > MaxBurst:
		pr.add(path+".burst", "must be at most %g, got %v", float64(MaxBurst), p.Burst)
	default:
		m, exact := toMilli(p.Burst)
		if !exact || m < 1 {
			pr.add(path+".burst", "at most three decimals, got %v", p.Burst)
		}
		p.burstMilli = m
	}
}

func (p *Policy) validateWindow(path string, pr *problems) {
	if p.RatePerSec != 0 {
		pr.add(path+".rate_per_sec", "not a parameter of %s (it takes limit and window_s)", p.Algorithm)
	}
	if p.Burst != 0 {
		pr.add(path+".burst", "not a parameter of %s (it takes limit and window_s)", p.Algorithm)
	}
	switch {
	case p.Limit <= 0 || p.Limit > MaxLimit:
		pr.add(path+".limit", "must be between 1 and %g, got %d", float64(MaxLimit), p.Limit)
	case p.Algorithm == SlidingWindowLog && p.Limit > MaxSlidingLogLimit:
		pr.add(path+".limit", "sliding_window_log keeps every admitted request and reads them all on each check, so its limit must be at most %d, got %d; use sliding_window_counter for larger limits", MaxSlidingLogLimit, p.Limit)
	}
	switch {
	case p.Window == "":
		if p.WindowSec <= 0 || p.WindowSec > MaxWindowSec {
			hint := ""
			if p.Algorithm == FixedWindow && p.WindowSec == 0 {
				hint = ` (or set window: "month" for the UTC calendar month)`
			}
			pr.add(path+".window_s", "must be between 1 and %d seconds, got %d%s", MaxWindowSec, p.WindowSec, hint)
		}
	case p.Algorithm != FixedWindow:
		pr.add(path+".window", "%q: calendar windows are for fixed_window only; %s takes window_s", p.Window, p.Algorithm)
	case p.Window != WindowMonth:
		pr.add(path+".window", "unknown window %q (want %q; use window_s for a fixed length)", p.Window, WindowMonth)
	case p.WindowSec != 0:
		pr.add(path+".window_s", "set window %q or window_s, not both", p.Window)
	}
}

func (p *Policy) validateCosts(path string, pr *problems) {
	p.costs = p.costs[:0]
	for _, key := range sortedKeys(p.Cost) {
		cost := p.Cost[key]
		kp := fmt.Sprintf("%s[%q]", path, key)
		method, route, ok := strings.Cut(key, " ")
		if !ok || !methodPattern.MatchString(method) || !strings.HasPrefix(route, "/") {
			pr.add(kp, "key must be \"METHOD /route\", like \"POST /v1/exports\"")
			continue
		}
		if cost < 0 || cost > MaxCost {
			pr.add(kp, "cost must be between 0 and %g, got %d", float64(MaxCost), cost)
			continue
		}
		if c := p.capacity(); c > 0 && cost > c {
			pr.add(kp, "cost %d exceeds the policy's capacity %d: such requests could never be admitted", cost, c)
			continue
		}
		p.costs = append(p.costs, routeCost{method: method, route: route, cost: cost})
	}
	// Exact routes before globs, then lexical: deterministic precedence.
	sort.SliceStable(p.costs, func(i, j int) bool {
		gi, gj := strings.Contains(p.costs[i].route, "*"), strings.Contains(p.costs[j].route, "*")
		return !gi && gj
	})
}

// capacity is the most cost one request can ever be admitted with: the
// burst for buckets (in whole tokens), the limit for windows.
func (p *Policy) capacity() int64 {
	if p.Algorithm.isBucket() {
		return p.burstMilli / 1000
	}
	return p.Limit
}

// Capacity is the policy's quota as the RateLimit-Policy field states it:
// burst for buckets, limit for windows, in cost units.
func (p *Policy) Capacity() int64 { return p.capacity() }

// RateMilli is the bucket rate in thousandths of a token per second (0 for
// windows).
func (p *Policy) RateMilli() int64 { return p.rateMilli }

// BurstMilli is the bucket capacity in thousandths of a token (0 for
// windows).
func (p *Policy) BurstMilli() int64 { return p.burstMilli }

// WindowMs is the window length in milliseconds: 0 for buckets, and 0 for
// calendar-month windows, whose length varies (see [Policy.Monthly] and
// [Policy.WindowAt]).
func (p *Policy) WindowMs() int64 { return p.WindowSec * 1000 }

// Monthly reports whether the policy's windows are UTC calendar months
// (Window is [WindowMonth]).
func (p *Policy) Monthly() bool { return p.Window == WindowMonth }

// NominalWindowSec is the window length in seconds where one number must
// stand for the policy's windows: WindowSec, or [NominalMonthSec] for
// calendar months; 0 for buckets.
func (p *Policy) NominalWindowSec() int64 {
	if p.Monthly() {
		return NominalMonthSec
	}
	return p.WindowSec
}

// WindowAt returns the fixed window that contains t, [start, end) in UTC:
// the calendar month for monthly policies, else the window of WindowSec
// aligned to the Unix epoch (what fixed_window counts in, and the aligned
// windows sliding_window_counter weighs). It returns zero times for
// buckets. Pure: it reads no clock.
func (p *Policy) WindowAt(t time.Time) (start, end time.Time) {
	ms := t.UnixMilli()
	var s, e int64
	switch {
	case p.Monthly():
		s, e = calendar.MonthAt(ms)
	case p.WindowSec > 0:
		w := p.WindowSec * 1000
		s = ms - ms%w
		if ms%w < 0 {
			s -= w
		}
		e = s + w
	default:
		return time.Time{}, time.Time{}
	}
	return time.UnixMilli(s).UTC(), time.UnixMilli(e).UTC()
}

// Matches reports whether the policy applies to a request of this tier,
// method and path.
func (p *Policy) Matches(tier, method, path string) bool {
	if p.Match.Tier != "" && p.Match.Tier != tier {
		return false
	}
	if len(p.Match.Methods) > 0 {
		found := false
		for _, m := range p.Match.Methods {
			if m == method {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	if len(p.Match.Routes) == 0 {
		return true
	}
	for _, r := range p.Match.Routes {
		if globMatch(r, path) {
			return true
		}
	}
	return false
}

// MinCost is the cost of p's cheapest request that consumes, in cost
// units: the smallest positive cost of its cost table, or 1 for the
// requests the table does not list (which always exist, since the table
// cannot list every route). The coordinator gives every region a share of
// a global policy that admits at least one such request.
func (p *Policy) MinCost() int64 {
	c := int64(1)
	for _, v := range p.Cost {
		if v > 0 && v < c {
			c = v
		}
	}
	return c
}

// CostOf is the cost of a request with this method and path under the
// policy's cost table: the first matching entry, else 1.
func (p *Policy) CostOf(method, path string) int64 {
	for _, c := range p.costs {
		if c.method == method && globMatch(c.route, path) {
			return c.cost
		}
	}
	return 1
}

// globMatch matches s against pattern, where '*' matches any run of
// characters ('/' included) and every other byte matches itself.
func globMatch(pattern, s string) bool {
	// Iterative matcher with single-star backtracking: linear in practice,
	// never exponential.
	px, sx := 0, 0
	starP, starS := -1, 0
	for sx < len(s) {
		switch {
		case px < len(pattern) && pattern[px] == '*':
			starP, starS = px, sx
			px++
		case px < len(pattern) && pattern[px] == s[sx]:
			px++
			sx++
		case starP >= 0:
			starS++
			px, sx = starP+1, starS
		default:
			return false
		}
	}
	for px < len(pattern) && pattern[px] == '*' {
		px++
	}
	return px == len(pattern)
}
