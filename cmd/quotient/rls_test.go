package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/region/admin"
	"github.com/quotientlabs/quotient/region/policysync"
)

// startRLS runs `quotient rls args...` in process and returns a gRPC
// connection to it, its stderr, and a stop function that waits for exit
// status 0.
func startRLS(t *testing.T, lookupEnv func(string) (string, bool), args ...string) (*grpc.ClientConn, *syncBuffer, func()) {
	t.Helper()
	addr, stderr, stopServing := startServing(t, "rls", lookupEnv, args...)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	stop := func() {
		_ = conn.Close()
		stopServing()
	}
	t.Cleanup(stop)
	return conn, stderr, stop
}

func rlsFile(t *testing.T, path, content string, mod time.Time) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	// Written beside the watched tree and renamed into it, so that the
	// watcher never reads it half-written.
	tmp := filepath.Join(t.TempDir(), filepath.Base(path))
	require.NoError(t, os.WriteFile(tmp, []byte(content), 0o600))
	require.NoError(t, os.Chtimes(tmp, mod, mod))
	require.NoError(t, os.Rename(tmp, path))
}

func rlsCall(t *testing.T, c rlsv3.RateLimitServiceClient, domain string, kv ...string) *rlsv3.RateLimitResponse {
	t.Helper()
	desc := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		desc.Entries = append(desc.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc}})
	require.NoError(t, err)
	return resp
}

const rlsLimits = `domain: api
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 2
`

func TestRLSEndToEnd(t *testing.T) {
	rs := redistest.StartServer(t)
	root := t.TempDir()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfgFile := filepath.Join(root, "ratelimit", "config", "limits.yaml")
	rlsFile(t, cfgFile, rlsLimits, t0)
	// Flags an operator passes, one of them through the environment.
	env := func(k string) (string, bool) {
		if k == "QUOTIENT_CONFIG_DIR" {
			return filepath.Join(root, "ratelimit"), true
		}
		return "", false
	}
	conn, stderr, stop := startRLS(t, env, "--redis", rs.Addr(), "--reload-interval", "10ms", "--timeout", "2s", "--response-headers")
	client := rlsv3.NewRateLimitServiceClient(conn)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waitHealth(t, conn, "envoy.service.ratelimit.v3.RateLimitService", healthpb.HealthCheckResponse_SERVING, 10*time.Second)
	assert.GreaterOrEqual(t, cachedScripts(t, rs), 1, "SERVING once the scripts are loaded")

	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
	refl, err := stream.Recv()
	require.NoError(t, err)
	var services []string
	for _, s := range refl.GetListServicesResponse().GetService() {
		services = append(services, s.Name)
	}
	assert.Contains(t, services, "envoy.service.ratelimit.v3.RateLimitService")
	assert.Contains(t, services, "grpc.health.v1.Health")

	assert.Equal(t, rlsv3.RateLimitResponse_OK, rlsCall(t, client, "api", "user", "u1").OverallCode)
	assert.Equal(t, rlsv3.RateLimitResponse_OK, rlsCall(t, client, "api", "user", "u1").OverallCode)
	over := rlsCall(t, client, "api", "user", "u1")
	assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, over.OverallCode)
	var keys []string
	for _, h := range over.ResponseHeadersToAdd {
		keys = append(keys, h.Key)
	}
	assert.Contains(t, keys, "Retry-After")

	// A broken edit keeps the last good configuration.
	rlsFile(t, cfgFile, strings.Replace(rlsLimits, "unit: day", "unit: decade", 1), t0.Add(time.Second))
	require.Eventually(t, func() bool { return strings.Contains(stderr.String(), `invalid unit \"decade\"`) }, 10*time.Second, 5*time.Millisecond, stderr.String())
	assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, rlsCall(t, client, "api", "user", "u1").OverallCode)

	// A good edit is applied: a higher limit admits u1 again.
	rlsFile(t, cfgFile, strings.Replace(rlsLimits, "requests_per_unit: 2", "requests_per_unit: 3", 1), t0.Add(2*time.Second))
	require.Eventually(t, func() bool {
		return rlsCall(t, client, "api", "user", "u2").Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == 3
	}, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, rlsv3.RateLimitResponse_OK, rlsCall(t, client, "api", "user", "u1").OverallCode)
	stop()
}

// waitHealth polls the gRPC health status of service until it is want,
// for at most limit, and returns how long that took.
func waitHealth(t *testing.T, conn *grpc.ClientConn, service string, want healthpb.HealthCheckResponse_ServingStatus, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	hc := healthpb.NewHealthClient(conn)
	var last healthpb.HealthCheckResponse_ServingStatus
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		cancel()
		require.NoError(t, err)
		if last = r.GetStatus(); last == want {
			return time.Since(start)
		}
		require.Less(t, time.Since(start), limit, "health of %q: %v, not %v within %v", service, last, want, limit)
		time.Sleep(10 * time.Millisecond) // polling a real server with a deadline
	}
}

