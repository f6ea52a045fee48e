package rls

import (
	"net"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
)

// policyYAML routes descriptors of domain "q" to Quotient policies by the
// descriptor's "algo" entry; "billing" counts one counter per user with the
// cost of the request's method and path (share_threshold wildcards keep
// them out of the counter's key).
const policyYAML = `domain: q
descriptors:
  - key: algo
    value: tb
    descriptors:
      - key: user
        rate_limit: {policy: tb}
  - key: algo
    value: lb
    descriptors:
      - key: user
        rate_limit: {policy: lb}
  - key: algo
    value: fw
    descriptors:
      - key: user
        rate_limit: {policy: fw, name: fw-limit}
  - key: algo
    value: swl
    descriptors:
      - key: user
        rate_limit: {policy: swl}
  - key: algo
    value: swc
    descriptors:
      - key: user
        rate_limit: {policy: swc}
  - key: billing
    descriptors:
      - key: method
        value: "*"
        share_threshold: true
        descriptors:
          - key: path
            value: "*"
            share_threshold: true
            rate_limit: {policy: billing}
  - key: login
    rate_limit: {policy: login}
  - key: quota
    rate_limit: {policy: tb}
  - key: global
    rate_limit: {policy: global}
  - key: shadowed
    rate_limit: {policy: shadow}
`

// The rates refill too slowly to matter within a test.
const policyDocs = `[
 {"id":"tb","algorithm":"token_bucket","rate_per_sec":0.001,"burst":3},
 {"id":"lb","algorithm":"leaky_bucket","rate_per_sec":0.001,"burst":2},
 {"id":"fw","algorithm":"fixed_window","limit":2,"window_s":86400},
 {"id":"swl","algorithm":"sliding_window_log","limit":2,"window_s":86400},
 {"id":"swc","algorithm":"sliding_window_counter","limit":2,"window_s":86400},
 {"id":"billing","algorithm":"token_bucket","rate_per_sec":0.001,"burst":6,"cost":{"POST /v1/send":3}},
 {"id":"login","algorithm":"fixed_window","limit":5,"window_s":3600,"class":"security"},
 {"id":"global","algorithm":"token_bucket","rate_per_sec":0.003,"burst":12,"scope":"global"},
 {"id":"shadow","algorithm":"fixed_window","limit":1,"window_s":86400,"mode":"shadow"}
]`

func mustPolicies(t *testing.T, docs string) []*limiter.Policy {
	t.Helper()
	ps, err := limiter.ParsePolicies([]byte(docs))
	require.NoError(t, err)
	return ps
}

func mustParse(t *testing.T, yaml string) *Config {
	t.Helper()
	c, err := Parse([]File{{Name: "q.yaml", Data: []byte(yaml)}}, ParseOptions{})
	require.NoError(t, err)
	return c
}

// startPolicyRLS serves cfg with a limiter on rc whose policy set is ps,
// configured further by tune (may be nil), over a real gRPC connection.
func startPolicyRLS(t *testing.T, rc redis.UniversalClient, cfg *Config, ps []*limiter.Policy, sc ServerConfig, tune func(*limiter.Config)) *harness {
	t.Helper()
	lcfg := limiter.DefaultConfig()
	lcfg.Store = limiter.NewRedisStore(rc)
	lcfg.Deadline = 2 * time.Second
	lcfg.EventSampleRate = -1
	if tune != nil {
		tune(&lcfg)
	}
	l, err := limiter.New(lcfg, ps)
	require.NoError(t, err)
	sc.Limiter, sc.Config = l, cfg
	srv, err := NewServer(sc)
	require.NoError(t, err)
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return &harness{client: rlsv3.NewRateLimitServiceClient(conn), srv: srv, l: l}
}

// admitted sends n requests of one descriptor and counts the OKs.
func (h *harness) admitted(t *testing.T, n int, desc func() *ratelimitv3.RateLimitDescriptor) int {
	t.Helper()
	ok := 0
	for range n {
		if h.call(t, "q", desc()).OverallCode == OK {
			ok++
		}
	}
	return ok
}

