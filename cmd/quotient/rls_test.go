package main

import (
	"context"
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

	"github.com/quotientlabs/quotient/internal/redistest"
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
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	require.NoError(t, os.Chtimes(path, mod, mod))
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
	hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, hc.Status)

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
