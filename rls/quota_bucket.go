package rls

import (
	"net/url"
	"sort"
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/quotientlabs/quotient/limiter"
)

// This file maps the buckets of Envoy's rate limit quota service (RLQS,
// package rls/quota) onto the configuration: a bucket_id is a map of
// string keys to string values, and its entries are matched as the
// entries of one RLS descriptor of the stream's domain.

// Bucket is the rule and the subject of one RLQS bucket.
type Bucket struct {
	// Rule is the rule the bucket's entries reach.
	Rule *Rule
	// Subject is the descriptor subject an RLS request with the same
	// entries, in the order the configuration nests them, counts under:
	// RLS and RLQS traffic of one descriptor is one subject.
	Subject limiter.Subject
	// Entries are the bucket's entries in the order the configuration's
	// tree nests them.
	Entries []Entry
}

// maxBucketSteps bounds the backtracking of LookupBucket (tree nodes
// tried), so that a crafted bucket cannot make a lookup expensive.
const maxBucketSteps = 4096

// LookupBucket finds the rule of an RLQS bucket of domain. A bucket_id has
// no order, so the lookup finds the path of the domain's descriptor tree
// that uses every entry exactly once: at each level it tries the remaining
// entries in sorted key order and, for each, envoyproxy's precedence (an
// exact key and value, then the wildcards of the key in file order, then
// the key alone), backtracking when a path ends before every entry is
// used or without a rule. The first complete path in that order wins, so
// the result does not depend on the map's iteration order. It reports
// false when no path carries a rule (or after maxBucketSteps tries). Pure;
// safe for concurrent use.
func (c *Config) LookupBucket(domain string, id map[string]string) (Bucket, bool) {
	root := c.domains[domain]
	if root == nil || len(id) == 0 {
		return Bucket{}, false
	}
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	used := make([]bool, len(keys))
	var path []Entry    // entries in tree order
	var values []string // counted values (share_threshold patterns)
	steps := 0
	var rule *Rule
	var walk func(n *node, depth int) bool
	walk = func(n *node, depth int) bool {
		for i, k := range keys {
			if used[i] {
				continue
			}
			v := id[k]
			try := func(next *node, counted string) bool {
				if steps++; steps > maxBucketSteps {
					return false
				}
				used[i] = true
				path = append(path, Entry{Key: k, Value: v})
				values = append(values, counted)
				if depth+1 == len(keys) {
					if next.rule != nil {
						rule = next.rule
						return true
					}
				} else if next.hasChildren() && walk(next, depth+1) {
					return true
				}
				used[i] = false
				path, values = path[:len(path)-1], values[:len(values)-1]
				return false
			}
			if next := n.exact[entryKey{k, v}]; next != nil && try(next, v) {
				return true
			}
			for _, w := range n.wildcards {
				if w.key == k && strings.HasPrefix(v, w.prefix) {
					counted := v
					if w.share {
						counted = w.prefix + "*"
					}
					if try(w, counted) {
						return true
					}
				}
			}
			if next := n.keyOnly[k]; next != nil && try(next, v) {
				return true
			}
		}
		return false
	}
	if !walk(root, 0) {
		return Bucket{}, false
	}
	entries := make([]*ratelimitv3.RateLimitDescriptor_Entry, len(path))
	for i, e := range path {
		entries[i] = &ratelimitv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value}
	}
	return Bucket{
		Rule:    rule,
		Subject: limiter.Subject{Kind: limiter.SubjectDescriptor, Value: subjectValue(domain, entries, values)},
		Entries: path,
	}, true
}

// BucketKey is the canonical encoding of an RLQS bucket of domain: the
// domain and every key=value in sorted key order, query-escaped and
// joined by '/'. Two bucket_id maps with the same entries have the same
// key whatever order they were built or sent in; escaping keeps '/' and
// '=' out of the parts, so distinct buckets never share a key.
func BucketKey(domain string, id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(url.QueryEscape(domain))
	for _, k := range keys {
		b.WriteByte('/')
		b.WriteString(url.QueryEscape(k))
		b.WriteByte('=')
		b.WriteString(url.QueryEscape(id[k]))
	}
	return b.String()
}
