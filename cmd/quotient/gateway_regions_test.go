package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
)

// A global bucket whose burst divides by 2, 3 and 4 regions; it refills
// too slowly to matter within a test.
const globalBurstPolicy = `[{"id":"g","algorithm":"token_bucket","rate_per_sec":0.012,"burst":12,"scope":"global"}]`

// admittedBurst sends n requests of key through the gateway at base and
// counts the 200s.
func admittedBurst(t *testing.T, base, key string, n int) int {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	ok := 0
	for range n {
		resp, _ := get(t, c, base+"/x", map[string]string{"X-API-Key": key})
		if resp.StatusCode == 200 {
			ok++
		}
	}
	return ok
}

func TestGatewayGlobalPolicyNeedsTheRegionSet(t *testing.T) {
	srv := redistest.StartServer(t)
	up := upstream(t)
	dir := t.TempDir()
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	env := environment{stdout: stdout, stderr: stderr, lookupEnv: func(string) (string, bool) { return "", false }}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := run(ctx, env, []string{"gateway", "--listen", "127.0.0.1:0", "--upstream", up.URL, "--redis", srv.Addr(),
		"--policies", gwFile(t, dir, "p.json", globalBurstPolicy), "--keys", gwFile(t, dir, "k.json", gatewayKeys)})
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr.String(), `--regions is required (or QUOTIENT_REGIONS): policy \"g\" is scope global`)
	assert.NotContains(t, stdout.String(), "listening")

	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--regions", "a,b,c,d,e,f,g,h,i,j,k,l,m", "--region", "a"}, `global policy \"g\" over 13 regions`},
		{[]string{"--regions", "eu,us"}, "--region is required with --regions"},
		{[]string{"--regions", "eu,us", "--region", "ap"}, `--region \"ap\" is not one of --regions eu,us`},
		{[]string{"--regions", "eu,,us", "--region", "eu"}, `--regions: limiter: invalid region set: region name \"\"`},
	} {
		stderr := &syncBuffer{}
		env.stderr = stderr
		code := run(ctx, env, append([]string{"gateway", "--listen", "127.0.0.1:0", "--upstream", up.URL, "--redis", srv.Addr(),
			"--policies", gwFile(t, dir, "p.json", globalBurstPolicy)}, tc.args...))
		assert.Equal(t, 1, code, tc.args)
		assert.Contains(t, stderr.String(), tc.msg, tc.args)
	}
}

// TestGatewayEnforcesTheRegionSet: the default share is 1/n of the global
// burst with n from the flags, or from the coordinator's record, which
// wins over disagreeing flags (reported in a metric). The deadline is long
// so that a slow store call under the race detector does not hand the
// decision to the fallback, which admits more.
func TestGatewayEnforcesTheRegionSet(t *testing.T) {
	up := upstream(t)
	dir := t.TempDir()
	policies := gwFile(t, dir, "p.json", globalBurstPolicy)
	keys := gwFile(t, dir, "k.json", `{"k1":{"tier":"pro"}}`)

	t.Run("flags", func(t *testing.T) {
		srv := redistest.StartServer(t)
		base, _, _ := startGateway(t, "--upstream", up.URL, "--redis", srv.Addr(), "--policies", policies, "--keys", keys, "--timeout", "1s",
			"--regions", "eu,us,ap", "--region", "eu")
		assert.Equal(t, 4, admittedBurst(t, base, "k1", 8), "12 / 3 regions")
	})
	t.Run("coordinator record wins", func(t *testing.T) {
		srv := redistest.StartServer(t)
		require.NoError(t, limiter.WriteRegionSet(context.Background(), srv.Client(), limiter.RegionSet{
			Region: "eu", Regions: []string{"eu", "us", "ap", "sa"}, Epoch: 10 * time.Second, UsageShards: limiter.DefaultUsageShards}))
		base, stderr, _ := startGateway(t, "--upstream", up.URL, "--redis", srv.Addr(), "--policies", policies, "--keys", keys, "--timeout", "1s",
			"--regions", "eu,us", "--region", "eu")
		assert.Equal(t, 3, admittedBurst(t, base, "k1", 8), "12 / 4 regions, not / 2")
		assert.Contains(t, stderr.String(), "disagree with the region's coordinator")
		resp, body := get(t, &http.Client{Timeout: 5 * time.Second}, base+"/metrics", nil)
		require.Equal(t, 200, resp.StatusCode)
		assert.Contains(t, string(body), `quotient_gateway_region_set_mismatch{region="eu"} 1`)
	})
	t.Run("coordinator record alone", func(t *testing.T) {
		srv := redistest.StartServer(t)
		require.NoError(t, limiter.WriteRegionSet(context.Background(), srv.Client(), limiter.RegionSet{
			Region: "us", Regions: []string{"eu", "us"}, Epoch: 10 * time.Second, UsageShards: limiter.DefaultUsageShards}))
		base, _, _ := startGateway(t, "--upstream", up.URL, "--redis", srv.Addr(), "--policies", policies, "--keys", keys, "--timeout", "1s")
		assert.Equal(t, 6, admittedBurst(t, base, "k1", 8), "12 / 2 regions")
		resp, body := get(t, &http.Client{Timeout: 5 * time.Second}, base+"/metrics", nil)
		require.Equal(t, 200, resp.StatusCode)
		assert.Contains(t, string(body), `quotient_gateway_region_set_mismatch{region="us"} 0`)
	})
}

