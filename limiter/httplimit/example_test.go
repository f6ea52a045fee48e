package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/limiter/httplimit"
)

// An HTTP middleware in front of an API: callers are identified by their API
// key (X-API-Key or a bearer token), the "pro" tier gets 2 requests per
// minute, and a rejected request gets 429 with Retry-After, the draft-10
// RateLimit fields and an RFC 9457 problem body.
func ExampleMiddleware() {
	pols, err := limiter.ParsePolicies([]byte(`[{"id": "pro-minute", "match": {"tier": "pro"},
		"algorithm": "fixed_window", "limit": 2, "window_s": 60}]`))
	if err != nil {
		panic(err)
	}
	// A MemoryStore (a RedisStore in a fleet), at a fixed time for this
	// example's output: 30 s into a minute.
	clock := fixedClock(time.Date(2026, 12, 1, 12, 0, 30, 0, time.UTC))
	l, err := limiter.New(limiter.Config{Clock: clock}, pols)
	if err != nil {
		panic(err)
	}
	keys := map[string]httplimit.KeyInfo{"k-123": {Tier: "pro", Account: "acme"}}
	identify := httplimit.APIKeyIdentity(func(k string) (httplimit.KeyInfo, bool) {
		info, ok := keys[k]
		return info, ok
	}, nil)
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	h := httplimit.Middleware(l, httplimit.WithIdentity(identify))(api)

	for range 3 {
		req := httptest.NewRequest(http.MethodGet, "/v1/orders", nil)
		req.Header.Set("X-API-Key", "k-123")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Printf("%d RateLimit: %s Retry-After: %q\n", rec.Code, rec.Header().Get("RateLimit"), rec.Header().Get("Retry-After"))
	}
	// Output:
	// 200 RateLimit: "pro-minute";r=1;t=30 Retry-After: ""
	// 200 RateLimit: "pro-minute";r=0;t=30 Retry-After: ""
	// 429 RateLimit: "pro-minute";r=0;t=30 Retry-After: "30"
}

type fixedClock time.Time

func (c fixedClock) Now() time.Time { return time.Time(c) }