// TestRLSWarmStart: quotient rls tells gRPC health checkers of its
// service NOT_SERVING ("", the process, stays SERVING) until its Redis is
// warm (connections open, scripts loaded on the node),
// as the gateway's /readyz does, and SERVING after; with Redis down for
// longer than --warm-timeout it serves in fallback and says so. Calls made
// while warming are answered (here by the fallback).
func TestRLSWarmStart(t *testing.T) {
	root := t.TempDir()
	rlsFile(t, filepath.Join(root, "ratelimit", "config", "limits.yaml"), rlsLimits, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	const svc = "envoy.service.ratelimit.v3.RateLimitService"

	t.Run("redis comes up", func(t *testing.T) {
		rs := redistest.StartServer(t)
		rs.Stop() // down at start
		conn, stderr, stop := startRLS(t, nil, "--redis", rs.Addr(), "--config-dir", filepath.Join(root, "ratelimit"), "--warm-timeout", "10m", "--warm-interval", "50ms", "--timeout", "50ms")
		// Readiness (the service) waits; liveness ("") does not.
		waitHealth(t, conn, svc, healthpb.HealthCheckResponse_NOT_SERVING, 10*time.Second)
		waitHealth(t, conn, "", healthpb.HealthCheckResponse_SERVING, 10*time.Second)
		assert.NotContains(t, stderr.String(), "rls ready", "ready without Redis, before --warm-timeout")
		// Answered while warming: the fallback admits within its limit.
		assert.Equal(t, rlsv3.RateLimitResponse_OK, rlsCall(t, rlsv3.NewRateLimitServiceClient(conn), "api", "user", "w").OverallCode)
		rs.Restart(t)
		took := waitHealth(t, conn, svc, healthpb.HealthCheckResponse_SERVING, 20*time.Second)
		assert.GreaterOrEqual(t, cachedScripts(t, rs), 1, "SERVING once the scripts are on the node")
		assert.Contains(t, stderr.String(), "rls ready")
		assert.NotContains(t, stderr.String(), "rls ready in fallback")
		t.Logf("SERVING %v after Redis came back", took.Round(time.Millisecond))
		stop()
	})
	t.Run("redis stays down", func(t *testing.T) {
		rs := redistest.StartServer(t)
		rs.Stop()
		conn, stderr, stop := startRLS(t, nil, "--redis", rs.Addr(), "--config-dir", filepath.Join(root, "ratelimit"), "--warm-timeout", "300ms", "--warm-interval", "50ms", "--timeout", "50ms")
		waitHealth(t, conn, svc, healthpb.HealthCheckResponse_SERVING, 20*time.Second)
		assert.Contains(t, stderr.String(), "rls ready in fallback: redis "+rs.Addr()+" not warm")
		assert.Equal(t, rlsv3.RateLimitResponse_OK, rlsCall(t, rlsv3.NewRateLimitServiceClient(conn), "api", "user", "w").OverallCode)
		stop()
	})
}

func TestRLSFlags(t *testing.T) {
	cases := []struct {
		args []string
		msg  string
	}{
		{[]string{"--redis", "127.0.0.1:1"}, "--config-dir is required"},
		{[]string{"--config-dir", "/x"}, "--redis is required"},
		{[]string{"--config-dir", "/x", "--redis", "a", "--timeout", "0s"}, "--timeout must be > 0"},
		{[]string{"--config-dir", "/x", "--redis", "a", "--policy-source", "kafka"}, `--policy-source "kafka": want file or redis`},
		{[]string{"--config-dir", "/x", "--redis", "a", "--max-delay", "-1s"}, "--max-delay must be >= 0"},
		{[]string{"--config-dir", "/x", "--redis", "a", "--region", "a b"}, `--region "a b"`},
		{[]string{"--config-dir", "/x", "--redis", "a", "extra"}, `unexpected argument "extra"`},
		{[]string{"--config-dir", "/x", "--redis", "a", "--grpc-stream-workers", "-1"}, "--grpc-stream-workers must be between 0 and 65536, got -1"},
		{[]string{"--config-dir", "/x", "--redis", "a", "--gc-percent", "-2"}, "--gc-percent must be -1 (off) or >= 0, got -2"},
	}
	for _, tc := range cases {
		stderr := &syncBuffer{}
		env := environment{stdout: &syncBuffer{}, stderr: stderr, lookupEnv: func(string) (string, bool) { return "", false }}
		assert.Equal(t, 2, run(context.Background(), env, append([]string{"rls"}, tc.args...)), tc.args)
		assert.Contains(t, stderr.String(), tc.msg)
	}
	// A configuration that does not load stops the start, naming the file.
	root := t.TempDir()
	rlsFile(t, filepath.Join(root, "config", "bad.yaml"), "domain: api\nlimits: {}\n", time.Now())
	stderr := &syncBuffer{}
	env := environment{stdout: &syncBuffer{}, stderr: stderr, lookupEnv: func(string) (string, bool) { return "", false }}
	assert.Equal(t, 1, run(context.Background(), env, []string{"rls", "--listen", "127.0.0.1:0", "--redis", "127.0.0.1:1", "--config-dir", root}))
	assert.Contains(t, stderr.String(), "bad.yaml: limits: unknown field")
}

// TestRLSGCPercentPrecedence: --gc-percent (or QUOTIENT_GC_PERCENT) sets
// the collector's target; without it, GOGC in the environment is left in
// force, and without either, the default applies.
func TestRLSGCPercentPrecedence(t *testing.T) {
	parse := func(vars map[string]string, args ...string) *rlsConfig {
		t.Helper()
		env := environment{stdout: &syncBuffer{}, stderr: &syncBuffer{}, lookupEnv: func(k string) (string, bool) { v, ok := vars[k]; return v, ok }}
		c, err := parseRLSFlags(env, append([]string{"--config-dir", "/x", "--redis", "a"}, args...))
		require.NoError(t, err)
		return c
	}
	c := parse(nil)
	assert.Equal(t, defaultGCPercent, c.gcPercent)
	assert.False(t, c.gcExplicit)
	c = parse(nil, "--gc-percent", "100")
	assert.Equal(t, 100, c.gcPercent)
	assert.True(t, c.gcExplicit)
	c = parse(map[string]string{"QUOTIENT_GC_PERCENT": "-1"})
	assert.Equal(t, -1, c.gcPercent)
	assert.True(t, c.gcExplicit, "the environment variable of the flag counts as given")
	c = parse(map[string]string{"GOGC": "50"})
	assert.False(t, c.gcExplicit, "GOGC alone: the flag's default does not override it")
}

// TestRLSFollowsRedisPolicies: with --policy-source redis, the policies
// rules name come from the coordinators' snapshot in the region's Redis
// (written here as the Materializer writes it), and so do per-descriptor
// overrides; --policies is the set until the first snapshot. Every wait is
// bounded; the waits peek (hits_addend 0), consuming nothing.
func TestRLSFollowsRedisPolicies(t *testing.T) {
	rs := redistest.StartServer(t)
	root := t.TempDir()
	rlsFile(t, filepath.Join(root, "config", "p.yaml"), "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {policy: p}\n", time.Now())
	initial := gwFile(t, root, "p.json", `[{"id":"p","algorithm":"token_bucket","rate_per_sec":0.01,"burst":50}]`)
	conn, stderr, _ := startRLS(t, nil, "--redis", rs.Addr(), "--config-dir", root, "--policies", initial,
		"--policy-source", "redis", "--policy-interval", "50ms", "--timeout", "1s")
	client := rlsv3.NewRateLimitServiceClient(conn)
	peek := func(tenant string) *rlsv3.RateLimitResponse_DescriptorStatus {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant}}, HitsAddend: wrapperspb.UInt64(0)}}})
		require.NoError(t, err)
		return resp.Statuses[0]
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for !cond() {
			require.True(t, time.Now().Before(deadline), "%s: not by the deadline; stderr:\n%s", what, stderr.String())
			time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
		}
	}
	assert.Equal(t, &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 36, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR}, peek("acme").GetCurrentLimit(), "the file's 0.01/s: 36 per hour")

	pol := json.RawMessage(`{"id":"p","version":1,"algorithm":"token_bucket","rate_per_sec":0.001,"burst":2}`)
	snap := policysync.Snapshot{Generation: 1, Policies: []json.RawMessage{pol}, Overrides: []admin.Override{}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := policysync.WriteSnapshot(ctx, rs.Client(), snap)
	require.NoError(t, err)
	waitFor("the snapshot's policy in force", func() bool { return peek("acme").GetCurrentLimit().GetRequestsPerUnit() == 87 })
	assert.Equal(t, []string{"OK", "OK", "OVER_LIMIT"}, rlsCodes(t, client, "acme", 3), "the snapshot's burst of 2")

	vip := limiter.Subject{Kind: limiter.SubjectDescriptor, Value: "api/tenant=vip"}
	snap.Generation = 2
	snap.Overrides = []admin.Override{{ID: admin.OverrideID("p", vip.Key()), Subject: vip.Key(), Policy: "p", Burst: 6, ExpiresAt: time.Now().Add(time.Hour).UTC(), Reason: "test"}}
	_, err = policysync.WriteSnapshot(ctx, rs.Client(), snap)
	require.NoError(t, err)
	waitFor("the override in force", func() bool { return peek("vip").GetLimitRemaining() == 6 })
	assert.Equal(t, []string{"OK", "OK", "OK", "OK", "OK", "OK", "OVER_LIMIT"}, rlsCodes(t, client, "vip", 7), "the override's burst of 6")
}

// rlsCodes sends n requests of tenant's descriptor and lists the codes.
func rlsCodes(t *testing.T, c rlsv3.RateLimitServiceClient, tenant string, n int) []string {
	t.Helper()
	var out []string
	for range n {
		out = append(out, rlsCall(t, c, "api", "tenant", tenant).OverallCode.String())
	}
	return out
}