// TestGatewayRegionsFollowTheRecord: a changed record takes effect at the
// next refresh; a policy set with a global policy is refused while no
// region set is known.
func TestGatewayRegionsFollowTheRecord(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := context.Background()
	ps, err := limiter.ParsePolicies([]byte(globalBurstPolicy))
	require.NoError(t, err)
	l, err := limiter.New(limiter.DefaultConfig(), nil)
	require.NoError(t, err)
	g := &gatewayRegions{client: srv.Client(), log: slog.New(slog.NewTextHandler(io.Discard, nil)), mismatch: prometheus.NewGauge(prometheus.GaugeOpts{Name: "m"})}
	cfg := &limiterFlags{epoch: 10 * time.Second, usageShards: limiter.DefaultUsageShards}
	require.NoError(t, g.resolve(ctx, cfg, nil), "no global policy: no region set needed")
	require.NoError(t, g.attach(l))
	require.ErrorContains(t, g.guard(l).SetPolicies(ps), `policy "g" is scope global but the gateway knows no region set`)
	assert.Empty(t, l.Policies(), "the refused set is not in force")

	require.NoError(t, limiter.WriteRegionSet(ctx, srv.Client(), limiter.RegionSet{Region: "ap", Regions: []string{"eu", "us", "ap"}, Epoch: 10 * time.Second, UsageShards: limiter.DefaultUsageShards}))
	g.refresh(ctx)
	region, n := l.RegionSetting()
	assert.Equal(t, "ap", region)
	assert.Equal(t, 3, n)
	require.NoError(t, g.guard(l).SetPolicies(ps))

	// The coordinator's epoch changes under a running gateway: the region
	// set follows, the epoch is only reported.
	require.NoError(t, limiter.WriteRegionSet(ctx, srv.Client(), limiter.RegionSet{Region: "ap", Regions: []string{"eu", "ap"}, Epoch: 2 * time.Second, UsageShards: limiter.DefaultUsageShards}))
	g.refresh(ctx)
	_, n = l.RegionSetting()
	assert.Equal(t, 2, n)
	var m dto.Metric
	require.NoError(t, g.mismatch.Write(&m))
	assert.Equal(t, 1.0, m.GetGauge().GetValue())
}

// TestGatewayUsageLayoutFollowsTheRecord: a gateway whose coordinator is
// of the previous release (its record has usage_shards only) writes the
// split layout that coordinator reads; with this release's record it
// writes the packed layout with the record's count (rolling upgrade in
// either order; see limiter.RegionSet).
func TestGatewayUsageLayoutFollowsTheRecord(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := context.Background()
	c := srv.Client()
	epoch := time.Now().UnixMilli()/10_000 + 3
	count := []limiter.UsageCount{{Epoch: epoch, PolicyID: "g", Subject: limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "a"}, Demand: 3, Admitted: 1}}
	resolve := func() *limiterFlags {
		g := &gatewayRegions{client: c, log: slog.New(slog.NewTextHandler(io.Discard, nil)), mismatch: prometheus.NewGauge(prometheus.GaugeOpts{Name: "m"})}
		cfg := &limiterFlags{epoch: 10 * time.Second, usageShards: limiter.DefaultUsageShards}
		require.NoError(t, g.resolve(ctx, cfg, nil))
		return cfg
	}

	require.NoError(t, c.HSet(ctx, limiter.RegionSetKey, "region", "eu", "regions", "eu,us", "epoch_ms", 10_000, "usage_shards", 16).Err())
	cfg := resolve()
	failed, err := cfg.usageSink(c).WriteUsage(ctx, count)
	require.NoError(t, err)
	require.Empty(t, failed)
	split, err := limiter.CollectUsageLayout(ctx, c, epoch, limiter.UsageLayout{Shards: 1, SplitShards: 16})
	require.NoError(t, err)
	assert.Equal(t, []limiter.UsageTotal{{PolicyID: "g", SubjectKey: "k:a", Demand: 3, Admitted: 1}}, split, "the split layout, which the old coordinator reads")
	packed, err := limiter.CollectUsageTotals(ctx, c, epoch, limiter.DefaultUsageShards)
	require.NoError(t, err)
	assert.Empty(t, packed)

	require.NoError(t, limiter.WriteRegionSet(ctx, c, limiter.RegionSet{Region: "eu", Regions: []string{"eu", "us"}, Epoch: 10 * time.Second, UsageShards: 32, SplitShards: 16}))
	cfg = resolve()
	failed, err = cfg.usageSink(c).WriteUsage(ctx, count)
	require.NoError(t, err)
	require.Empty(t, failed)
	packed, err = limiter.CollectUsageTotals(ctx, c, epoch, 32)
	require.NoError(t, err)
	assert.Equal(t, []limiter.UsageTotal{{PolicyID: "g", SubjectKey: "k:a", Demand: 3, Admitted: 1}}, packed, "the packed layout, with the record's count")
}
