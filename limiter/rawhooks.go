package limiter

import "github.com/quotientlabs/quotient/internal/rawcheck/hook"

// The raw decision paths, registered for internal/rawcheck (see its
// package documentation): callable by this module's simulator, tools and
// tests, absent from the public API.
func init() {
	hook.CheckSubjectAt = (*Limiter).checkSubjectAt
	hook.CheckSubjectsAt = (*Limiter).checkSubjectsAt
	hook.CheckSubjectsFallbackAt = (*Limiter).checkSubjectsFallbackAt
}
