// Package httplimit puts a limiter.Limiter in front of an http.Handler: it
// identifies the caller, decides the request, writes the rate limit
// response fields, and answers rejected requests with a problem document.
//
// # Response fields (pinned: draft-ietf-httpapi-ratelimit-headers-10)
//
// The RateLimit-Policy and RateLimit fields follow
// draft-ietf-httpapi-ratelimit-headers-10 exactly (earlier and later
// revisions differ in syntax; this package implements -10 only). Both are
// Structured Field Lists (RFC 9651) serialized with github.com/dunglas/httpsfv,
// one Item per policy, the item being the policy id as a String:
//
//		RateLimit-Policy: "pro-burst";q=200;w=2, "pro-daily";q=50000;w=86400
//		RateLimit: "pro-burst";r=17;t=1, "pro-daily";r=49321;t=41234
//
//	  - q is the policy's quota in cost units: burst for token and leaky
//	    buckets, limit for windows (the global value for global policies);
//	  - w is the window in seconds: window_s for windows, 2678400 (31 days,
//	    the longest month) for calendar-month windows, and for buckets the
//	    time to refill a whole burst, ceil(burst / rate_per_sec), at least 1;
//	  - r is the remaining quota in cost units after this request;
//	  - t is, on an allowed response, the seconds until the quota is whole
//	    again (ceil of the reset); on a 429, the seconds until this request's
//	    cost could be admitted under that policy (ceil of its retry time).
//
// Only enforced policies appear (shadow policies do not limit), never a
// security-class policy (seed design 9.2: login limits are not disclosed),
// and no partition key (pk) is sent. Both fields are set on allowed
// responses too. On a 429, RateLimit lists only the policies that rejected
// the request, so that Retry-After, the largest of their retry times
// rounded up to whole seconds (at least 1), is never earlier than any
// reset parameter sent with it (draft section 6).
//
// # Rejections
//
// A rejected request gets 429 Too Many Requests with Retry-After
// (delay-seconds) and an RFC 9457 application/problem+json body of the
// draft's "quota-exceeded" type:
//
//	{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
//	 "title":"Quota exceeded","status":429,
//	 "detail":"Rate limit exceeded; retry after 3 seconds.",
//	 "instance":"/v1/orders","violated-policies":["pro-burst"]}
//
// violated-policies names the enforced non-security policies that
// rejected. When the limiter could not decide an enforced fail-closed
// policy (Redis down; in practice security policies), the answer is 503
// Service Unavailable with Retry-After and a problem of the draft's
// "temporary-reduced-capacity" type. The hooks WithDenied and WithError
// replace these bodies; the fields are set before they are called.
//
// # Shaping
//
// When a leaky bucket admits a request with a delay, the middleware holds
// the request for that delay (at most WithMaxDelay, default 5 s) before
// calling the next handler; if the client goes away meanwhile, the next
// handler is not called.
//
// # Identity
//
// The default identity is the client address only (limiter.Identity.IP,
// from limiter.TrustedProxies.ClientIP). APIKeyIdentity reads an API key
// from X-API-Key or Authorization: Bearer and maps known keys to their
// tier and account; unknown, missing, repeated, conflicting or oversized
// keys make the request anonymous (tier "anonymous"), limited by client
// address. A caller can never choose a subject by sending an unknown key.
//
// What it does not do: it does not authenticate (a known key is trusted as
// presented), count response status codes, or rewrite upstream headers.
// The middleware is safe for concurrent use.
package httplimit
