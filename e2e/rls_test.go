package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
)

// The tests of this file drive `quotient rls`, the Envoy rate limit
// service (envoy.service.ratelimit.v3.RateLimitService), as the shipped
// binary with the flags an operator passes, through real gRPC clients:
// its warm start while Redis is down, its exact decisions on a per-minute
// envoyproxy/ratelimit rule, and a global limit across two regions.

// rlsService is the gRPC service name health checkers ask about.
const rlsService = "envoy.service.ratelimit.v3.RateLimitService"

// rlsLimit is requests_per_unit of the per-minute rule of rlsLimits.
const rlsLimit = 5

// rlsLimits is an envoyproxy/ratelimit configuration file: every tenant
// gets rlsLimit requests per minute, counted per tenant value.
var rlsLimits = fmt.Sprintf(`domain: e2e
descriptors:
  - key: tenant
    rate_limit:
      name: per-tenant
      unit: minute
      requests_per_unit: %d
`, rlsLimit)

// rlsConfigDir writes files (name -> content) under DIR/config/, the
// runtime directory layout envoyproxy/ratelimit reads, and returns DIR
// (the value of --config-dir).
func rlsConfigDir(t *testing.T, dir string, files map[string]string) string {
	t.Helper()
	root := filepath.Join(dir, "runtime")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "config"), 0o755))
	for name, content := range files {
		require.NoError(t, os.WriteFile(filepath.Join(root, "config", name), []byte(content), 0o600))
	}
	return root
}

// rlsNode is one running `quotient rls`: its process, a gRPC client
// connection to it, and the URL of its /metrics.
type rlsNode struct {
	proc    *proc
	conn    *grpc.ClientConn
	rls     rlsv3.RateLimitServiceClient
	health  healthpb.HealthClient
	metrics string
}

// startRLSNode starts `quotient rls args...` on free loopback ports
// (gRPC and /metrics), reads the addresses it prints, and connects a
// plaintext gRPC client, closed at cleanup.
func startRLSNode(t *testing.T, dir, name string, args ...string) *rlsNode {
	t.Helper()
	args = append([]string{"rls", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}, args...)
	p := start(t, dir, name, bin(t, "quotient"), nil, args...)
	metricsAddr := p.waitLog(t, regexp.MustCompile(`quotient rls: metrics on (\S+)`), 30*time.Second)
	addr := p.waitLog(t, regexp.MustCompile(`quotient rls: listening on (\S+)`), 30*time.Second)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return &rlsNode{proc: p, conn: conn, rls: rlsv3.NewRateLimitServiceClient(conn), health: healthpb.NewHealthClient(conn), metrics: "http://" + metricsAddr + "/metrics"}
}

// healthOf asks the health service about service. A service whose status
// is not set yet is codes.NotFound, returned as the error.
func (n *rlsNode) healthOf(service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := n.health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN, err
	}
	return r.GetStatus(), nil
}

// metric scrapes /metrics once and returns the sum of the samples whose
// name and labels match re, and whether any did. It never fails the test,
// so that it can run inside require.Eventually.
func (n *rlsNode) metric(re *regexp.Regexp) (float64, bool) {
	samples, err := scrapeMetrics(n.metrics, 2*time.Second)
	if err != nil {
		return 0, false
	}
	var sum float64
	found := false
	for _, s := range samples {
		if !re.MatchString(s.series) {
			continue
		}
		v, err := strconv.ParseFloat(s.value, 64)
		if err != nil {
			return 0, false
		}
		sum += v
		found = true
	}
	return sum, found
}

// call sends one ShouldRateLimit of domain e2e with one descriptor per
// element of tenants (entry tenant=value), hits as hits_addend of every
// descriptor (nil: the request's default, 1).
func (n *rlsNode) call(t *testing.T, hits *wrapperspb.UInt64Value, tenants ...string) *rlsv3.RateLimitResponse {
	t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: "e2e"}
	for _, v := range tenants {
		req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
			Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: v}},
			HitsAddend: hits,
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := n.rls.ShouldRateLimit(ctx, req)
	require.NoError(t, err, "ShouldRateLimit %v", tenants)
	require.Len(t, resp.GetStatuses(), len(tenants))
	return resp
}

