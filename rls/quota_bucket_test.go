package rls

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/limiter"
)

const bucketConfig = `
domain: edge
descriptors:
  - key: tenant
    descriptors:
      - key: route
        value: /admin
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: route
        value: /api/*
        share_threshold: true
        rate_limit: {unit: second, requests_per_unit: 2}
      - key: route
        rate_limit: {unit: second, requests_per_unit: 3}
  - key: route
    descriptors:
      - key: method
        rate_limit: {unit: second, requests_per_unit: 4}
`

// LookupBucket finds the tree path that uses every bucket entry, in any
// order, with envoyproxy's precedence at each level, and its subject is
// the one an RLS descriptor with the entries in tree order counts under.
func TestLookupBucket(t *testing.T) {
	c, err := Parse([]File{{Name: "b.yaml", Data: []byte(bucketConfig)}}, ParseOptions{})
	require.NoError(t, err)
	for _, tc := range []struct {
		id    map[string]string
		rpu   uint32
		entry []Entry
		value string
	}{
		{map[string]string{"route": "/admin", "tenant": "t"}, 1, []Entry{{"tenant", "t"}, {"route", "/admin"}}, "edge/tenant=t/route=%2Fadmin"},
		{map[string]string{"route": "/api/x", "tenant": "t"}, 2, []Entry{{"tenant", "t"}, {"route", "/api/x"}}, "edge/tenant=t/route=%2Fapi%2F%2A"},
		{map[string]string{"tenant": "t", "route": "/other"}, 3, []Entry{{"tenant", "t"}, {"route", "/other"}}, "edge/tenant=t/route=%2Fother"},
		{map[string]string{"method": "GET", "route": "/x"}, 4, []Entry{{"route", "/x"}, {"method", "GET"}}, "edge/route=%2Fx/method=GET"},
	} {
		b, ok := c.LookupBucket("edge", tc.id)
		require.True(t, ok, "%v", tc.id)
		assert.Equal(t, tc.rpu, b.Rule.RequestsPerUnit, "%v", tc.id)
		assert.Equal(t, tc.entry, b.Entries)
		assert.Equal(t, limiter.Subject{Kind: limiter.SubjectDescriptor, Value: tc.value}, b.Subject)
	}
	for _, id := range []map[string]string{{"tenant": "t"}, {"route": "/x"}, {"tenant": "t", "route": "/x", "method": "GET"}, {}} {
		_, ok := c.LookupBucket("edge", id)
		assert.False(t, ok, "%v has no rule", id)
	}
	_, ok := c.LookupBucket("other", map[string]string{"route": "/x", "method": "GET"})
	assert.False(t, ok)
}

func TestBucketKeyCanonical(t *testing.T) {
	assert.Equal(t, "edge/a=1/b=2", BucketKey("edge", map[string]string{"b": "2", "a": "1"}))
	// Escaping keeps entries apart: {a: "1/b=2"} is not {a: 1, b: 2}.
	assert.NotEqual(t, BucketKey("edge", map[string]string{"a": "1/b=2"}), BucketKey("edge", map[string]string{"a": "1", "b": "2"}))
	assert.NotEqual(t, BucketKey("e/a=1", map[string]string{"b": "2"}), BucketKey("e", map[string]string{"a": "1", "b": "2"}))
}

// FuzzLookupBucket: any bucket_id (from a stream: outside input) is
// looked up without panicking, and the result is a function of the map's
// contents only (a map rebuilt in the reverse order gives the same
// bucket).
func FuzzLookupBucket(f *testing.F) {
	c, err := Parse([]File{{Name: "b.yaml", Data: []byte(bucketConfig)}}, ParseOptions{})
	require.NoError(f, err)
	f.Add("tenant", "t", "route", "/api/x", "", "")
	f.Add("route", "/x", "method", "GET", "tenant", "t")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string) {
		kv := [][2]string{{k1, v1}, {k2, v2}, {k3, v3}}
		fwd, rev := map[string]string{}, map[string]string{}
		for _, e := range kv {
			if e[0] != "" {
				fwd[e[0]] = e[1]
			}
		}
		for i := len(kv) - 1; i >= 0; i-- {
			if e := kv[i]; e[0] != "" {
				if _, ok := rev[e[0]]; !ok {
					rev[e[0]] = fwd[e[0]]
				}
			}
		}
		b1, ok1 := c.LookupBucket("edge", fwd)
		b2, ok2 := c.LookupBucket("edge", rev)
		require.Equal(t, ok1, ok2)
		require.Equal(t, BucketKey("edge", fwd), BucketKey("edge", rev))
		if ok1 {
			require.Equal(t, b1.Subject, b2.Subject)
			require.Same(t, b1.Rule, b2.Rule)
			require.Len(t, b1.Entries, len(fwd))
		}
	})
}
