package limiter

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// seedExample is the policy of the seed design, section 4.3, verbatim.
const seedExample = `{"id": "pro-default", "version": 7, "match": {"tier": "pro", "routes": ["/v1/*"]}, "algorithm": "token_bucket", "rate_per_sec": 100, "burst": 200, "cost": {"POST /v1/exports": 10}, "on_store_failure": "open", "mode": "enforce"}`

func TestParseSeedExample(t *testing.T) {
	ps, err := ParsePolicies([]byte(seedExample))
	require.NoError(t, err)
	require.Len(t, ps, 1)
	p := ps[0]
	assert.Equal(t, "pro-default", p.ID)
	assert.Equal(t, int64(7), p.Version)
	assert.Equal(t, TokenBucket, p.Algorithm)
	assert.Equal(t, int64(100_000), p.RateMilli())
	assert.Equal(t, int64(200_000), p.BurstMilli())
	assert.Equal(t, int64(200), p.Capacity())
	assert.Equal(t, Enforce, p.Mode)
	assert.Equal(t, FailOpen, p.OnStoreFailure)
	// Defaults.
	assert.Equal(t, SubjectAPIKey, p.Subject)
	assert.Equal(t, ClassQuota, p.Class)
	assert.Equal(t, ScopeRegion, p.Scope)
	// Matching and costs.
	assert.True(t, p.Matches("pro", "GET", "/v1/orders"))
	assert.True(t, p.Matches("pro", "POST", "/v1/exports/today"))
	assert.False(t, p.Matches("free", "GET", "/v1/orders"))
	assert.False(t, p.Matches("pro", "GET", "/v2/orders"))
	assert.Equal(t, int64(10), p.CostOf("POST", "/v1/exports"))
	assert.Equal(t, int64(1), p.CostOf("GET", "/v1/exports"))
	assert.Equal(t, int64(1), p.CostOf("POST", "/v1/orders"))
}

func TestParseDefaultsByClass(t *testing.T) {
	ps, err := ParsePolicies([]byte(`[
		{"id":"a","algorithm":"token_bucket","rate_per_sec":2.5},
		{"id":"b","algorithm":"sliding_window_counter","limit":5,"window_s":900,"class":"security","subject":"account"},
		{"id":"c","algorithm":"fixed_window","limit":10000,"window_s":86400,"class":"capacity","scope":"global"}
	]`))
	require.NoError(t, err)
	assert.Equal(t, 3.0, ps[0].Burst, "burst defaults to the rate rounded up")
	assert.Equal(t, FailOpen, ps[0].OnStoreFailure)
	assert.Equal(t, FailClosed, ps[1].OnStoreFailure)
	assert.Equal(t, FailLocal, ps[2].OnStoreFailure)
	assert.Equal(t, int64(900_000), ps[1].WindowMs())
}