var (
	rlsReady    = regexp.MustCompile(`^quotient_rls_ready\{`)
	rlsFallback = regexp.MustCompile(`^quotient_limiter_decisions_total\{.*source="fallback"`)
	rlsStore    = regexp.MustCompile(`^quotient_limiter_decisions_total\{.*source="store"`)
)

// needRedisServer skips the test, saying so, on a machine without
// redis-server (make deps installs it).
func needRedisServer(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skipf("this machine lacks redis-server (make deps installs it): %v", err)
	}
}

// minuteEdgeMargin is the least time left in the current minute for a
// burst of calls that must fall in one fixed window.
const minuteEdgeMargin = 5 * time.Second

// inOneMinute returns the start of the Unix-aligned minute a burst of
// calls starting now falls in: when less than minuteEdgeMargin of the
// current minute is left, it first waits for the next one (at most
// minuteEdgeMargin, on the clock: the windows are aligned to it, Redis on
// this machine reads the same clock).
func inOneMinute() time.Time {
	now := time.Now()
	if next := now.Truncate(time.Minute).Add(time.Minute); next.Sub(now) < minuteEdgeMargin {
		time.Sleep(time.Until(next.Add(50 * time.Millisecond))) // the window's schedule, not a wait for a result
	}
	return time.Now().Truncate(time.Minute)
}

// wantPerTenant is the current_limit of every descriptor rlsLimits decides.
func wantPerTenant(t *testing.T, st *rlsv3.RateLimitResponse_DescriptorStatus, msg string) {
	t.Helper()
	lim := st.GetCurrentLimit()
	assert.Equal(t, "per-tenant", lim.GetName(), msg)
	assert.Equal(t, uint32(rlsLimit), lim.GetRequestsPerUnit(), msg)
	assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_MINUTE, lim.GetUnit(), msg)
}

// burst sends n single-descriptor calls of tenant within one minute
// window and checks every status against want (the code and
// limit_remaining of call i, from 0): current_limit is the rule's, and
// duration_until_reset is the rest of the minute (to within 2 s, as the
// store and this process see it), never growing during the burst.
func burst(t *testing.T, n *rlsNode, tenant string, count int, want func(i int) (rlsv3.RateLimitResponse_Code, uint32)) {
	t.Helper()
	minute := inOneMinute()
	var lastReset time.Duration
	for i := range count {
		resp := n.call(t, nil, tenant)
		st := resp.GetStatuses()[0]
		code, remaining := want(i)
		msg := fmt.Sprintf("%s call %d of %d", tenant, i+1, count)
		assert.Equal(t, code, resp.GetOverallCode(), msg)
		assert.Equal(t, code, st.GetCode(), msg)
		assert.Equal(t, remaining, st.GetLimitRemaining(), msg)
		wantPerTenant(t, st, msg)
		reset := st.GetDurationUntilReset().AsDuration()
		assert.Positive(t, reset, msg)
		assert.LessOrEqual(t, reset, time.Minute, msg)
		assert.InDelta(t, float64(time.Until(minute.Add(time.Minute))), float64(reset), float64(2*time.Second), "%s: reset %v", msg, reset)
		if i > 0 {
			assert.LessOrEqual(t, reset, lastReset+100*time.Millisecond, "%s: the reset grew (%v after %v)", msg, reset, lastReset)
		}
		lastReset = reset
	}
	require.Equal(t, minute, time.Now().Truncate(time.Minute), "the burst of %s crossed a minute boundary (it took more than %v)", tenant, minuteEdgeMargin)
}

