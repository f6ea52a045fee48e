// Package rawcheck is the limiter's raw decision paths, for this module's
// simulator (package simulations), the coordinator's usage endpoint
// (region/admin) and tests: the store decision without the resilience
// layer, and the in-process fallback on its own, each at a time the caller
// gives. They are not part of package limiter's public API because they
// bypass what a gateway must not bypass (deadline, circuit breaker, deny
// cache, fallback, usage counting, metrics, events); being internal, only
// packages of this module can import them.
//
// Package limiter registers its unexported implementations through
// internal/rawcheck/hook when it is initialized; this package takes them
// in its own initialization and panics there if one is missing or has
// another type (a broken build, not a run-time condition).
//
// What it does not do: any decision logic of its own. Every function is
// the limiter's, as safe for concurrent use as the Limiter is.
package rawcheck

import (
	"context"
	"fmt"
	"time"

	"github.com/quotientlabs/quotient/internal/rawcheck/hook"
	"github.com/quotientlabs/quotient/limiter"
)

var (
	checkSubjectAt          = take[func(*limiter.Limiter, context.Context, time.Time, limiter.Subject, []*limiter.Policy, int64) (limiter.Decision, error)]("CheckSubjectAt", hook.CheckSubjectAt)
	checkSubjectsAt         = take[func(*limiter.Limiter, context.Context, time.Time, []limiter.SubjectPolicies, int64) (limiter.Decision, error)]("CheckSubjectsAt", hook.CheckSubjectsAt)
	checkSubjectsFallbackAt = take[func(*limiter.Limiter, time.Time, []limiter.SubjectPolicies, int64) (limiter.Decision, error)]("CheckSubjectsFallbackAt", hook.CheckSubjectsFallbackAt)
)

// take converts one registered hook to its func type F, panicking when
// limiter did not register it or registered another type.
func take[F any](name string, v any) F {
	f, ok := v.(F)
	if !ok {
		var want F
		panic(fmt.Sprintf("rawcheck: limiter registered hook.%s as %T, want %T", name, v, want))
	}
	return f
}

// CheckSubjectAt evaluates policies for one subject at now in l's store,
// bypassing policy selection, with one cost for all of them (0 peeks). It
// is the raw path: one store call, with none of the resilience layer (no
// deadline, breaker, fallback or deny cache), no usage counting, metrics
// or events, and no overrides; a store error is returned with a zero
// Decision. The RedisStore decides with Redis server time, other stores at
// now. Errors: limiter.ErrNoPolicies for a policy that was not validated,
// and the store's error.
func CheckSubjectAt(l *limiter.Limiter, ctx context.Context, now time.Time, subject limiter.Subject, policies []*limiter.Policy, cost int64) (limiter.Decision, error) {
	return checkSubjectAt(l, ctx, now, subject, policies, cost)
}

// CheckSubjectsAt is CheckSubjectAt for several subjects of one request:
// one store decision, all or nothing across the subjects as in
// (*limiter.Limiter).Check, with one cost for every policy (0 peeks) and
// none of the resilience layer, usage, metrics, events or overrides.
// Errors: those of (*limiter.Limiter).CheckSubjectsInto's checks (a policy
// not validated, a subject or a policy listed twice), and a store error
// with a zero Decision.
func CheckSubjectsAt(l *limiter.Limiter, ctx context.Context, now time.Time, subjects []limiter.SubjectPolicies, cost int64) (limiter.Decision, error) {
	return checkSubjectsAt(l, ctx, now, subjects, cost)
}

// CheckSubjectsFallbackAt answers the policies of one request's subjects
// at now as Check does while the store cannot answer: each policy's
// on_store_failure decides (open and local through l's in-process
// limiters at now, closed rejects with FailedClosed set), all or nothing
// across the subjects. It skips usage counting, metrics, events and
// overrides. The simulator models a store outage with it. Errors: those of
// CheckSubjectsAt's checks; the fallback itself cannot fail.
func CheckSubjectsFallbackAt(l *limiter.Limiter, now time.Time, subjects []limiter.SubjectPolicies, cost int64) (limiter.Decision, error) {
	return checkSubjectsFallbackAt(l, now, subjects, cost)
}