// TestParseErrorsNameTheField checks that every kind of broken document is
// rejected with a message whose path names the offending field.
func TestParseErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name, doc, path, msg string
	}{
		{"unknown field", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"colour":"red"}]`, "policies[0].colour", "unknown field"},
		{"unknown match field", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"match":{"tier":"x","path":"/"}}]`, "policies[0].match.path", "unknown field"},
		{"negative rate", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":-5}]`, "policies[0].rate_per_sec", "must be > 0"},
		{"zero rate", `[{"id":"a","algorithm":"leaky_bucket","rate_per_sec":0,"burst":3}]`, "policies[0].rate_per_sec", "must be > 0"},
		{"too precise rate", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":0.0001}]`, "policies[0].rate_per_sec", "three decimals"},
		{"zero window", `[{"id":"a","algorithm":"fixed_window","limit":5,"window_s":0}]`, "policies[0].window_s", "between 1 and"},
		{"missing limit", `[{"id":"a","algorithm":"sliding_window_log","window_s":60}]`, "policies[0].limit", "between 1 and"},
		{"sliding log over its bound", `[{"id":"a","algorithm":"sliding_window_log","limit":1001,"window_s":60}]`, "policies[0].limit", "must be at most 1000, got 1001; use sliding_window_counter"},
		{"sliding log at the old bound", `[{"id":"a","algorithm":"sliding_window_log","limit":1000000000000,"window_s":60}]`, "policies[0].limit", "sliding_window_log keeps every admitted request"},
		{"unknown algorithm", `[{"id":"a","algorithm":"magic","rate_per_sec":1}]`, "policies[0].algorithm", `unknown algorithm "magic"`},
		{"missing algorithm", `[{"id":"a","rate_per_sec":1}]`, "policies[0].algorithm", "required"},
		{"duplicate id", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1},{"id":"a","algorithm":"token_bucket","rate_per_sec":2}]`, "policies[1].id", `duplicate id "a" (also policies[0])`},
		{"missing id", `[{"algorithm":"token_bucket","rate_per_sec":1}]`, "policies[0].id", "required"},
		{"bad id", `[{"id":"a b{}","algorithm":"token_bucket","rate_per_sec":1}]`, "policies[0].id", "must be 1 to 64"},
		{"wrong type", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":"fast"}]`, "policies[0].rate_per_sec", "wrong type"},
		{"fractional limit", `[{"id":"a","algorithm":"fixed_window","limit":2.5,"window_s":60}]`, "policies[0].limit", "wrong type"},
		{"bucket with window", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"window_s":60}]`, "policies[0].window_s", "not a parameter of token_bucket"},
		{"window with burst", `[{"id":"a","algorithm":"fixed_window","limit":5,"window_s":60,"burst":3}]`, "policies[0].burst", "not a parameter of fixed_window"},
		{"bad subject", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"subject":"planet"}]`, "policies[0].subject", "unknown subject"},
		{"bad class", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"class":"vip"}]`, "policies[0].class", "unknown class"},
		{"bad failure mode", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"on_store_failure":"maybe"}]`, "policies[0].on_store_failure", "unknown value"},
		{"bad mode", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"mode":"loud"}]`, "policies[0].mode", "unknown mode"},
		{"bad scope", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"scope":"planet"}]`, "policies[0].scope", "unknown scope"},
		{"global sliding window", `[{"id":"a","algorithm":"sliding_window_log","limit":5,"window_s":60,"scope":"global"}]`, "policies[0].scope", "global scope is supported"},
		{"bad cost key", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"burst":20,"cost":{"exports":10}}]`, `policies[0].cost["exports"]`, "METHOD /route"},
		{"negative cost", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"burst":20,"cost":{"POST /x":-1}}]`, `policies[0].cost["POST /x"]`, "between 0 and"},
		{"cost over capacity", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"burst":5,"cost":{"POST /x":10}}]`, `policies[0].cost["POST /x"]`, "could never be admitted"},
		{"bad route", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"match":{"routes":["v1/*"]}}]`, "policies[0].match.routes[0]", "starts with '/'"},
		{"bad method", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"match":{"methods":["get"]}}]`, "policies[0].match.methods[0]", "upper case"},
		{"repeated field", `[{"id":"a","id":"b","algorithm":"token_bucket","rate_per_sec":1}]`, "policies", `field "id" appears twice`},
		{"not an array", `"hello"`, "policies", "not a JSON array"},
		{"not an object", `[42]`, "policies[0]", "not a JSON object"},
		{"malformed", `[{"id":"a",}]`, "policies", "malformed JSON"},
		{"negative version", `[{"id":"a","version":-1,"algorithm":"token_bucket","rate_per_sec":1}]`, "policies[0].version", "must be >= 0"},
		{"month and window_s", `[{"id":"a","algorithm":"fixed_window","limit":5,"window":"month","window_s":60}]`, "policies[0].window_s", `set window "month" or window_s, not both`},
		{"unknown window", `[{"id":"a","algorithm":"fixed_window","limit":5,"window":"week"}]`, "policies[0].window", `unknown window "week" (want "month"`},
		{"window in upper case", `[{"id":"a","algorithm":"fixed_window","limit":5,"window":"MONTH"}]`, "policies[0].window", `unknown window "MONTH"`},
		{"month on a sliding window", `[{"id":"a","algorithm":"sliding_window_counter","limit":5,"window":"month"}]`, "policies[0].window", "fixed_window only"},
		{"month on a bucket", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"window":"month"}]`, "policies[0].window", "not a parameter of token_bucket"},
		{"window of the wrong type", `[{"id":"a","algorithm":"fixed_window","limit":5,"window":30}]`, "policies[0].window", "wrong type"},
		{"fixed window without either", `[{"id":"a","algorithm":"fixed_window","limit":5}]`, "policies[0].window_s", `or set window: "month"`},
		{"month without limit", `[{"id":"a","algorithm":"fixed_window","window":"month","scope":"global"}]`, "policies[0].limit", "between 1 and"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParsePolicies([]byte(c.doc))
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrInvalidPolicy))
			var pe *PolicyError
			require.ErrorAs(t, err, &pe)
			found := false
			for _, f := range pe.Fields {
				if f.Path == c.path && strings.Contains(f.Msg, c.msg) {
					found = true
				}
			}
			assert.True(t, found, "want %s: ...%s..., got %v", c.path, c.msg, err)
		})
	}
}