// TestBinariesRLSWarmStartRedisDown starts `quotient rls` while nothing
// listens on its Redis address. While Redis is down:
//
//   - gRPC health of the RLS service (readiness) is NOT_SERVING and of ""
//     (the process, liveness) SERVING, and quotient_rls_ready is 0
//     (warming): README, --warm-timeout, which is set far above the test
//     so that the fallback readiness after it cannot come first;
//   - ShouldRateLimit is still answered, by the in-process fallback
//     (README, "Calls that arrive while warming are answered, not
//     refused"): an envoyproxy rule is a quota-class policy, which fails
//     open onto an in-process limit of twice its rate per instance
//     (README, "Failure, and Envoy's failure_mode_deny"; limiter/fallback.go:
//     open is limit x OpenFactor, default 2, per instance; one instance
//     here). So 2N calls of one descriptor in one window are OK, and the
//     next ones OVER_LIMIT; limit_remaining counts the fallback's 2N down
//     but is never stated above current_limit, the rule's N
//     (limiter.PolicyDecision.Remaining); every one is counted as a
//     fallback decision.
//
// Then redis-server starts on that address: within a bounded wait the
// service turns SERVING and quotient_rls_ready 1, and a new descriptor is
// decided by the store, against the rule's own limit (remaining N-1).
func TestBinariesRLSWarmStartRedisDown(t *testing.T) {
	inTurn(t)
	needRedisServer(t)
	dir := t.TempDir()
	// A free address nobody serves: redistest picks the port and starts
	// nothing there until Restart (Stop before any client; it never hands
	// the port to another server).
	rd := redistest.StartServer(t)
	rd.Stop()
	n := startRLSNode(t, dir, "rls", "--redis", rd.Addr(), "--config-dir", rlsConfigDir(t, dir, map[string]string{"limits.yaml": rlsLimits}),
		"--timeout", "1s", "--warm-timeout", "10m", "--warm-interval", "100ms")

	// The services' status is set before the listener serves: the first
	// check (the address is printed once the listener is open) already
	// sees NOT_SERVING, never NotFound or SERVING.
	svc, err := n.healthOf(rlsService)
	require.NoError(t, err, "the first health check of %s", rlsService)
	assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, svc, "readiness with Redis down")
	live, err := n.healthOf("")
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, live, "liveness with Redis down")
	ready, ok := n.metric(rlsReady)
	require.True(t, ok, "no quotient_rls_ready on %s", n.metrics)
	assert.Equal(t, 0.0, ready, "quotient_rls_ready with Redis down (0: warming)")

	// Answered while warming: the fallback's limit is 2N in this window.
	const k = 3
	burst(t, n, "down", 2*rlsLimit+k, func(i int) (rlsv3.RateLimitResponse_Code, uint32) {
		if i < 2*rlsLimit {
			return rlsv3.RateLimitResponse_OK, uint32(min(2*rlsLimit-1-i, rlsLimit))
		}
		return rlsv3.RateLimitResponse_OVER_LIMIT, 0
	})
	fb, _ := n.metric(rlsFallback)
	store, _ := n.metric(rlsStore)
	assert.Equal(t, float64(2*rlsLimit+k), fb, "decisions from the fallback while Redis is down")
	assert.Zero(t, store, "decisions from the store while Redis is down")
	// Still warming: nothing above made it ready.
	svc, err = n.healthOf(rlsService)
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, svc, "readiness after the calls, Redis still down")
	ready, _ = n.metric(rlsReady)
	assert.Equal(t, 0.0, ready, "quotient_rls_ready after the calls, Redis still down")
	assert.NotContains(t, tail(n.proc.log, 200), "rls ready", "ready without Redis, before --warm-timeout")

	// Redis comes up on the address rls was given.
	up := time.Now()
	rd.Restart(t)
	require.Eventually(t, func() bool {
		st, err := n.healthOf(rlsService)
		return err == nil && st == healthpb.HealthCheckResponse_SERVING
	}, 30*time.Second, 20*time.Millisecond, "%s not SERVING within 30 s of Redis coming up", rlsService)
	t.Logf("SERVING %v after redis-server came up", time.Since(up).Round(time.Millisecond))
	require.Eventually(t, func() bool {
		v, ok := n.metric(rlsReady)
		return ok && v == 1
	}, 10*time.Second, 20*time.Millisecond, "quotient_rls_ready not 1 (ready and warm)")
	live, err = n.healthOf("")
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, live, "liveness once warm")
	n.proc.waitLog(t, regexpFor("rls ready"), 10*time.Second)
	assert.NotContains(t, tail(n.proc.log, 200), "rls ready in fallback")

	// The store decides now, against the rule's limit N.
	resp := n.call(t, nil, "up")
	assert.Equal(t, rlsv3.RateLimitResponse_OK, resp.GetOverallCode())
	assert.Equal(t, uint32(rlsLimit-1), resp.GetStatuses()[0].GetLimitRemaining(), "the store's remaining (the fallback's would be 2N-1)")
	store, _ = n.metric(rlsStore)
	assert.Equal(t, 1.0, store, "decisions from the store once warm")
	keys, err := rd.Client().Keys(context.Background(), "*").Result()
	require.NoError(t, err)
	assert.NotEmpty(t, keys, "the decision's counter in Redis")
	logMetrics(t, "rls", n.metrics, "quotient_rls_ready", "quotient_limiter_decisions_total", "quotient_limiter_store_errors_total", "quotient_limiter_breaker_state")
}