func TestPolicyRulesDecideWithEveryAlgorithm(t *testing.T) {
	h := startPolicyRLS(t, redistest.StartServer(t).Client(), mustParse(t, policyYAML), mustPolicies(t, policyDocs), ServerConfig{}, nil)
	for _, tc := range []struct {
		algo string
		want int
	}{{"tb", 3}, {"lb", 2}, {"fw", 2}, {"swl", 2}, {"swc", 2}} {
		t.Run(tc.algo, func(t *testing.T) {
			// A leaky bucket of burst 2 queues two (answered at once with
			// MaxDelay 0).
			assert.Equal(t, tc.want, h.admitted(t, 6, func() *ratelimitv3.RateLimitDescriptor { return d("algo", tc.algo, "user", "u1") }))
			assert.Equal(t, tc.want, h.admitted(t, 6, func() *ratelimitv3.RateLimitDescriptor { return d("algo", tc.algo, "user", "u2") }), "another user counts apart")
		})
	}
	// current_limit states the policy's limit; its name is the rule's.
	st := h.call(t, "q", d("algo", "fw", "user", "u3")).Statuses[0]
	assert.Equal(t, &rlsv3.RateLimitResponse_RateLimit{Name: "fw-limit", RequestsPerUnit: 2, Unit: rlsv3.RateLimitResponse_RateLimit_DAY}, st.CurrentLimit)
	assert.Equal(t, uint32(1), st.LimitRemaining)
	// A shadow policy counts but never rejects.
	assert.Equal(t, 3, h.admitted(t, 3, func() *ratelimitv3.RateLimitDescriptor { return d("shadowed", "s") }))
}

func TestPolicyRuleCost(t *testing.T) {
	h := startPolicyRLS(t, redistest.StartServer(t).Client(), mustParse(t, policyYAML), mustPolicies(t, policyDocs), ServerConfig{}, nil)
	req := func(method, path string) []string {
		return summary(h.call(t, "q", d("billing", "acct-1", "method", method, "path", path)))
	}
	// One bucket of 6 per account: GET costs 1, POST /v1/send 3.
	assert.Equal(t, []string{"OK/5"}, req("GET", "/v1/list"))
	assert.Equal(t, []string{"OK/2"}, req("POST", "/v1/send"))
	assert.Equal(t, []string{"OVER/2"}, req("POST", "/v1/send"), "3 > 2 left; nothing taken")
	assert.Equal(t, []string{"OK/1"}, req("GET", "/v1/other"))
	// hits_addend multiplies the cost.
	resp := h.callReq(t, &rlsv3.RateLimitRequest{Domain: "q", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{d("billing", "acct-2", "method", "POST", "path", "/v1/send")}})
	assert.Equal(t, []string{"OK/0"}, summary(resp))
}

// overrideFor gives one descriptor subject a larger policy.
type overrideFor struct {
	subject limiter.Subject
	policy  *limiter.Policy
}

func (o overrideFor) Override(s limiter.Subject, id string, _ time.Time) (*limiter.Policy, bool) {
	if s == o.subject && id == o.policy.ID {
		return o.policy, true
	}
	return nil, false
}

func TestPolicyRuleOverrides(t *testing.T) {
	big := mustPolicies(t, `[{"id":"fw","algorithm":"fixed_window","limit":4,"window_s":86400}]`)[0]
	vip := limiter.Subject{Kind: limiter.SubjectDescriptor, Value: "q/algo=fw/user=vip"}
	h := startPolicyRLS(t, redistest.StartServer(t).Client(), mustParse(t, policyYAML), mustPolicies(t, policyDocs), ServerConfig{},
		func(c *limiter.Config) { c.Overrides = overrideFor{vip, big} })
	assert.Equal(t, 4, h.admitted(t, 6, func() *ratelimitv3.RateLimitDescriptor { return d("algo", "fw", "user", "vip") }), "the override's limit")
	assert.Equal(t, 2, h.admitted(t, 6, func() *ratelimitv3.RateLimitDescriptor { return d("algo", "fw", "user", "other") }), "the policy's limit")
}

func TestPolicyRuleGlobalScope(t *testing.T) {
	// Without a share record a region enforces 1/n of a global limit.
	h := startPolicyRLS(t, redistest.StartServer(t).Client(), mustParse(t, policyYAML), mustPolicies(t, policyDocs), ServerConfig{},
		func(c *limiter.Config) { c.Region, c.Regions = "eu", 3 })
	assert.Equal(t, 4, h.admitted(t, 8, func() *ratelimitv3.RateLimitDescriptor { return d("global", "k") }), "12 / 3 regions")
}

func TestPolicyRuleOnStoreFailure(t *testing.T) {
	rs := redistest.StartServer(t)
	h := startPolicyRLS(t, rs.Client(), mustParse(t, policyYAML), mustPolicies(t, policyDocs), ServerConfig{ResponseHeaders: true},
		func(c *limiter.Config) { c.Deadline = 50 * time.Millisecond })
	resp := h.call(t, "q", d("login", "alice"))
	require.Equal(t, OK, resp.OverallCode)
	for _, hv := range resp.ResponseHeadersToAdd {
		assert.NotContains(t, hv.Value, "login", "a security policy is never exposed in headers (%s)", hv.Key)
	}
	rs.Kill()
	// Security fails closed; quota (tb) fails open onto the in-process limit.
	assert.Equal(t, OVER, h.call(t, "q", d("login", "alice")).OverallCode)
	assert.Equal(t, OK, h.call(t, "q", d("quota", "fresh")).OverallCode)
}

