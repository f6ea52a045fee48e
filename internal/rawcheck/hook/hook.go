// Package hook carries the limiter's raw decision paths from package
// limiter to package internal/rawcheck without exporting them from
// limiter's public API.
//
// Package limiter sets every variable once, in its init function, to a
// method expression of its own unexported methods; internal/rawcheck
// converts each to its concrete func type when it is initialized (after
// limiter, which it imports) and panics there if one is missing or has
// another type, so a mismatch fails every program and test that imports
// rawcheck at start-up rather than at a call. Nothing else reads or writes
// them: callers use internal/rawcheck.
//
// The values are typed any because their func types name limiter's types,
// and limiter cannot import a package that imports limiter (the pattern of
// google.golang.org/grpc/internal).
//
// What it does not do: anything at run time. It has no logic, no I/O and
// no state but the variables, written before main starts and only read
// afterwards, so concurrent reads are safe.
package hook

// The raw paths. Each comment gives the concrete type the value holds.
var (
	// CheckSubjectAt holds
	// func(*limiter.Limiter, context.Context, time.Time, limiter.Subject, []*limiter.Policy, int64) (limiter.Decision, error).
	CheckSubjectAt any
	// CheckSubjectsAt holds
	// func(*limiter.Limiter, context.Context, time.Time, []limiter.SubjectPolicies, int64) (limiter.Decision, error).
	CheckSubjectsAt any
	// CheckSubjectsFallbackAt holds
	// func(*limiter.Limiter, time.Time, []limiter.SubjectPolicies, int64) (limiter.Decision, error).
	CheckSubjectsFallbackAt any
)
