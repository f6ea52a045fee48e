package httplimit

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/limiter"
)

const testPolicies = `[
 {"id":"burst","algorithm":"token_bucket","rate_per_sec":1,"burst":3},
 {"id":"daily","algorithm":"fixed_window","limit":1000,"window_s":86400},
 {"id":"shadowed","algorithm":"token_bucket","rate_per_sec":1,"burst":1,"mode":"shadow"},
 {"id":"login","subject":"ip","match":{"routes":["/login"]},"algorithm":"sliding_window_log","limit":2,"window_s":60,"class":"security"},
 {"id":"shaped","subject":"account","match":{"routes":["/slow"]},"algorithm":"leaky_bucket","rate_per_sec":10,"burst":10}
]`

type fixedClock struct{ t time.Time }

func (c *fixedClock) Now() time.Time { return c.t }

func newLimiter(t testing.TB, cfg limiter.Config, doc string) *limiter.Limiter {
	t.Helper()
	ps, err := limiter.ParsePolicies([]byte(doc))
	require.NoError(t, err)
	l, err := limiter.New(cfg, ps)
	require.NoError(t, err)
	return l
}

var keys = map[string]KeyInfo{"good-key": {Tier: "pro", Account: "acme"}}

func keyLookup(k string) (KeyInfo, bool) { i, ok := keys[k]; return i, ok }

func okHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("upstream"))
	})
}

func serve(h http.Handler, method, path string, hdr map[string]string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	r.RemoteAddr = "192.0.2.10:4321"
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// parsedList parses a field with the structured-field parser and returns
// item name -> params.
func parsedList(t *testing.T, h http.Header, name string) map[string]map[string]int64 {
	t.Helper()
	list, err := httpsfv.UnmarshalList(h.Values(name))
	require.NoError(t, err, "%s: %q", name, h.Values(name))
	out := map[string]map[string]int64{}
	for _, m := range list {
		it, ok := m.(httpsfv.Item)
		require.True(t, ok)
		id, ok := it.Value.(string)
		require.True(t, ok, "the item is a String")
		params := map[string]int64{}
		for _, n := range it.Params.Names() {
			v, _ := it.Params.Get(n)
			params[n] = v.(int64)
		}
		out[id] = params
	}
	return out
}

func TestHeadersAndProblemOn429(t *testing.T) {
	clock := &fixedClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	l := newLimiter(t, limiter.Config{Clock: clock}, testPolicies)
	h := Middleware(l, WithIdentity(APIKeyIdentity(keyLookup, nil)))(okHandler())
	hdr := map[string]string{"X-API-Key": "good-key"}

	for i := range 3 {
		w := serve(h, "GET", "/v1/orders", hdr)
		require.Equal(t, http.StatusOK, w.Code)
		assert.Equal(t, "upstream", w.Body.String())
		pol := parsedList(t, w.Header(), HeaderRateLimitPolicy)
		assert.Equal(t, map[string]map[string]int64{
			"burst": {"q": 3, "w": 3},
			"daily": {"q": 1000, "w": 86400},
		}, pol, "shadow and security policies are not advertised")
		rl := parsedList(t, w.Header(), HeaderRateLimit)
		assert.Equal(t, int64(2-i), rl["burst"]["r"])
		assert.Equal(t, int64(i+1), rl["burst"]["t"], "seconds until the bucket is full again")
		assert.Equal(t, int64(12*3600), rl["daily"]["t"], "the UTC day ends at midnight")
		assert.Empty(t, w.Header().Get(HeaderRetryAfter))
	}
	w := serve(h, "GET", "/v1/orders", hdr)
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	ra, err := strconv.Atoi(w.Header().Get(HeaderRetryAfter))
	require.NoError(t, err)
	assert.Equal(t, 1, ra)
	rl := parsedList(t, w.Header(), HeaderRateLimit)
	assert.Equal(t, map[string]map[string]int64{"burst": {"r": 0, "t": 1}}, rl, "only the violated policy")
	for _, p := range rl {
		assert.LessOrEqual(t, p["t"], int64(ra), "Retry-After is never earlier than the reset")
	}
	var prob map[string]any
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &prob))
	assert.Equal(t, ProblemQuotaExceeded, prob["type"])
	assert.Equal(t, "Quota exceeded", prob["title"])
	assert.Equal(t, float64(429), prob["status"])
	assert.Equal(t, "/v1/orders", prob["instance"])
	assert.Contains(t, prob["detail"], "retry after 1 second")
	assert.Equal(t, []any{"burst"}, prob["violated-policies"])
}

func TestSecurityPoliciesAreNeverExposed(t *testing.T) {
	l := newLimiter(t, limiter.Config{}, testPolicies)
	h := Middleware(l)(okHandler())
	for range 2 {
		w := serve(h, "POST", "/login", nil)
		require.Equal(t, http.StatusOK, w.Code)
		assert.Empty(t, w.Header().Get(HeaderRateLimitPolicy), "anonymous: only the security policy applies")
		assert.Empty(t, w.Header().Get(HeaderRateLimit))
	}
	w := serve(h, "POST", "/login", nil)
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.NotEmpty(t, w.Header().Get(HeaderRetryAfter))
	assert.Empty(t, w.Header().Get(HeaderRateLimit))
	assert.NotContains(t, w.Body.String(), `"login"`, "the policy id is not disclosed")
	var prob Problem
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &prob))
	assert.Empty(t, prob.ViolatedPolicies)
	assert.Contains(t, prob.Detail, "Too many attempts")
}

// closedRedisStore is a RedisStore whose server is gone: every call fails.
func closedRedisStore(t *testing.T) *limiter.RedisStore {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	return limiter.NewRedisStore(client)
}