// TestBinariesRLSExactDecisions: with Redis up, `quotient rls` on an
// envoyproxy/ratelimit rule of N = 5 requests per minute (rlsLimits)
// answers the first N calls of a descriptor OK with limit_remaining
// N-1 ... 0 and the next k OVER_LIMIT with limit_remaining 0, every status
// with the rule's current_limit (name, 5, MINUTE) and the rest of the
// window as duration_until_reset; decided by Redis (repeats over the
// limit by its deny cache), never by the fallback (README, "The
// configuration and its semantics"; rls/server.go, respond). Another
// value of the descriptor counts on its own, and a request that a limit
// rejects consumes nothing from its other descriptors (rls/doc.go: "a
// request that any enforced limit rejects consumes nothing from any
// descriptor").
func TestBinariesRLSExactDecisions(t *testing.T) {
	inTurn(t)
	needRedisServer(t)
	dir := t.TempDir()
	rd := redistest.StartServer(t)
	n := startRLSNode(t, dir, "rls", "--redis", rd.Addr(), "--config-dir", rlsConfigDir(t, dir, map[string]string{"limits.yaml": rlsLimits}),
		"--timeout", "1s")
	require.Eventually(t, func() bool {
		st, err := n.healthOf(rlsService)
		return err == nil && st == healthpb.HealthCheckResponse_SERVING
	}, 30*time.Second, 20*time.Millisecond, "%s not SERVING with Redis up", rlsService)
	ready, ok := n.metric(rlsReady)
	require.True(t, ok)
	assert.Equal(t, 1.0, ready, "quotient_rls_ready once SERVING with Redis up")

	const k = 3
	burst(t, n, "acme", rlsLimit+k, func(i int) (rlsv3.RateLimitResponse_Code, uint32) {
		if i < rlsLimit {
			return rlsv3.RateLimitResponse_OK, uint32(rlsLimit - 1 - i)
		}
		return rlsv3.RateLimitResponse_OVER_LIMIT, 0
	})

	// Another tenant counts apart.
	other := n.call(t, nil, "globex")
	assert.Equal(t, rlsv3.RateLimitResponse_OK, other.GetOverallCode())
	assert.Equal(t, uint32(rlsLimit-1), other.GetStatuses()[0].GetLimitRemaining(), "globex counts on its own")

	// All or nothing: acme is spent, so the request is over limit and
	// initech's counter is not touched.
	inOneMinute() // acme must still be spent: not across a window edge
	both := n.call(t, nil, "acme", "initech")
	assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, both.GetOverallCode())
	assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, both.GetStatuses()[0].GetCode(), "acme")
	assert.Equal(t, rlsv3.RateLimitResponse_OK, both.GetStatuses()[1].GetCode(), "initech is not the reason")
	wantPerTenant(t, both.GetStatuses()[1], "initech")
	alone := n.call(t, nil, "initech")
	assert.Equal(t, rlsv3.RateLimitResponse_OK, alone.GetOverallCode())
	assert.Equal(t, uint32(rlsLimit-1), alone.GetStatuses()[0].GetLimitRemaining(), "the rejected request consumed nothing of initech")

	// A peek (hits_addend 0) consumes nothing either.
	peek := n.call(t, wrapperspb.UInt64(0), "initech")
	assert.Equal(t, rlsv3.RateLimitResponse_OK, peek.GetOverallCode())
	assert.Equal(t, uint32(rlsLimit-1), peek.GetStatuses()[0].GetLimitRemaining(), "a peek")

	// A malformed request is refused, not decided.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := n.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "e2e"})
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "no descriptors: %v", err)

	fb, _ := n.metric(rlsFallback)
	assert.Zero(t, fb, "decisions from the fallback with Redis up")
	store, _ := n.metric(rlsStore)
	assert.Positive(t, store, "decisions from the store")
	logMetrics(t, "rls", n.metrics, "quotient_rls_ready", "quotient_limiter_decisions_total", "quotient_limiter_store_errors_total")
}

