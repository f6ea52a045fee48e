package rls

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/quotientlabs/quotient/limiter"
)

// Unit is the time unit of a rate limit, as envoyproxy/ratelimit names it
// in lower case.
type Unit string

// Units, with the window lengths envoyproxy/ratelimit uses.
const (
	Second Unit = "second" // 1 s
	Minute Unit = "minute" // 60 s
	Hour   Unit = "hour"   // 3600 s
	Day    Unit = "day"    // 86400 s
	Week   Unit = "week"   // 7 days
	Month  Unit = "month"  // 30 days (not the calendar month)
	Year   Unit = "year"   // 365 days
)

// Seconds is the unit's window length in seconds, 0 for an unknown unit.
func (u Unit) Seconds() int64 {
	switch u {
	case Second:
		return 1
	case Minute:
		return 60
	case Hour:
		return 3600
	case Day:
		return 86400
	case Week:
		return 7 * 86400
	case Month:
		return 30 * 86400
	case Year:
		return 365 * 86400
	}
	return 0
}

// Limits on configurations and requests, so that keys, memory and errors
// stay bounded.
const (
	// MaxDomainBytes bounds a domain name, in bytes.
	MaxDomainBytes = 256
	// MaxEntryBytes bounds one descriptor key or value, in bytes.
	MaxEntryBytes = 1024
	// MaxDescriptorBytes bounds the keys and values of one request
	// descriptor together, in bytes (its counter's key grows with them).
	MaxDescriptorBytes = 4096
	// MaxEntries bounds the entries of one descriptor (its depth).
	MaxEntries = 16
	// MaxDescriptors bounds the descriptors of one request.
	MaxDescriptors = 64
	// MaxFileBytes bounds one configuration file, in bytes.
	MaxFileBytes = 4 << 20
)

// Rule is one rate_limit block of a configuration. A Rule is immutable
// once parsed and safe for concurrent use.
type Rule struct {
	// Path names the rule as envoyproxy/ratelimit's stats do:
	// "domain.key_value.key".
	Path string
	// File is the configuration file it came from.
	File string
	// Name is rate_limit.name, the handle replaces refers to.
	Name string
	// Replaces are the names of the rules this one replaces.
	Replaces []string
	// Unlimited rules never limit and never reach the store.
	Unlimited bool
	// RequestsPerUnit is the limit per window; 0 is always over limit.
	RequestsPerUnit uint32
	// Unit is the window; empty when Unlimited.
	Unit Unit
	// Shadow rules are evaluated and counted but never reject.
	Shadow bool
	// DetailedMetric is detailed_metric: accepted for compatibility; the
	// limiter's metrics are per policy, so it changes nothing.
	DetailedMetric bool
	// PolicyID is rate_limit.policy, Quotient's extension: the id of a
	// Quotient policy document of the server's policy set that decides
	// the descriptor instead of a unit and requests_per_unit (its
	// algorithm, cost, class, on_store_failure, mode, scope and the
	// overrides of its subjects all apply). Empty for envoyproxy rules.
	PolicyID string

	// policy is the Quotient policy of the rule; nil when Unlimited or
	// RequestsPerUnit is 0.
	policy *limiter.Policy
}

// Policy is the validated Quotient policy that enforces the rule: a
// fixed_window of RequestsPerUnit per Unit, in shadow mode when Shadow.
// It is nil for unlimited rules and for RequestsPerUnit 0.
func (r *Rule) Policy() *limiter.Policy { return r.policy }

