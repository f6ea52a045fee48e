package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rls/quota"
)

// TestRLQSSharesFollowTrafficAcrossRegions: three regions, each a
// redis-server, a coordinator and quotient rls, share one global token
// bucket (r = 30/s, B = 30) named by a rule. In each region one simulated
// Envoy enforces its RLQS assignment with a local token bucket and reports
// what it admitted and denied every 250 ms; the demand is 60/s in ap and
// 10/s in eu and us. The coordinators see that usage (written by quotient
// rls in the gateways' layout) and grow ap's share above the default 1/3;
// ap's Envoy then gets an assignment above 10/s. The admitted total is
// logged against the ideal global limiter's B + r·T.
func TestRLQSSharesFollowTrafficAcrossRegions(t *testing.T) {
	const (
		rate, burst = 30.0, 30.0
		epoch       = time.Second
	)
	regions := []string{"ap", "eu", "us"}
	demand := map[string]float64{"ap": 60, "eu": 10, "us": 10}
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	streams := map[string]rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient{}
	for _, r := range regions {
		require.Eventually(t, func() bool {
			_, ok, err := limiter.ReadRegionSet(context.Background(), servers[r].Client())
			return err == nil && ok
		}, 30*time.Second, 20*time.Millisecond, "no region set record in %s", r)
		addr, _, stop := startServing(t, "rls", nil, "--redis", servers[r].Addr(), "--config-dir", filepath.Join(dir, "runtime"),
			"--policies", policies, "--timeout", "1s", "--usage-flush", "100ms",
			"--rlqs-ttl", "1s", "--rlqs-in-flight", "200ms", "--rlqs-share-refresh", "200ms")
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { cancel(); _ = conn.Close(); stop() })
		streams[r], err = rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
		require.NoError(t, err)
	}

	type envoyState struct {
		mu       sync.Mutex
		amt      quota.Amount
		assigned bool
		until    time.Time
		tokens   float64
		maxRate  int64
		admitted int64
		sent     int64
	}
	state := map[string]*envoyState{}
	var wg sync.WaitGroup
	for _, r := range regions {
		st := &envoyState{}
		state[r] = st
		wg.Go(func() { // receive assignments, as Envoy applies them
			for {
				resp, err := streams[r].Recv()
				if err != nil {
					return
				}
				for _, a := range resp.BucketAction {
					qa := a.GetQuotaAssignmentAction()
					if qa == nil {
						continue
					}
					amt, _ := quota.AmountOf(qa.GetRateLimitStrategy())
					st.mu.Lock()
					if !st.assigned || amt != st.amt {
						st.tokens = float64(amt.BurstMilli) / 1000 // a new strategy starts a full bucket
					}
					st.amt, st.assigned = amt, true
					st.until = time.Now().Add(qa.GetAssignmentTimeToLive().AsDuration())
					st.maxRate = max(st.maxRate, amt.RateMilli)
					st.mu.Unlock()
				}
			}
		})
	}
	defaultRate := int64(rate*1000) / int64(len(regions))
	grown := func() bool {
		st := state["ap"]
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.maxRate > defaultRate
	}
	start := time.Now()
	last := start
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	deadline := start.Add(40 * time.Second)
	var grewAt time.Time
	for now := range tick.C {
		el := now.Sub(last)
		last = now
		for _, r := range regions {
			st := state[r]
			st.mu.Lock()
			n := int64(demand[r] * el.Seconds())
			var allowed int64
			if st.assigned && now.Before(st.until) {
				st.tokens = min(st.tokens+float64(st.amt.RateMilli)/1000*el.Seconds(), float64(st.amt.BurstMilli)/1000)
				allowed = min(n, int64(st.tokens))
				st.tokens -= float64(allowed)
			} // no assignment (or expired): this Envoy denies (no_assignment_behavior DENY_ALL)
			st.admitted += allowed
			st.sent += n
			st.mu.Unlock()
			require.NoError(t, streams[r].Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "api", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
				BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "acme"}}, TimeElapsed: durationpb.New(el),
				NumRequestsAllowed: uint64(allowed), NumRequestsDenied: uint64(n - allowed)}}}))
		}
		if grewAt.IsZero() && grown() {
			grewAt = now
		}
		if (!grewAt.IsZero() && now.Sub(grewAt) > 3*epoch) || now.After(deadline) {
			break
		}
	}
	elapsed := time.Since(start)
	var admitted, sent int64
	for _, r := range regions {
		admitted += state[r].admitted
		sent += state[r].sent
	}
	t.Logf("%.1f s: sent %d, admitted %d (ap %d, eu %d, us %d), ideal B + r·T = %.0f; ap's share first above 1/3 after %.1f s",
		elapsed.Seconds(), sent, admitted, state["ap"].admitted, state["eu"].admitted, state["us"].admitted, burst+rate*elapsed.Seconds(), grewAt.Sub(start).Seconds())
	assert.False(t, grewAt.IsZero(), "ap's Envoy never got more than the default third within 40 s: the coordinators did not see the RLQS usage")
	assert.Greater(t, sent, admitted, "the demand exceeded the limit")
	cancel()
	wg.Wait()
}