// TestBinariesRLSGlobalLimitTwoRegions mirrors TestBinariesGlobalLimits
// with `quotient rls` in place of the gateway: two regions, each its own
// redis-server, `quotient coordinator` and `quotient rls`, one devkafka
// broker, one global token bucket "g" (r = 20/s, B = 20) that an
// envoyproxy rule names (rate_limit: {policy: g}), and a paced gRPC
// client per region sending one descriptor at 40/s (east) and 10/s (west).
//
// The bound (as TestRLSGlobalLimitAcrossRegions in cmd/quotient): the
// shares the regions enforce sum to at most r and B at every instant (the
// rebalancer's invariant; 1/2 each before any share record), so over T
// seconds the regions together admit at most B + r·T, plus what the
// in-process fallback admitted (a store call past --timeout; logged).
// The coordinators are in the loop: the run lasts until east's share
// record exceeds the default 1/2, which needs the rls's usage to reach
// them over Kafka, then three epochs more (20 s at least). Nor do the
// regions starve the key: together they admit at least 85 % of r·T
// (maxError, the seed design's accuracy).
func TestBinariesRLSGlobalLimitTwoRegions(t *testing.T) {
	inTurn(t)
	needRedisServer(t)
	const (
		rate, burst = 20.0, 20.0
		epoch       = time.Second
		minRun      = 20 * time.Second // of traffic
	)
	names := []string{"east", "west"}
	pace := map[string]time.Duration{"east": time.Second / 40, "west": time.Second / 10}
	dir := t.TempDir()
	quotient := bin(t, "quotient")
	kafka := startBroker(t, dir)
	policies := filepath.Join(dir, "policies.json")
	require.NoError(t, os.WriteFile(policies, []byte(fmt.Sprintf(`[{"id":"g","algorithm":"token_bucket","rate_per_sec":%v,"burst":%v,"scope":"global"}]`, rate, burst)), 0o600))
	config := rlsConfigDir(t, dir, map[string]string{"global.yaml": "domain: e2e\ndescriptors:\n  - key: tenant\n    rate_limit: {policy: g}\n"})

	servers := map[string]*redistest.Server{}
	for _, r := range names {
		servers[r] = redistest.StartServer(t)
		caddr := freeAddr(t)
		start(t, dir, "coordinator-"+r, quotient, nil, "coordinator", "--region", r, "--regions", strings.Join(names, ","),
			"--redis", servers[r].Addr(), "--kafka", kafka, "--listen", caddr, "--epoch", epoch.String(), "--policies", policies)
		waitHTTP(t, "http://"+caddr+"/readyz", 60*time.Second, nil)
	}
	nodes := map[string]*rlsNode{}
	for _, r := range names {
		// The coordinator states the region set before the rls starts.
		require.Eventually(t, func() bool {
			_, ok, err := limiter.ReadRegionSet(context.Background(), servers[r].Client())
			return err == nil && ok
		}, 30*time.Second, 20*time.Millisecond, "no region set record in %s", r)
		nodes[r] = startRLSNode(t, dir, "rls-"+r, "--redis", servers[r].Addr(), "--config-dir", config, "--policies", policies,
			"--region", r, "--regions", strings.Join(names, ","), "--epoch", epoch.String(), "--usage-flush", "100ms", "--timeout", "1s")
	}
	for _, r := range names {
		n := nodes[r]
		require.Eventually(t, func() bool {
			st, err := n.healthOf(rlsService)
			return err == nil && st == healthpb.HealthCheckResponse_SERVING
		}, 30*time.Second, 20*time.Millisecond, "rls-%s not SERVING", r)
		mismatch, ok := n.metric(regexp.MustCompile(`^quotient_rls_region_set_mismatch\{`))
		require.True(t, ok)
		assert.Zero(t, mismatch, "rls-%s: flags and the coordinator's record disagree", r)
		n.proc.waitLog(t, regexpFor("source=coordinator"), 10*time.Second)
	}

	subject := limiter.Subject{Kind: limiter.SubjectDescriptor, Value: "e2e/tenant=acme"}
	defaultRateMilli := int64(rate*1000) / int64(len(names))
	grown := func() bool {
		m, err := servers["east"].Client().HGetAll(context.Background(), limiter.ShareKey(subject, "g")).Result()
		if err != nil {
			return false
		}
		v, err := strconv.ParseInt(m["r"], 10, 64)
		return err == nil && v > defaultRateMilli
	}

	var admitted, sent, failed atomic.Int64
	var lastErr atomic.Value
	perRegion := map[string]*atomic.Int64{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	began := time.Now()
	for _, r := range names {
		perRegion[r] = &atomic.Int64{}
		wg.Go(func() {
			tick := time.NewTicker(pace[r])
			defer tick.Stop()
			req := &rlsv3.RateLimitRequest{Domain: "e2e", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}}}}
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := nodes[r].rls.ShouldRateLimit(ctx, req)
				cancel()
				if err != nil {
					failed.Add(1)
					lastErr.Store(r + ": " + err.Error())
					continue
				}
				sent.Add(1)
				if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
					admitted.Add(1)
					perRegion[r].Add(1)
				}
			}
		})
	}
	// Traffic until the coordinators grew east's share (bounded: 40 s),
	// then three more epochs under it, and minRun at least, so that the
	// refill r·T, not the burst B, dominates the bound.
	sawGrowth := assert.Eventually(t, grown, 40*time.Second, 50*time.Millisecond, "the coordinators never raised east's share above the default 1/2 within 40 s")
	if sawGrowth {
		time.Sleep(max(3*epoch, time.Until(began.Add(minRun)))) // the schedule: epochs under the grown share
	}
	close(stop)
	wg.Wait()
	elapsed := time.Since(began)

	fallbackAllowed := regexp.MustCompile(`^quotient_limiter_decisions_total\{decision="allowed",policy="g",.*source="fallback"`)
	var fb float64
	for _, r := range names {
		v, _ := nodes[r].metric(fallbackAllowed)
		fb += v
		logMetrics(t, "rls-"+r, nodes[r].metrics, "quotient_limiter_decisions_total", "quotient_limiter_store_errors_total", "quotient_rls_region_set_mismatch")
	}
	bound := burst + rate*elapsed.Seconds()
	t.Logf("%.1f s: sent %d, admitted %d (east %d, west %d), bound B + r·T = %.0f (+ %.0f fallback admissions); failed calls %d",
		elapsed.Seconds(), sent.Load(), admitted.Load(), perRegion["east"].Load(), perRegion["west"].Load(), bound, fb, failed.Load())
	assert.Zero(t, failed.Load(), "calls that got no answer (last: %v)", lastErr.Load())
	assert.LessOrEqual(t, float64(admitted.Load()), bound+fb, "the regions together admitted more than the global limit allows")
	assert.Greater(t, sent.Load(), admitted.Load(), "the demand exceeded the limit, so the limit was tested")
	// Not starved either: one global limiter would admit about r·T.
	assert.GreaterOrEqual(t, float64(admitted.Load()), (1-maxError)*rate*elapsed.Seconds(), "the regions together admitted far below the global limit")
}
