package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
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
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
)

// startCoordinator runs `quotient coordinator args...` in process until
// the test ends, and waits (bounded) for its /healthz.
func startCoordinator(t *testing.T, args ...string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	env, errb := coordinatorEnvOf(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- run(ctx, env, append([]string{"coordinator", "--listen", addr}, args...)) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			assert.Equal(t, 0, code, errb.String())
		case <-time.After(30 * time.Second):
			t.Error("coordinator did not stop within 30 s")
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			err = errors.New(resp.Status)
		}
		require.True(t, time.Now().Before(deadline), "coordinator: no /healthz within 30 s: %v\n%s", err, errb.String())
		select {
		case code := <-done:
			t.Fatalf("coordinator exited with %d: %s", code, errb.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestRLSGlobalLimitAcrossRegions: three regions, each a redis-server, a
// coordinator and quotient rls (region set from the coordinator's record:
// no --regions), share one global token bucket of rate r = 30/s and burst
// B = 30 named by an envoyproxy rule (rate_limit: {policy: g}). A gRPC
// client per region sends one descriptor of one caller at 60/s, 10/s and
// 10/s.
//
// The bound: at every instant the shares the regions enforce sum to at
// most r and B (the rebalancer's invariant; before any share record each
// region enforces r/3 and B/3), so the tokens across the three buckets
// never exceed B and refill at most at r: over a run of T seconds the sum
// admitted is at most B + r·T. Wall-clock T (first call sent to last
// answer) only overstates the time the buckets had, so the check holds
// on a loaded machine. The coordinators are in the loop: the region with
// the demand gets a share record above the default 1/3 once the
// coordinators' warm-up (2K-1 = 9 epochs) is over, which needs the rls's
// usage flushes to reach them.
func TestRLSGlobalLimitAcrossRegions(t *testing.T) {
	const (
		rate, burst = 30.0, 30.0
		epoch       = time.Second
	)
	regions := []string{"ap", "eu", "us"}
	demand := map[string]time.Duration{"ap": time.Second / 60, "eu": time.Second / 10, "us": time.Second / 10}
	dir := t.TempDir()
	policies := gwFile(t, dir, "policies.json", fmt.Sprintf(`[{"id":"g","algorithm":"token_bucket","rate_per_sec":%v,"burst":%v,"scope":"global"}]`, rate, burst))
	rlsFile(t, filepath.Join(dir, "runtime", "config", "global.yaml"), "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {policy: g}\n", time.Now())

	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(kc.Close)

	servers := map[string]*redistest.Server{}
	for _, r := range regions {
		servers[r] = redistest.StartServer(t)
		startCoordinator(t, "--region", r, "--regions", strings.Join(regions, ","), "--redis", servers[r].Addr(),
			"--kafka", kc.ListenAddrs()[0], "--epoch", epoch.String(), "--policies", policies)
	}
	clients := map[string]rlsv3.RateLimitServiceClient{}
	for _, r := range regions {
		// The coordinator states the region set before the rls starts.
		require.Eventually(t, func() bool {
			_, ok, err := limiter.ReadRegionSet(context.Background(), servers[r].Client())
			return err == nil && ok
		}, 30*time.Second, 20*time.Millisecond, "no region set record in %s", r)
		conn, stderr, _ := startRLS(t, nil, "--redis", servers[r].Addr(), "--config-dir", filepath.Join(dir, "runtime"),
			"--policies", policies, "--timeout", "1s", "--usage-flush", "100ms")
		clients[r] = rlsv3.NewRateLimitServiceClient(conn)
		assert.Contains(t, stderr.String(), "source=coordinator")
	}

	subject := limiter.Subject{Kind: limiter.SubjectDescriptor, Value: "api/tenant=acme"}
	defaultRateMilli := int64(rate*1000) / int64(len(regions))
	grown := func() bool {
		m, err := servers["ap"].Client().HGetAll(context.Background(), limiter.ShareKey(subject, "g")).Result()
		if err != nil {
			return false
		}
		v, err := strconv.ParseInt(m["r"], 10, 64)
		return err == nil && v > defaultRateMilli
	}

	var admitted, sent atomic.Int64
	perRegion := map[string]*atomic.Int64{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for _, r := range regions {
		perRegion[r] = &atomic.Int64{}
		wg.Go(func() {
			tick := time.NewTicker(demand[r])
			defer tick.Stop()
			req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}}}}
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := clients[r].ShouldRateLimit(ctx, req)
				cancel()
				if !assert.NoError(t, err, r) {
					return
				}
				sent.Add(1)
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					admitted.Add(1)
					perRegion[r].Add(1)
				}
			}
		})
	}
	// Traffic until the coordinators grew the busy region's share, then
	// three more epochs under it (bounded: 40 s).
	deadline := time.Now().Add(40 * time.Second)
	for !grown() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond) // polling a record another process writes; no decision depends on it
	}
	sawGrowth := grown()
	if sawGrowth {
		time.Sleep(3 * epoch)
	}
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)

	bound := burst + rate*elapsed.Seconds()
	t.Logf("%.1f s: sent %d, admitted %d (ap %d, eu %d, us %d), bound B + r·T = %.0f", elapsed.Seconds(), sent.Load(), admitted.Load(),
		perRegion["ap"].Load(), perRegion["eu"].Load(), perRegion["us"].Load(), bound)
	assert.True(t, sawGrowth, "the coordinators never raised ap's share above the default 1/3 within 40 s")
	assert.LessOrEqual(t, float64(admitted.Load()), bound, "the regions together admitted more than the global limit allows")
	assert.Greater(t, sent.Load(), admitted.Load(), "the demand exceeded the limit, so the limit was tested")
}