func TestParseMonthWindow(t *testing.T) {
	ps, err := ParsePolicies([]byte(`[
		{"id":"m","algorithm":"fixed_window","limit":10000,"window":"month"},
		{"id":"g","algorithm":"fixed_window","limit":500,"window":"month","scope":"global"}
	]`))
	require.NoError(t, err)
	for _, p := range ps {
		assert.True(t, p.Monthly(), p.ID)
		assert.Equal(t, int64(0), p.WindowSec, p.ID)
		assert.Equal(t, int64(0), p.WindowMs(), "a month has no one length")
		assert.Equal(t, int64(31*86400), p.NominalWindowSec())
	}
	assert.Equal(t, ScopeGlobal, ps[1].Scope)
	start, end := ps[0].WindowAt(time.Date(2028, 2, 29, 23, 59, 59, 0, time.FixedZone("x", 3600)))
	assert.Equal(t, time.Date(2028, 2, 1, 0, 0, 0, 0, time.UTC), start)
	assert.Equal(t, time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC), end)

	// The field survives a round trip through JSON (the policy log stores
	// policies as JSON).
	doc, err := json.Marshal(ps[1])
	require.NoError(t, err)
	assert.Contains(t, string(doc), `"window":"month"`)
	assert.NotContains(t, string(doc), `window_s`)
	back, err := ParsePolicy(doc)
	require.NoError(t, err)
	assert.True(t, back.Monthly())

	// Fixed lengths are unchanged: aligned to the epoch.
	day := mustPolicy(t, `{"id":"d","algorithm":"fixed_window","limit":5,"window_s":86400}`)
	assert.False(t, day.Monthly())
	assert.Equal(t, int64(86400), day.NominalWindowSec())
	start, end = day.WindowAt(time.Date(2026, 12, 31, 23, 0, 0, 0, time.UTC))
	assert.Equal(t, time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC), start)
	assert.Equal(t, time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), end)
	bucket := mustPolicy(t, `{"id":"b","algorithm":"token_bucket","rate_per_sec":1}`)
	start, _ = bucket.WindowAt(time.Now())
	assert.True(t, start.IsZero())
	assert.Equal(t, int64(0), bucket.NominalWindowSec())
}

func TestParseReportsEveryProblem(t *testing.T) {
	_, err := ParsePolicies([]byte(`[{"id":"a","algorithm":"token_bucket","rate_per_sec":-1,"burst":-2,"mode":"x"}]`))
	var pe *PolicyError
	require.ErrorAs(t, err, &pe)
	var paths []string
	for _, f := range pe.Fields {
		paths = append(paths, f.Path)
	}
	assert.ElementsMatch(t, []string{"policies[0].rate_per_sec", "policies[0].burst", "policies[0].mode"}, paths)
}

func TestNewRejectsUnvalidatedPolicies(t *testing.T) {
	_, err := New(Config{}, []*Policy{{ID: "a", Algorithm: TokenBucket, RatePerSec: 1}})
	require.ErrorIs(t, err, ErrNoPolicies)
	p := &Policy{ID: "a", Algorithm: TokenBucket, RatePerSec: 1}
	require.NoError(t, p.Validate())
	_, err = New(Config{}, []*Policy{p})
	require.NoError(t, err)
}

func TestGlobMatch(t *testing.T) {
	cases := []struct {
		pattern, s string
		want       bool
	}{
		{"/v1/*", "/v1/orders", true},
		{"/v1/*", "/v1/orders/7/items", true},
		{"/v1/*", "/v1", false},
		{"/v1/*/export", "/v1/a/b/export", true},
		{"/v1/*/export", "/v1/a/b/exports", false},
		{"*", "/anything", true},
		{"/exact", "/exact", true},
		{"/exact", "/exact/", false},
		{"/a*b*c", "/aXbYc", true},
		{"/a*b*c", "/aXbY", false},
		{"/**", "/x", true},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, globMatch(c.pattern, c.s), "%q ~ %q", c.pattern, c.s)
	}
}

// TestSlidingLogLimitBound: sliding_window_log accepts limits up to
// MaxSlidingLogLimit and no more, while the other window algorithms keep
// MaxLimit.
func TestSlidingLogLimitBound(t *testing.T) {
	doc := func(algo string, limit int64) string {
		return fmt.Sprintf(`{"id":"a","algorithm":%q,"limit":%d,"window_s":60}`, algo, limit)
	}
	p, err := ParsePolicy([]byte(doc("sliding_window_log", MaxSlidingLogLimit)))
	require.NoError(t, err)
	assert.Equal(t, int64(MaxSlidingLogLimit), p.Limit)
	_, err = ParsePolicy([]byte(doc("sliding_window_log", MaxSlidingLogLimit+1)))
	var pe *PolicyError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Fields, 1)
	assert.Equal(t, "policy.limit", pe.Fields[0].Path)
	assert.Contains(t, pe.Fields[0].Msg, "sliding_window_counter")
	for _, algo := range []string{"sliding_window_counter", "fixed_window"} {
		_, err := ParsePolicy([]byte(doc(algo, MaxLimit)))
		require.NoError(t, err, algo)
	}
	// A hand-built policy is held to the same bound.
	hand := &Policy{ID: "h", Algorithm: SlidingWindowLog, Limit: MaxSlidingLogLimit + 1, WindowSec: 1}
	require.ErrorIs(t, hand.Validate(), ErrInvalidPolicy)
}
