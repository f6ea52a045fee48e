package httplimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/quotientlabs/quotient/limiter"
)

// IdentityFunc tells who sent a request. An error makes the middleware
// answer through the error hook (400 by default) without a decision.
type IdentityFunc func(*http.Request) (limiter.Identity, error)

// DeniedFunc writes the response to a rejected request. The rate limit
// fields and Retry-After are already set on w.Header(). d is reused after
// the call returns: do not keep it.
type DeniedFunc func(w http.ResponseWriter, r *http.Request, d *limiter.Decision)

// ErrorFunc writes the response when no decision could be made: err wraps
// ErrIdentity or limiter.ErrCanceled.
type ErrorFunc func(w http.ResponseWriter, r *http.Request, err error)

// ErrIdentity wraps the error of an IdentityFunc.
var ErrIdentity = errors.New("httplimit: cannot identify the caller")

// Option configures the middleware.
type Option func(*options)

type options struct {
	identity IdentityFunc
	denied   DeniedFunc
	onError  ErrorFunc
	maxDelay time.Duration
	proxies  *limiter.TrustedProxies
}

// WithIdentity sets how callers are identified. Default: the client
// address (see WithTrustedProxies) and nothing else.
func WithIdentity(f IdentityFunc) Option { return func(o *options) { o.identity = f } }

// WithTrustedProxies sets the proxies whose forwarding headers the default
// identity believes. Default: none (the direct peer is the client).
func WithTrustedProxies(t *limiter.TrustedProxies) Option {
	return func(o *options) { o.proxies = t }
}

// WithDenied replaces the 429 / 503 problem responses.
func WithDenied(f DeniedFunc) Option { return func(o *options) { o.denied = f } }

// WithError replaces the responses written when no decision could be made.
func WithError(f ErrorFunc) Option { return func(o *options) { o.onError = f } }

// WithMaxDelay bounds how long a shaped (leaky bucket) request is held
// before it is forwarded. Default 5 s; a longer delay is cut to it.
func WithMaxDelay(d time.Duration) Option { return func(o *options) { o.maxDelay = d } }

// Middleware returns a middleware that decides every request with l. See
// the package documentation for the responses.
func Middleware(l *limiter.Limiter, opts ...Option) func(http.Handler) http.Handler {
	o := options{maxDelay: 5 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	if o.identity == nil {
		o.identity = ClientIPIdentity(o.proxies)
	}
	if o.denied == nil {
		o.denied = WriteDenied
	}
	if o.onError == nil {
		o.onError = WriteError
	}
	items := &policyItems{}
	pool := &sync.Pool{New: func() any { return new(limiter.Decision) }}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id, err := o.identity(r)
			if err != nil {
				o.onError(w, r, fmt.Errorf("%w: %w", ErrIdentity, err))
				return
			}
			d := pool.Get().(*limiter.Decision)
			defer func() {
				clear(d.Policies) // drop references to policies and subjects
				pool.Put(d)
			}()
			req := limiter.Request{Identity: id, Method: r.Method, Path: r.URL.Path}
			if err := l.CheckInto(r.Context(), l.Now(), req, d); err != nil {
				o.onError(w, r, err)
				return
			}
			items.setFields(w.Header(), d)
			if !d.Allowed {
				o.denied(w, r, d)
				return
			}
			if d.Delay > 0 {
				t := time.NewTimer(min(d.Delay, o.maxDelay))
				select {
				case <-t.C:
				case <-r.Context().Done():
					t.Stop()
					return
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}

// ClientIPIdentity identifies callers by client address only.
func ClientIPIdentity(proxies *limiter.TrustedProxies) IdentityFunc {
	return func(r *http.Request) (limiter.Identity, error) {
		ip, ok := proxies.ClientIP(r)
		if !ok {
			return limiter.Identity{}, fmt.Errorf("remote address %q is not an IP address", r.RemoteAddr)
		}
		return limiter.Identity{IP: ip, Tier: AnonymousTier}, nil
	}
}

// Problem is an RFC 9457 problem document with the draft's
// violated-policies member.
type Problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail,omitempty"`
	Instance         string   `json:"instance,omitempty"`
	ViolatedPolicies []string `json:"violated-policies"`
}

// Problem types of the draft.
const (
	ProblemQuotaExceeded            = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	ProblemTemporaryReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
)

// maxInstance bounds the instance member (the request path).
const maxInstance = 1024

// WriteProblem writes p as application/problem+json with status p.Status.
func WriteProblem(w http.ResponseWriter, p *Problem) {
	body, err := json.Marshal(p)
	if err != nil {
		body = []byte(`{"type":"about:blank","title":"Internal Server Error","status":500}`)
		p.Status = http.StatusInternalServerError
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

func instance(r *http.Request) string {
	s := r.URL.EscapedPath()
	if len(s) > maxInstance {
		s = s[:maxInstance]
	}
	return s
}

// WriteDenied is the default DeniedFunc: 429 with a quota-exceeded problem,
// or 503 with a temporary-reduced-capacity problem when a fail-closed
// policy could not be decided.
func WriteDenied(w http.ResponseWriter, r *http.Request, d *limiter.Decision) {
	violated := []string{}
	security := false
	for i := range d.Policies {
		pd := &d.Policies[i]
		if pd.Allowed || pd.Policy.Mode != limiter.Enforce {
			continue
		}
		if pd.Policy.Class == limiter.ClassSecurity {
			security = true
			continue
		}
		violated = append(violated, pd.Policy.ID)
	}
	secs := retryAfterSeconds(d)
	if d.FailedClosed() {
		WriteProblem(w, &Problem{
			Type:             ProblemTemporaryReducedCapacity,
			Title:            "Rate limiter unavailable",
			Status:           http.StatusServiceUnavailable,
			Detail:           fmt.Sprintf("A limit on this request cannot be checked right now; retry after %s.", seconds(secs)),
			Instance:         instance(r),
			ViolatedPolicies: violated,
		})
		return
	}
	detail := fmt.Sprintf("Rate limit exceeded; retry after %s.", seconds(secs))
	if security && len(violated) == 0 {
		detail = fmt.Sprintf("Too many attempts; retry after %s.", seconds(secs))
	}
	WriteProblem(w, &Problem{
		Type:             ProblemQuotaExceeded,
		Title:            "Quota exceeded",
		Status:           http.StatusTooManyRequests,
		Detail:           detail,
		Instance:         instance(r),
		ViolatedPolicies: violated,
	})
}

// WriteError is the default ErrorFunc: 400 for an identity error, 503
// otherwise (the limiter could not decide before the client gave up).
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, ErrIdentity) {
		WriteProblem(w, &Problem{Type: "about:blank", Title: "Bad Request", Status: http.StatusBadRequest, Detail: "The caller could not be identified.", Instance: instance(r), ViolatedPolicies: []string{}})
		return
	}
	w.Header().Set(HeaderRetryAfter, "1")
	WriteProblem(w, &Problem{Type: "about:blank", Title: "Service Unavailable", Status: http.StatusServiceUnavailable, Detail: "The request could not be checked against its rate limits.", Instance: instance(r), ViolatedPolicies: []string{}})
}

// seconds spells a whole number of seconds for a problem detail.
func seconds(n int64) string {
	if n == 1 {
		return "1 second"
	}
	return fmt.Sprintf("%d seconds", n)
}