// policyFor builds the fixed-window policy with this id of rpu per window
// of windowSec seconds.
func policyFor(id string, rpu uint32, windowSec int64, shadow bool) (*limiter.Policy, error) {
	p := &limiter.Policy{
		ID:        id,
		Algorithm: limiter.FixedWindow,
		Limit:     int64(rpu),
		WindowSec: windowSec,
		Mode:      limiter.Enforce,
	}
	if shadow {
		p.Mode = limiter.Shadow
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// policyID is the Quotient policy id of the rule at path: the path itself
// when it is a valid id (at most 64 of [A-Za-z0-9._-]), else its valid
// characters cut to 47 bytes, a dot and 16 hex digits of the path's
// FNV-1a hash, so distinct paths get distinct ids. The counters of a rule
// live under its id and the descriptor's subject: editing a rule's limit
// keeps counting in the same window, as envoyproxy does; moving it in the
// tree starts afresh.
func policyID(path string) string {
	ok := len(path) <= 64
	var b strings.Builder
	for i := 0; i < len(path); i++ {
		c := path[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-' {
			b.WriteByte(c)
		} else {
			ok = false
		}
	}
	if ok && path != "" {
		return path
	}
	s := b.String()
	if len(s) > 47 {
		s = s[:47]
	}
	h := fnv.New64a()
	h.Write([]byte(path))
	return fmt.Sprintf("%s.%016x", s, h.Sum64())
}

// policyIDPattern is what a Quotient policy id is (limiter.Policy.ID).
var policyIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// node is one level of a domain's descriptor tree.
type node struct {
	exact     map[entryKey]*node // key and value
	keyOnly   map[string]*node   // key without value
	wildcards []*node            // values ending in '*', in file order
	key       string             // for wildcards
	prefix    string             // value without the '*' (wildcards)
	share     bool               // share_threshold on a wildcard
	rule      *Rule
}

type entryKey struct{ key, value string }

func newNode() *node {
	return &node{exact: map[entryKey]*node{}, keyOnly: map[string]*node{}}
}

func (n *node) hasChildren() bool {
	return len(n.exact) > 0 || len(n.keyOnly) > 0 || len(n.wildcards) > 0
}

// Config is a parsed set of configuration files: the domains and their
// descriptor trees. A Config is immutable and safe for concurrent use.
type Config struct {
	domains  map[string]*node
	rules    int
	files    []string
	policies map[string]string // rate_limit.policy id -> the first rule path naming it
}

// PolicyIDs are the Quotient policy ids that rules name (rate_limit.policy),
// sorted.
func (c *Config) PolicyIDs() []string {
	out := make([]string, 0, len(c.policies))
	for id := range c.policies {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// MissingPolicy is the first (in id order) policy id a rule names that have
// does not hold, with the path of a rule naming it; "" when every
// named policy is there.
func (c *Config) MissingPolicy(have func(id string) bool) (id, path string) {
	for _, id := range c.PolicyIDs() {
		if !have(id) {
			return id, c.policies[id]
		}
	}
	return "", ""
}

// Domains returns the configured domains, sorted.
func (c *Config) Domains() []string {
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// Rules is the number of rate_limit blocks loaded.
func (c *Config) Rules() int { return c.rules }

// Files are the names of the files loaded, in load order.
func (c *Config) Files() []string { return append([]string(nil), c.files...) }

// File is one configuration file to parse.
type File struct {
	// Name is used in errors ("config/limits.yaml").
	Name string
	Data []byte
}

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("rls: invalid configuration")

// ConfigError is one problem in a configuration file, at a path such as
// "descriptors[1].rate_limit.unit".
type ConfigError struct {
	File string
	Path string
	Msg  string
}

func (e *ConfigError) Error() string {
	if e.Path == "" {
		return "rls: " + e.File + ": " + e.Msg
	}
	return "rls: " + e.File + ": " + e.Path + ": " + e.Msg
}

// Unwrap makes errors.Is(err, ErrInvalidConfig) hold.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// ParseOptions are the options of [Parse].
type ParseOptions struct {
	// MergeDomains lets several files configure one domain (their
	// descriptors are merged; a descriptor defined twice is still an
	// error), as envoyproxy's MERGE_DOMAIN_CONFIG. Default false: a
	// domain in two files is an error.
	MergeDomains bool
}

// Parse parses envoyproxy/ratelimit configuration files, strictly: an
// unknown field, a value of the wrong type, an invalid unit, a duplicate
// descriptor or domain is an error (*ConfigError, wrapping
// ErrInvalidConfig) that names the file and the path. It does no I/O.
func Parse(files []File, opts ParseOptions) (*Config, error) {
	c := &Config{domains: map[string]*node{}, policies: map[string]string{}}
	for _, f := range files {
		if err := c.parseFile(f, opts); err != nil {
			return nil, err
		}
		c.files = append(c.files, f.Name)
	}
	return c, nil
}

type parser struct {
	file  string
	c     *Config
	count int // descriptors read, aliases expanded
}

// MaxFileDescriptors bounds the descriptors of one file, counted after
// YAML aliases are expanded, so that a small file of nested aliases cannot
// expand into billions of descriptors (parsing 20,000 takes about 0.3 s).
const MaxFileDescriptors = 20000

func (p *parser) errf(path, format string, args ...any) error {
	return &ConfigError{File: p.file, Path: path, Msg: fmt.Sprintf(format, args...)}
}

func (c *Config) parseFile(f File, opts ParseOptions) error {
	p := &parser{file: f.Name, c: c}
	if len(f.Data) > MaxFileBytes {
		return p.errf("", "file is %d bytes, more than %d", len(f.Data), MaxFileBytes)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(f.Data, &doc); err != nil {
		return p.errf("", "not YAML: %v", err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return p.errf("", "empty file: want a mapping with domain and descriptors")
	}
	root := doc.Content[0]
	fields, err := p.mapping(root, "", map[string]bool{"domain": true, "descriptors": true})
	if err != nil {
		return err
	}
	domainNode, ok := fields["domain"]
	if !ok {
		return p.errf("domain", "required")
	}
	domain, err := p.str(domainNode, "domain")
	if err != nil {
		return err
	}
	switch {
	case domain == "":
		return p.errf("domain", "must not be empty")
	case len(domain) > MaxDomainBytes:
		return p.errf("domain", "is %d bytes, more than %d", len(domain), MaxDomainBytes)
	}
	n, dup := c.domains[domain]
	if dup && !opts.MergeDomains {
		return p.errf("domain", "duplicate domain %q (also in an earlier file; merging is off)", domain)
	}
	if !dup {
		n = newNode()
	}
	if d, ok := fields["descriptors"]; ok {
		if err := p.descriptors(n, d, "descriptors", domain, 1); err != nil {
			return err
		}
	}
	c.domains[domain] = n
	return nil
}

// mapping checks that v is a mapping with only allowed, unrepeated keys
// and returns its values by key.
func (p *parser) mapping(v *yaml.Node, path string, allowed map[string]bool) (map[string]*yaml.Node, error) {
	v = resolve(v)
	if v.Kind != yaml.MappingNode {
		return nil, p.errf(path, "want a mapping, got %s", kindName(v))
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k := resolve(v.Content[i])
		if k.Kind != yaml.ScalarNode {
			return nil, p.errf(path, "a key is not a string (%s)", kindName(k))
		}
		fp := join(path, k.Value)
		if !allowed[k.Value] {
			return nil, p.errf(fp, "unknown field")
		}
		if _, seen := out[k.Value]; seen {
			return nil, p.errf(fp, "field appears twice")
		}
		out[k.Value] = v.Content[i+1]
	}
	return out, nil
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func resolve(v *yaml.Node) *yaml.Node {
	for depth := 0; v.Kind == yaml.AliasNode && v.Alias != nil && depth < 8; depth++ {
		v = v.Alias
	}
	return v
}

func kindName(v *yaml.Node) string {
	switch v.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if v.Tag == "!!null" {
			return "null"
		}
		return "the scalar " + strconv.Quote(truncate(v.Value))
	case yaml.AliasNode:
		return "an alias"
	}
	return "nothing"
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// str reads a scalar as a string; envoyproxy's YAML library accepts any
// scalar (a number or a boolean) for a string field, and so do we.
func (p *parser) str(v *yaml.Node, path string) (string, error) {
	v = resolve(v)
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		return "", p.errf(path, "want a string, got %s", kindName(v))
	}
	return v.Value, nil
}

func (p *parser) boolean(v *yaml.Node, path string) (bool, error) {
	v = resolve(v)
	var b bool
	if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" || v.Decode(&b) != nil {
		return false, p.errf(path, "want true or false, got %s", kindName(v))
	}
	return b, nil
}

func (p *parser) uint32(v *yaml.Node, path string) (uint32, error) {
	v = resolve(v)
	if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
		return 0, p.errf(path, "want a whole number, got %s", kindName(v))
	}
	var i int64
	if err := v.Decode(&i); err != nil || i < 0 || i > math.MaxUint32 {
		return 0, p.errf(path, "want a whole number from 0 to %d, got %s", uint32(math.MaxUint32), truncate(v.Value))
	}
	return uint32(i), nil
}

var descriptorFields = map[string]bool{
	"key": true, "value": true, "rate_limit": true, "descriptors": true,
	"shadow_mode": true, "detailed_metric": true, "share_threshold": true,
}

var rateLimitFields = map[string]bool{
	"unit": true, "requests_per_unit": true, "unlimited": true, "name": true, "replaces": true,
	"policy": true, // Quotient's extension: a policy document of the server's set decides
}

func (p *parser) descriptors(parent *node, v *yaml.Node, path, statPath string, depth int) error {
	v = resolve(v)
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return nil
	}
	if v.Kind != yaml.SequenceNode {
		return p.errf(path, "want a list of descriptors, got %s", kindName(v))
	}
	if depth > MaxEntries {
		return p.errf(path, "descriptors nest deeper than %d levels", MaxEntries)
	}
	for i, d := range v.Content {
		dp := fmt.Sprintf("%s[%d]", path, i)
		if err := p.descriptor(parent, d, dp, statPath, depth); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) descriptor(parent *node, v *yaml.Node, path, statPath string, depth int) error {
	if p.count++; p.count > MaxFileDescriptors {
		return p.errf(path, "more than %d descriptors (YAML aliases included)", MaxFileDescriptors)
	}
	fields, err := p.mapping(v, path, descriptorFields)
	if err != nil {
		return err
	}
	var key, value string
	if kv, ok := fields["key"]; ok {
		if key, err = p.str(kv, path+".key"); err != nil {
			return err
		}
	}
	if key == "" {
		return p.errf(path+".key", "required: a descriptor has a non-empty key")
	}
	if len(key) > MaxEntryBytes {
		return p.errf(path+".key", "is %d bytes, more than %d", len(key), MaxEntryBytes)
	}
	hasValue := false
	if vv, ok := fields["value"]; ok {
		if value, err = p.str(vv, path+".value"); err != nil {
			return err
		}
		if len(value) > MaxEntryBytes {
			return p.errf(path+".value", "is %d bytes, more than %d", len(value), MaxEntryBytes)
		}
		hasValue = value != ""
	}
	flags := map[string]bool{}
	for _, name := range []string{"shadow_mode", "detailed_metric", "share_threshold"} {
		if fv, ok := fields[name]; ok {
			b, err := p.boolean(fv, path+"."+name)
			if err != nil {
				return err
			}
			flags[name] = b
		}
	}
	child := newNode()
	stat := statPath + "." + key
	switch {
	case hasValue && strings.HasSuffix(value, "*"):
		stat += "_" + value
		for _, w := range parent.wildcards {
			if w.key == key && w.prefix == strings.TrimSuffix(value, "*") {
				return p.errf(path, "duplicate descriptor %s", stat)
			}
		}
		child.key, child.prefix, child.share = key, strings.TrimSuffix(value, "*"), flags["share_threshold"]
		parent.wildcards = append(parent.wildcards, child)
	case hasValue:
		stat += "_" + value
		k := entryKey{key, value}
		if _, dup := parent.exact[k]; dup {
			return p.errf(path, "duplicate descriptor %s", stat)
		}
		parent.exact[k] = child
	default:
		if _, dup := parent.keyOnly[key]; dup {
			return p.errf(path, "duplicate descriptor %s", stat)
		}
		parent.keyOnly[key] = child
	}
	if rl, ok := fields["rate_limit"]; ok {
		r, err := p.rateLimit(rl, path+".rate_limit")
		if err != nil {
			return err
		}
		r.Path, r.File = stat, p.file
		r.Shadow, r.DetailedMetric = flags["shadow_mode"], flags["detailed_metric"]
		if r.PolicyID != "" {
			if r.Shadow {
				return p.errf(path+".shadow_mode", "not with rate_limit.policy: set the mode of Quotient policy %q to shadow instead", r.PolicyID)
			}
			if _, ok := p.c.policies[r.PolicyID]; !ok {
				p.c.policies[r.PolicyID] = stat
			}
		} else if !r.Unlimited && r.RequestsPerUnit > 0 {
			if r.policy, err = policyFor(policyID(stat), r.RequestsPerUnit, r.Unit.Seconds(), r.Shadow); err != nil {
				return p.errf(path+".rate_limit", "%v", err)
			}
		}
		child.rule = r
		p.c.rules++
	}
	if dv, ok := fields["descriptors"]; ok {
		if err := p.descriptors(child, dv, path+".descriptors", stat, depth+1); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) rateLimit(v *yaml.Node, path string) (*Rule, error) {
	fields, err := p.mapping(v, path, rateLimitFields)
	if err != nil {
		return nil, err
	}
	r := &Rule{}
	if pv, ok := fields["policy"]; ok {
		if r.PolicyID, err = p.str(pv, path+".policy"); err != nil {
			return nil, err
		}
		if !policyIDPattern.MatchString(r.PolicyID) {
			return nil, p.errf(path+".policy", "%q is not a policy id (1 to 64 of A-Z a-z 0-9 . _ -)", truncate(r.PolicyID))
		}
		for _, f := range []string{"unit", "requests_per_unit", "unlimited"} {
			if _, ok := fields[f]; ok {
				return nil, p.errf(path+"."+f, "not with policy: the Quotient policy %q states the limit", r.PolicyID)
			}
		}
	}
	if uv, ok := fields["unlimited"]; ok {
		if r.Unlimited, err = p.boolean(uv, path+".unlimited"); err != nil {
			return nil, err
		}
	}
	var unit string
	if uv, ok := fields["unit"]; ok {
		if unit, err = p.str(uv, path+".unit"); err != nil {
			return nil, err
		}
	}
	u := Unit(strings.ToLower(unit))
	switch {
	case r.Unlimited && u.Seconds() > 0:
		return nil, p.errf(path+".unit", "an unlimited rate limit takes no unit, got %q", unit)
	case !r.Unlimited && u.Seconds() == 0 && r.PolicyID == "":
		if unit == "" {
			return nil, p.errf(path+".unit", "required (second, minute, hour, day, week, month or year)")
		}
		return nil, p.errf(path+".unit", "invalid unit %q (want second, minute, hour, day, week, month or year)", unit)
	}
	if !r.Unlimited && r.PolicyID == "" {
		r.Unit = u
	}
	if rv, ok := fields["requests_per_unit"]; ok {
		if r.RequestsPerUnit, err = p.uint32(rv, path+".requests_per_unit"); err != nil {
			return nil, err
		}
	}
	if nv, ok := fields["name"]; ok {
		if r.Name, err = p.str(nv, path+".name"); err != nil {
			return nil, err
		}
	}
	if rv, ok := fields["replaces"]; ok {
		rv = resolve(rv)
		if rv.Kind != yaml.SequenceNode {
			return nil, p.errf(path+".replaces", "want a list of {name: ...}, got %s", kindName(rv))
		}
		for i, e := range rv.Content {
			ep := fmt.Sprintf("%s.replaces[%d]", path, i)
			ef, err := p.mapping(e, ep, map[string]bool{"name": true})
			if err != nil {
				return nil, err
			}
			var name string
			if nv, ok := ef["name"]; ok {
				if name, err = p.str(nv, ep+".name"); err != nil {
					return nil, err
				}
			}
			switch {
			case name == "":
				return nil, p.errf(ep+".name", "required: a replaces entry names a rate limit")
			case name == r.Name:
				return nil, p.errf(ep+".name", "a rate limit cannot replace itself (%q)", name)
			}
			r.Replaces = append(r.Replaces, name)
		}
	}
	return r, nil
}

// Entry is one key and value of a request descriptor.
type Entry struct {
	Key, Value string
}

// Match is the result of looking up one descriptor.
type Match struct {
	// Rule is the rule that applies; nil when none does.
	Rule *Rule
	// Values are the entry values the descriptor counts under: the
	// request's values, except where a share_threshold wildcard matched,
	// which counts under its pattern (every matching value shares one
	// counter).
	Values []string
}

// Lookup finds the rule of one descriptor of domain, as envoyproxy does:
// at each level an exact key and value, else the first wildcard of that
// key whose prefix the value has, else the key alone; the rule is the one
// reached at the descriptor's last entry (none when the tree is shallower
// or has no rule there). Pure; safe for concurrent use.
func (c *Config) Lookup(domain string, entries []Entry) Match {
	n := c.domains[domain]
	if n == nil || len(entries) == 0 {
		return Match{}
	}
	var m Match
	var values []string
	for i, e := range entries {
		next := n.exact[entryKey{e.Key, e.Value}]
		val := e.Value
		if next == nil {
			for _, w := range n.wildcards {
				if w.key == e.Key && strings.HasPrefix(e.Value, w.prefix) {
					next = w
					if w.share {
						val = w.prefix + "*"
					}
					break
				}
			}
		}
		if next == nil {
			next = n.keyOnly[e.Key]
		}
		if next == nil {
			return Match{}
		}
		values = append(values, val)
		if next.rule != nil && i == len(entries)-1 {
			m.Rule = next.rule
		}
		if !next.hasChildren() {
			break
		}
		n = next
	}
	if m.Rule != nil {
		m.Values = values
	}
	return m
}
