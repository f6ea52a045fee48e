package httplimit

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/quotientlabs/quotient/limiter"
)

// Field names.
const (
	HeaderRateLimitPolicy = "RateLimit-Policy"
	HeaderRateLimit       = "RateLimit"
	HeaderRetryAfter      = "Retry-After"
)

// DraftRevision is the revision of the RateLimit fields draft this package
// implements.
const DraftRevision = "draft-ietf-httpapi-ratelimit-headers-10"

// exposed reports whether a policy may appear in response fields.
func exposed(p *limiter.Policy) bool {
	return p.Mode == limiter.Enforce && p.Class != limiter.ClassSecurity
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// windowSeconds is the w parameter of p: window_s for windows, 31 days
// (limiter.NominalMonthSec) for calendar months.
func windowSeconds(p *limiter.Policy) int64 {
	if w := p.NominalWindowSec(); w > 0 {
		return w
	}
	if p.RateMilli() <= 0 {
		return 1
	}
	return max(1, int64(math.Ceil(float64(p.BurstMilli())/float64(p.RateMilli()))))
}

// policyItems caches the serialized RateLimit-Policy item of each policy
// (policies are immutable). Every policy reload and every override brings
// new *Policy values, so the cache is emptied once it holds
// maxPolicyItems of them: its memory stays bounded for the life of a
// middleware, and an emptied entry costs one serialization again.
type policyItems struct {
	m sync.Map // *limiter.Policy -> string
	n atomic.Int64
}

// maxPolicyItems bounds policyItems (about 100 B an entry).
const maxPolicyItems = 4096

func (c *policyItems) item(p *limiter.Policy) string {
	if v, ok := c.m.Load(p); ok {
		return v.(string)
	}
	it := httpsfv.NewItem(p.ID)
	it.Params.Add("q", p.Capacity())
	it.Params.Add("w", windowSeconds(p))
	s, err := httpsfv.Marshal(httpsfv.List{it})
	if err != nil {
		// Policy ids are [A-Za-z0-9._-]: a String always serializes.
		panic("httplimit: cannot serialize policy " + strconv.Quote(p.ID) + ": " + err.Error())
	}
	if _, loaded := c.m.LoadOrStore(p, s); !loaded && c.n.Add(1) > maxPolicyItems {
		c.m.Clear()
		c.n.Store(0)
	}
	return s
}

// setFields writes RateLimit-Policy and RateLimit (and, when rejected,
// Retry-After) for d into h.
func (c *policyItems) setFields(h http.Header, d *limiter.Decision) {
	var pol strings.Builder
	var rl httpsfv.List
	denied := !d.Allowed
	for i := range d.Policies {
		pd := &d.Policies[i]
		if !exposed(pd.Policy) {
			continue
		}
		if pol.Len() > 0 {
			pol.WriteString(", ")
		}
		pol.WriteString(c.item(pd.Policy))
		var t int64
		switch {
		case denied && pd.Allowed:
			continue
		case denied:
			t = max(1, ceilSeconds(pd.RetryAfter))
		default:
			t = ceilSeconds(pd.ResetAfter)
		}
		it := httpsfv.NewItem(pd.Policy.ID)
		it.Params.Add("r", max(0, pd.Remaining))
		it.Params.Add("t", t)
		rl = append(rl, it)
	}
	if pol.Len() > 0 {
		h.Set(HeaderRateLimitPolicy, pol.String())
	}
	if len(rl) > 0 {
		if s, err := httpsfv.Marshal(rl); err == nil {
			h.Set(HeaderRateLimit, s)
		}
	}
	if denied {
		h.Set(HeaderRetryAfter, strconv.FormatInt(retryAfterSeconds(d), 10))
	}
}

// retryAfterSeconds is Retry-After for a rejected decision: the largest
// retry time of the enforced rejecting policies, rounded up, at least 1.
func retryAfterSeconds(d *limiter.Decision) int64 {
	return max(1, ceilSeconds(d.RetryAfter()))
}
