package limiter_test

import (
	"context"
	"fmt"
	"time"

	"github.com/quotientlabs/quotient/limiter"
)

// fixedClock is a clock the examples set by hand, so their output does
// not depend on when they run.
type fixedClock struct{ t time.Time }

func (c *fixedClock) Now() time.Time { return c.t }

// exampleLimiter is a limiter of the policies of doc on a MemoryStore, at
// a fixed time, as in Example.
func exampleLimiter(doc string) (*limiter.Limiter, []*limiter.Policy) {
	pols, err := limiter.ParsePolicies([]byte(doc))
	if err != nil {
		panic(err)
	}
	clock := &fixedClock{time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	l, err := limiter.New(limiter.Config{Clock: clock}, pols)
	if err != nil {
		panic(err)
	}
	return l, pols
}

// One region, one policy: a token bucket of 3 requests refilled at 1 per
// second, per API key. The MemoryStore decides in process; in a gateway
// fleet use a RedisStore (NewRedisStore) shared by every gateway of the
// region, which decides with Redis server time.
func Example() {
	pols, err := limiter.ParsePolicies([]byte(`[{"id": "burst", "subject": "api_key",
		"algorithm": "token_bucket", "rate_per_sec": 1, "burst": 3}]`))
	if err != nil {
		panic(err)
	}
	clock := &fixedClock{time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	l, err := limiter.New(limiter.Config{Store: limiter.NewMemoryStore(), Clock: clock}, pols)
	if err != nil {
		panic(err)
	}
	key := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "key-1"}
	for range 4 {
		d, err := l.Allow(context.Background(), key, pols...)
		if err != nil {
			panic(err)
		}
		fmt.Println(d.Allowed, d.Policies[0].Remaining, d.RetryAfter())
	}
	clock.t = clock.t.Add(time.Second)
	d, _ := l.Allow(context.Background(), key, pols...)
	fmt.Println("a second later:", d.Allowed)
	// Output:
	// true 2 0s
	// true 1 0s
	// true 0 0s
	// false 0 1s
	// a second later: true
}

// A global policy holds across regions: each region enforces a share of
// it. Without a share record a region gets the default, 1/Regions of the
// rate and burst; the coordinators write records that move capacity to
// where the demand is (in Redis: the qu:share keys; here, in the
// MemoryStore, SetShare). Σ of the shares never exceeds the global limit.
func Example_globalShares() {
	pols, err := limiter.ParsePolicies([]byte(`[{"id": "pro", "scope": "global", "subject": "account",
		"algorithm": "token_bucket", "rate_per_sec": 30, "burst": 30}]`))
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	store := limiter.NewMemoryStore()
	clock := &fixedClock{now}
	l, err := limiter.New(limiter.Config{Store: store, Clock: clock, Regions: 3, Region: "eu-west"}, pols)
	if err != nil {
		panic(err)
	}
	acct := limiter.Subject{Kind: limiter.SubjectAccount, Value: "acme"}
	admitted := func() (n int) {
		for range 40 {
			if d, _ := l.Allow(context.Background(), acct, pols...); d.Allowed {
				n++
			}
		}
		return n
	}
	fmt.Println("default share (30/3):", admitted())
	// The coordinators gave this region 20 of the 30 (the other two hold
	// 10 together); a change carries the tokens left, so a second later the
	// bucket has refilled at 20/s to its new burst.
	store.SetShare(now, acct, "pro", 20_000, 20_000, time.Minute)
	clock.t = now.Add(time.Second)
	fmt.Println("a second after a share of 20:", admitted())
	// Output:
	// default share (30/3): 10
	// a second after a share of 20: 20
}

// A policy in shadow mode is evaluated and reported but never rejects, so a
// new limit can be watched on real traffic before it is enforced: the
// decision says whether it would have rejected.
func Example_shadowMode() {
	l, pols := exampleLimiter(`[
		{"id": "current", "algorithm": "fixed_window", "limit": 5, "window_s": 60},
		{"id": "stricter", "algorithm": "fixed_window", "limit": 2, "window_s": 60, "mode": "shadow"}]`)
	key := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "key-1"}
	for range 3 {
		d, _ := l.Allow(context.Background(), key, pols...)
		fmt.Printf("allowed=%v stricter would allow=%v\n", d.Allowed, d.Policies[1].Allowed)
	}
	// Output:
	// allowed=true stricter would allow=true
	// allowed=true stricter would allow=true
	// allowed=true stricter would allow=false
}

// A leaky bucket shapes instead of rejecting at once: Reserve says when each
// admitted request may run (the queue ahead of it drains at the rate), and
// Wait sleeps that long itself.
func ExampleLimiter_Reserve() {
	l, pols := exampleLimiter(`[{"id": "shape", "algorithm": "leaky_bucket", "rate_per_sec": 5, "burst": 3}]`)
	key := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "key-1"}
	for range 4 {
		r, err := l.Reserve(context.Background(), key, 1, pols...)
		if err != nil {
			panic(err)
		}
		fmt.Println(r.OK, r.Decision.Delay)
	}
	// Output:
	// true 0s
	// true 200ms
	// true 400ms
	// false 0s
}