func TestSecurityFailClosedIs503(t *testing.T) {
	// Any Store but the MemoryStore gets the resilience layer; a
	// RedisStore on a closed port fails every call.
	l := newLimiter(t, limiter.Config{Store: closedRedisStore(t)}, testPolicies)
	h := Middleware(l, WithIdentity(APIKeyIdentity(keyLookup, nil)))(okHandler())
	w := serve(h, "POST", "/login", map[string]string{"X-API-Key": "good-key"})
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	var prob Problem
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &prob))
	assert.Equal(t, ProblemTemporaryReducedCapacity, prob.Type)
	assert.Equal(t, 503, prob.Status)
	assert.NotContains(t, prob.ViolatedPolicies, "login")
	assert.GreaterOrEqual(t, w.Header().Get(HeaderRetryAfter), "1")

	// Quota traffic on the same broken store fails open.
	w = serve(h, "GET", "/v1/orders", map[string]string{"X-API-Key": "good-key"})
	assert.Equal(t, http.StatusOK, w.Code)
	assert.NotEmpty(t, w.Header().Get(HeaderRateLimit))
}

func TestLeakyBucketDelayIsWaited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, limiter.Config{Clock: &fixedClock{t: time.Now()}}, `[{"id":"shaped","subject":"account","algorithm":"leaky_bucket","rate_per_sec":10,"burst":10}]`)
		var forwarded []time.Duration
		start := time.Now()
		next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			forwarded = append(forwarded, time.Since(start))
		})
		h := Middleware(l, WithIdentity(APIKeyIdentity(keyLookup, nil)), WithMaxDelay(250*time.Millisecond))(next)
		hdr := map[string]string{"X-API-Key": "good-key"}
		// The limiter's clock is frozen at the bubble's start: each request
		// queues behind the previous ones, 100 ms apiece at 10/s.
		for range 4 {
			start = time.Now()
			w := serve(h, "GET", "/slow", hdr)
			require.Equal(t, http.StatusOK, w.Code)
		}
		assert.Equal(t, []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 250 * time.Millisecond}, forwarded, "capped by WithMaxDelay")

		// A client that leaves while held is not forwarded.
		forwarded = nil
		ctx, cancel := context.WithCancel(context.Background())
		r := httptest.NewRequest("GET", "/slow", nil).WithContext(ctx)
		r.Header.Set("X-API-Key", "good-key")
		r.RemoteAddr = "192.0.2.10:1"
		done := make(chan struct{})
		go func() { h.ServeHTTP(httptest.NewRecorder(), r); close(done) }()
		synctest.Wait()
		cancel()
		<-done
		assert.Empty(t, forwarded)
	})
}

func TestHooksReplaceResponses(t *testing.T) {
	l := newLimiter(t, limiter.Config{}, `[{"id":"one","subject":"ip","algorithm":"token_bucket","rate_per_sec":1,"burst":1}]`)
	var seen *limiter.Decision
	h := Middleware(l,
		WithDenied(func(w http.ResponseWriter, r *http.Request, d *limiter.Decision) {
			seen = d
			w.WriteHeader(http.StatusTeapot)
		}),
		WithIdentity(func(r *http.Request) (limiter.Identity, error) {
			if r.URL.Path == "/bad" {
				return limiter.Identity{}, assert.AnError
			}
			return ClientIPIdentity(nil)(r)
		}),
	)(okHandler())
	assert.Equal(t, http.StatusOK, serve(h, "GET", "/", nil).Code)
	w := serve(h, "GET", "/", nil)
	assert.Equal(t, http.StatusTeapot, w.Code)
	require.NotNil(t, seen)
	assert.NotEmpty(t, w.Header().Get(HeaderRetryAfter), "fields are set before the hook")
	w = serve(h, "GET", "/bad", nil)
	assert.Equal(t, http.StatusBadRequest, w.Code)
	assert.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
}

// BenchmarkMiddleware is the middleware's overhead per allowed request with
// an in-memory store (no network): identity, decision, fields, next.
// Target: <= 20 µs.
func BenchmarkMiddleware(b *testing.B) {
	l := newLimiter(b, limiter.Config{EventSampleRate: -1}, `[
	 {"id":"burst","algorithm":"token_bucket","rate_per_sec":1e6,"burst":1e6},
	 {"id":"daily","algorithm":"fixed_window","limit":1000000000,"window_s":86400}]`)
	h := Middleware(l, WithIdentity(APIKeyIdentity(keyLookup, nil)))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest("GET", "/v1/orders", nil)
	r.RemoteAddr = "192.0.2.10:4321"
	r.Header.Set("X-API-Key", "good-key")
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		clear(w.Header())
		h.ServeHTTP(w, r)
	}
	require.NotEmpty(b, w.Header().Get(HeaderRateLimit))
}

// TestMonthlyPolicyFields: a calendar-month window is advertised with w =
// 31 days, and its reset runs until the next month starts.
func TestMonthlyPolicyFields(t *testing.T) {
	clock := &fixedClock{t: time.Date(2028, 2, 29, 12, 0, 0, 0, time.UTC)}
	l := newLimiter(t, limiter.Config{Clock: clock}, `[{"id":"monthly","algorithm":"fixed_window","limit":50000,"window":"month"}]`)
	h := Middleware(l, WithIdentity(APIKeyIdentity(keyLookup, nil)))(okHandler())
	w := serve(h, "GET", "/v1/orders", map[string]string{"X-API-Key": "good-key"})
	require.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, map[string]map[string]int64{"monthly": {"q": 50000, "w": 31 * 86400}}, parsedList(t, w.Header(), HeaderRateLimitPolicy))
	assert.Equal(t, map[string]map[string]int64{"monthly": {"r": 49999, "t": 12 * 3600}}, parsedList(t, w.Header(), HeaderRateLimit),
		"leap-year February ends at midnight")
}