func TestPolicyRuleLeakyBucketHoldsTheAnswer(t *testing.T) {
	docs := `[{"id":"lb","algorithm":"leaky_bucket","rate_per_sec":5,"burst":4}]`
	cfg := mustParse(t, "domain: q\ndescriptors:\n  - key: user\n    rate_limit: {policy: lb}\n")
	h := startPolicyRLS(t, redistest.StartServer(t).Client(), cfg, mustPolicies(t, docs), ServerConfig{MaxDelay: time.Second}, nil)
	require.Equal(t, OK, h.call(t, "q", d("user", "u")).OverallCode, "the first drains at once")
	start := time.Now()
	require.Equal(t, OK, h.call(t, "q", d("user", "u")).OverallCode)
	// The second is queued behind the first: 1/5 s at 5 per second.
	assert.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond, "the answer was held for the drain")
}

func TestPolicyRulesAreCheckedAgainstThePolicySet(t *testing.T) {
	for _, tc := range []struct{ yaml, msg string }{
		{"domain: q\ndescriptors:\n  - key: k\n    rate_limit: {policy: tb, unit: second}\n", "descriptors[0].rate_limit.unit: not with policy"},
		{"domain: q\ndescriptors:\n  - key: k\n    rate_limit: {policy: tb, requests_per_unit: 1}\n", "descriptors[0].rate_limit.requests_per_unit: not with policy"},
		{"domain: q\ndescriptors:\n  - key: k\n    rate_limit: {policy: \"no spaces\"}\n", `descriptors[0].rate_limit.policy: "no spaces" is not a policy id`},
		{"domain: q\ndescriptors:\n  - key: k\n    shadow_mode: true\n    rate_limit: {policy: tb}\n", `descriptors[0].shadow_mode: not with rate_limit.policy`},
	} {
		_, err := Parse([]File{{Name: "q.yaml", Data: []byte(tc.yaml)}}, ParseOptions{})
		assert.ErrorContains(t, err, "q.yaml: "+tc.msg)
	}

	cfg := mustParse(t, policyYAML)
	assert.Equal(t, []string{"billing", "fw", "global", "lb", "login", "shadow", "swc", "swl", "tb"}, cfg.PolicyIDs())
	l, err := limiter.New(limiter.DefaultConfig(), mustPolicies(t, `[{"id":"tb","algorithm":"token_bucket","rate_per_sec":1}]`))
	require.NoError(t, err)
	_, err = NewServer(ServerConfig{Limiter: l, Config: cfg})
	assert.ErrorIs(t, err, ErrUnknownPolicy)
	assert.ErrorContains(t, err, `"billing", named by rate_limit.policy of q.billing.method_*.path_*, is not in the policy set`)

	small := mustParse(t, "domain: q\ndescriptors:\n  - key: k\n    rate_limit: {policy: tb}\n")
	srv, err := NewServer(ServerConfig{Limiter: l, Config: small})
	require.NoError(t, err)
	assert.ErrorIs(t, srv.SetConfig(cfg), ErrUnknownPolicy, "a configuration naming an unknown policy is refused")
	assert.Same(t, small, srv.Config())
	assert.ErrorIs(t, srv.SetPolicies(nil), ErrUnknownPolicy, "a set without tb is refused while a rule names it")
	assert.Len(t, l.Policies(), 1)
	require.NoError(t, srv.SetPolicies(mustPolicies(t, policyDocs)))
	require.NoError(t, srv.SetConfig(cfg))
	assert.Len(t, l.Policies(), 9)

}

// TestSetPoliciesDecidesWithTheLimitersCopies: the server decides with the
// limiter's own copies of the policies it was given (limiter.SetPolicies),
// so a caller that changes them afterwards changes nothing: tb still
// admits its burst of 3, not the 100 it was changed to.
func TestSetPoliciesDecidesWithTheLimitersCopies(t *testing.T) {
	h := startPolicyRLS(t, redistest.StartServer(t).Client(), mustParse(t, policyYAML), mustPolicies(t, policyDocs), ServerConfig{}, nil)
	ps := mustPolicies(t, policyDocs)
	require.NoError(t, h.srv.SetPolicies(ps))
	require.Equal(t, "tb", ps[0].ID)
	ps[0].Burst = 100
	require.NoError(t, ps[0].Validate())
	assert.Equal(t, 3, h.admitted(t, 6, func() *ratelimitv3.RateLimitDescriptor { return d("algo", "tb", "user", "u1") }))
}
