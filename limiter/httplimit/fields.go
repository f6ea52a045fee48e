package httplimit

import (
	"net/http"

	"github.com/quotientlabs/quotient/limiter"
)

// SetFields writes the fields the middleware sends for d into h:
// RateLimit-Policy and RateLimit of the enforced, non-security policies
// (DraftRevision), and Retry-After (delay-seconds, at least 1) when d
// rejects. It is for servers that answer for another proxy, such as an
// Envoy rate limit service, and caches nothing, so it may be called with
// policies built per request. Safe for concurrent use.
func SetFields(h http.Header, d *limiter.Decision) {
	var items policyItems
	items.setFields(h, d)
}
