package main

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/rls"
	"github.com/quotientlabs/quotient/rls/quota"
)

// TestRLQSEndToEnd runs `quotient rls` with the flags an operator passes,
// opens an RLQS stream as Envoy does, gets a token bucket within the
// region's default share (a third of 30/s over three regions) once the
// warm-up (TTL + in-flight, 2.2 s) has passed, and on
// shutdown gets the assignment again with a TTL of 0 before the stream
// ends.
func TestRLQSEndToEnd(t *testing.T) {
	rs := redistest.StartServer(t)
	root := t.TempDir()
	rlsFile(t, filepath.Join(root, "ratelimit", "config", "limits.yaml"), `domain: api
descriptors:
  - key: route
    value: /search
    rate_limit: {unit: second, requests_per_unit: 30}
`, time.Now())
	launched := time.Now() // the warm-up starts after this
	addr, stderr, stop := startServing(t, "rls", nil, "--redis", rs.Addr(), "--config-dir", filepath.Join(root, "ratelimit"),
		"--region", "eu", "--regions", "eu,us,ap", "--rlqs-ttl", "2s", "--rlqs-in-flight", "200ms")
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "api", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId:    &rlqsv3.BucketId{Bucket: map[string]string{"route": "/search"}},
		TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 5,
	}}}))
	resp, err := st.Recv()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(launched), 2200*time.Millisecond, "no assignment during the warm-up")
	require.Len(t, resp.BucketAction, 1)
	qa := resp.BucketAction[0].GetQuotaAssignmentAction()
	require.NotNil(t, qa)
	assert.Equal(t, 2*time.Second, qa.GetAssignmentTimeToLive().AsDuration())
	amt, _ := quota.AmountOf(qa.GetRateLimitStrategy())
	// An envoyproxy rule limits each region, as quotient rls decides it:
	// the region's whole 30/s, not a third of it.
	assert.InDelta(t, 30_000, amt.RateMilli, 10, "the region's 30/s")
	// The burst but its spare part, kept for the new bucket of a changed
	// assignment (quota.Config.BurstSparePermille), in whole requests.
	spare := quota.DefaultConfig().BurstSparePermille
	assert.Equal(t, (30_000-30_000*spare/1000)/1000*1000, amt.BurstMilli)

	// Stop as SIGTERM does (the run context ends), keeping the client.
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	defer func() {
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Errorf("quotient rls did not exit after its RLQS streams ended: %s", stderr.String())
		}
	}()
	resp, err = st.Recv()
	require.NoError(t, err)
	require.Len(t, resp.BucketAction, 1)
	ttl := resp.BucketAction[0].GetQuotaAssignmentAction().GetAssignmentTimeToLive()
	require.NotNil(t, ttl)
	assert.Equal(t, time.Duration(0), ttl.AsDuration())
}

// TestRLQSReplicasLendThroughRedis runs two `quotient rls --rlqs-replicas
// 2` on one redis-server, one Envoy stream on each: the replicas publish
// their claims in the region's Redis, and the Envoy with all the demand
// gets more than half of the region's 30/s (the static 1/N split gave it
// 15/s at most).
func TestRLQSReplicasLendThroughRedis(t *testing.T) {
	rs := redistest.StartServer(t)
	root := t.TempDir()
	rlsFile(t, filepath.Join(root, "ratelimit", "config", "limits.yaml"), `domain: api
descriptors:
  - key: route
    value: /search
    rate_limit: {unit: second, requests_per_unit: 30}
`, time.Now())
	bucket := map[string]string{"route": "/search"}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var streams []rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	for range 2 {
		addr, _, stop := startServing(t, "rls", nil, "--redis", rs.Addr(), "--config-dir", filepath.Join(root, "ratelimit"),
			"--region", "eu", "--regions", "eu", "--rlqs-ttl", "2s", "--rlqs-in-flight", "200ms", "--rlqs-replicas", "2")
		t.Cleanup(stop)
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
		require.NoError(t, err)
		streams = append(streams, st)
	}
	var mu sync.Mutex
	rate := make([]int64, 2)
	for i, st := range streams {
		go func() {
			for {
				resp, err := st.Recv()
				if err != nil {
					return
				}
				for _, ba := range resp.GetBucketAction() {
					if qa := ba.GetQuotaAssignmentAction(); qa != nil {
						amt, _ := quota.AmountOf(qa.GetRateLimitStrategy())
						mu.Lock()
						rate[i] = amt.RateMilli
						mu.Unlock()
					}
				}
			}
		}()
	}
	report := func(st rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, n uint64) {
		require.NoError(t, st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "api", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: &rlqsv3.BucketId{Bucket: bucket}, TimeElapsed: durationpb.New(250 * time.Millisecond), NumRequestsAllowed: n,
		}}}))
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		report(streams[0], 15) // 60/s
		report(streams[1], 0)
		mu.Lock()
		r0, r1 := rate[0], rate[1]
		mu.Unlock()
		require.LessOrEqual(t, r0+r1, int64(30_000), "the replicas' Envoys hold more than the region's 30/s")
		if r0 > 20_000 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the busy Envoy never got more than 20/s of 30/s (it holds %d milli/s, the idle one %d)", r0, r1)
		time.Sleep(250 * time.Millisecond) // the Envoys' reporting interval
	}
	claims, err := rs.Client().HGetAll(ctx, quota.ClaimKeyPrefix+rls.BucketKey("api", bucket)).Result()
	require.NoError(t, err)
	assert.Len(t, claims, 2, "each replica publishes its claim: %v", claims)
}
