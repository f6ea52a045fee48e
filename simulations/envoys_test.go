package simulations

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rls/quota"
)

func TestParseEnvoys(t *testing.T) {
	sc, err := ParseScenario(patch(t, map[string]any{"envoys": raw(`{"b": 2, "a": 3}`), "envoy_report_s": 0.5}))
	require.NoError(t, err)
	assert.Equal(t, []int{3, 2}, sc.Envoys, "by region index")
	assert.Equal(t, 0.5, sc.EnvoyReportSec)

	sc, err = ParseScenario(patch(t, map[string]any{"envoys": raw(`{"a": 1}`)}))
	require.NoError(t, err)
	assert.Equal(t, []int{1, 0}, sc.Envoys, "b goes through gateways")
	assert.Equal(t, 1.0, sc.EnvoyReportSec, "reports every second by default")
	assert.Equal(t, 1, sc.RLQSReplicas, "one RLQS server per region by default")

	sc, err = ParseScenario(patch(t, map[string]any{"envoys": raw(`{"a": 4}`), "rlqs_replicas": 3}))
	require.NoError(t, err)
	assert.Equal(t, 3, sc.RLQSReplicas)

	sc, err = ParseScenario([]byte(minimal))
	require.NoError(t, err)
	assert.Nil(t, sc.Envoys, "no envoys: gateways everywhere")
}

func TestParseEnvoysErrors(t *testing.T) {
	tests := []struct {
		name   string
		fields map[string]any
		path   string
		msg    string
	}{
		{"undeclared region", map[string]any{"envoys": raw(`{"a": 2, "us-west": 2}`)}, "envoys.us-west", "region not declared"},
		{"no Envoys", map[string]any{"envoys": raw(`{"a": 0}`)}, "envoys.a", "between 1 and 256"},
		{"too many Envoys", map[string]any{"envoys": raw(`{"a": 257}`)}, "envoys.a", "between 1 and 256"},
		{"fractional Envoys", map[string]any{"envoys": raw(`{"a": 1.5}`)}, "envoys.a", "whole number"},
		{"not an object", map[string]any{"envoys": raw(`[2]`)}, "envoys", "JSON object"},
		{"empty object", map[string]any{"envoys": raw(`{}`)}, "envoys", "empty"},
		{"report interval 0", map[string]any{"envoys": raw(`{"a": 2}`), "envoy_report_s": 0}, "envoy_report_s", "must be > 0"},
		{"negative report interval", map[string]any{"envoys": raw(`{"a": 2}`), "envoy_report_s": -1}, "envoy_report_s", "must be > 0"},
		{"report interval too long", map[string]any{"envoys": raw(`{"a": 2}`), "envoy_report_s": 61}, "envoy_report_s", "at most 60"},
		{"report interval as a string", map[string]any{"envoys": raw(`{"a": 2}`), "envoy_report_s": "1"}, "envoy_report_s", "want a number"},
		{"report interval without envoys", map[string]any{"envoy_report_s": 1}, "envoy_report_s", "without envoys"},
		{"replicas without envoys", map[string]any{"rlqs_replicas": 2}, "rlqs_replicas", "without envoys"},
		{"no replicas", map[string]any{"envoys": raw(`{"a": 2}`), "rlqs_replicas": 0}, "rlqs_replicas", "between 1 and 16"},
		{"too many replicas", map[string]any{"envoys": raw(`{"a": 2}`), "rlqs_replicas": 17}, "rlqs_replicas", "between 1 and 16"},
		{"negative replicas", map[string]any{"envoys": raw(`{"a": 2}`), "rlqs_replicas": -2}, "rlqs_replicas", "between 1 and 16, got -2"},
		{"fractional replicas", map[string]any{"envoys": raw(`{"a": 2}`), "rlqs_replicas": 1.5}, "rlqs_replicas", "whole number, got 1.5"},
		{"replicas as a string", map[string]any{"envoys": raw(`{"a": 2}`), "rlqs_replicas": "2"}, "rlqs_replicas", "want a number"},
		{"replicas null", map[string]any{"envoys": raw(`{"a": 2}`), "rlqs_replicas": raw(`null`)}, "rlqs_replicas", "want a number"},
		{"cost through Envoys", map[string]any{"envoys": raw(`{"a": 2}`),
			"traffic": raw(`[{"key": "k", "policies": ["p"], "cost": 10, "rate": {"a": [[0, 5]]}}]`)}, "traffic[0].cost", "costs 1"},
		{"two policies through Envoys", map[string]any{"envoys": raw(`{"a": 2}`),
			"policies": raw(`[{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 10, "burst": 20},
				{"id": "q", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 10, "burst": 20}]`),
			"traffic": raw(`[{"key": "k", "policies": ["p", "q"], "rate": {"a": [[0, 5]]}}]`)}, "traffic[0].policies", "one RLQS bucket"},
		{"fixed window through Envoys", map[string]any{"envoys": raw(`{"a": 2}`),
			"policies": raw(`[{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 10, "burst": 20},
				{"id": "day", "scope": "global", "algorithm": "fixed_window", "limit": 100, "window_s": 3600}]`),
			"traffic": raw(`[{"key": "k", "policies": ["day"], "rate": {"a": [[0, 5]]}}]`)}, "policies[1].algorithm", "token_bucket policies only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseScenario(patch(t, tt.fields))
			var serr *ScenarioError
			require.True(t, errors.As(err, &serr), "want a ScenarioError, got %v", err)
			found := false
			for _, p := range serr.Problems {
				if p.Path == tt.path && contains(p.Msg, tt.msg) {
					found = true
				}
			}
			assert.True(t, found, "want %q at %s, got %v", tt.msg, tt.path, serr.Problems)
		})
	}
	// Traffic of a gateway region is not held to the tier's rules.
	_, err := ParseScenario(patch(t, map[string]any{"envoys": raw(`{"b": 2}`),
		"traffic": raw(`[{"key": "k", "policies": ["p"], "cost": 10, "rate": {"a": [[0, 5]]}}]`)}))
	assert.NoError(t, err)
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// fixedShares is a ShareSource whose every record is one amount.
type fixedShares struct{ a quota.Amount }

func (f fixedShares) ReadShares(_ context.Context, qs []quota.ShareQuery) ([]quota.ShareRecord, error) {
	out := make([]quota.ShareRecord, len(qs))
	for i := range out {
		out[i] = quota.ShareRecord{Amount: f.a, Found: true}
	}
	return out, nil
}

// sumUsage is a UsageSink that adds up what it is given.
type sumUsage struct{ demand, admitted int64 }

func (s *sumUsage) WriteUsage(_ context.Context, counts []limiter.UsageCount) ([]limiter.UsageCount, error) {
	for _, c := range counts {
		s.demand += c.Demand
		s.admitted += c.Admitted
	}
	return nil, nil
}

type shiftOutcome struct {
	shiftTook          time.Duration // -1: never
	reportsPerEnvoySec float64
	responsesPerEnvoy  float64 // per second
}

// runEnvoyShift drives one region's tier in virtual time: n Envoys on one
// bucket whose region share is 100/s (burst 100), each reporting every
// report (staggered), the server ticking every 250 ms. Envoy 0 serves
// 200/s until 30 s, then Envoy 1 does, and Envoy n-1 serves 5/s
// throughout. At every 5 ms step the Envoys' assignments in force must
// sum within the share; at the end, the usage the server wrote must be
// every request the Envoys decided.
func runEnvoyShift(t *testing.T, n int, report time.Duration) shiftOutcome {
	t.Helper()
	pols, err := limiter.ParsePolicies([]byte(`[{"id": "g", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 300, "burst": 300}]`))
	require.NoError(t, err)
	rules, err := envoyRulesConfig(pols)
	require.NoError(t, err)
	share := quota.Amount{RateMilli: 100_000, BurstMilli: 100_000}
	usage := &sumUsage{}
	reg, err := newEnvoyRegion(context.Background(), envoyRegionConfig{
		n: n, regions: 3, epoch: 10 * time.Second, rules: rules,
		policy: func(string) *limiter.Policy { return pols[0] },
		shares: fixedShares{share}, usage: usage, rng: rng(1, "test"),
		startNs: DefaultStart.UnixNano(), bootNs: -int64(10 * time.Second),
		idOf: func(int) map[string]string { return map[string]string{"policy": "g", "key": "acct"} },
	})
	require.NoError(t, err)

	const step = 5 * time.Millisecond
	const total, shiftAt = 60 * time.Second, 30 * time.Second
	reportNs := int64(report)
	var requests, admitted int64
	out := shiftOutcome{shiftTook: -1}
	target := share.RateMilli - 5_000 // Envoy 1 after the shift: all but Envoy n-1's 5/s
	for at := int64(0); at <= int64(total); at += int64(step) {
		heavy := 0
		if at >= int64(shiftAt) {
			heavy = 1
		}
		serve := func(j int) {
			ok, err := reg.request(at, j, 0)
			require.NoError(t, err)
			requests++
			if ok {
				admitted++
			}
		}
		serve(heavy) // 200/s: one every 5 ms
		if at%int64(200*time.Millisecond) == 0 {
			serve(n - 1)
		}
		for j := range n {
			if off := int64(j+1) * reportNs / int64(n+1); at >= off && (at-off)%reportNs == 0 {
				require.NoError(t, reg.report(at, j))
			}
		}
		if at%serverTickNs == 0 {
			reg.tick(at)
		}
		held := reg.held(at, 0)
		require.LessOrEqual(t, held.RateMilli, share.RateMilli, "at %v the Envoys hold a rate of %d milli/s, above the share", time.Duration(at), held.RateMilli)
		require.LessOrEqual(t, held.BurstMilli, share.BurstMilli, "at %v the Envoys hold a burst of %d milli, above the share", time.Duration(at), held.BurstMilli)
		if at < int64(shiftAt) {
			continue
		}
		if b := reg.envoys[1].buckets[0]; out.shiftTook < 0 && b != nil && b.held(at).RateMilli*10 >= target*9 {
			out.shiftTook = time.Duration(at) - shiftAt
		}
	}
	// Every request is reported and flushed: a last report from every
	// Envoy, then a tick a flush interval later.
	end := int64(total) + int64(time.Millisecond)
	for j := range n {
		require.NoError(t, reg.report(end, j))
	}
	reg.tick(end + int64(time.Second))
	assert.Equal(t, requests, usage.demand, "the server's usage is every request the Envoys decided")
	assert.Equal(t, admitted, usage.admitted, "and every request they admitted")
	var reports, responses int64
	for _, env := range reg.envoys {
		reports += env.reports
		responses += env.responses
	}
	out.reportsPerEnvoySec = float64(reports) / float64(n) / total.Seconds()
	out.responsesPerEnvoy = float64(responses) / float64(n) / total.Seconds()
	return out
}

// TestEnvoyShiftResplitsWithinShare: when one region's traffic moves from
// one Envoy to another, the production server re-splits the share, the
// second Envoy holds 90 % of its new fair rate within TTL + InFlight (the
// first one's larger assignment must run out first) plus two reports and
// a tick, and the Envoys' assignments never sum above the share.
func TestEnvoyShiftResplitsWithinShare(t *testing.T) {
	cfg := quota.DefaultConfig()
	for _, tt := range []struct {
		n      int
		report time.Duration
	}{{3, time.Second}, {3, 2 * time.Second}, {4, time.Second}} {
		t.Run(tt.report.String(), func(t *testing.T) {
			out := runEnvoyShift(t, tt.n, tt.report)
			t.Logf("%d Envoys, report every %v: shift to 90%% of the new rate %v; per Envoy per second %.2f reports, %.2f responses",
				tt.n, tt.report, out.shiftTook, out.reportsPerEnvoySec, out.responsesPerEnvoy)
			require.GreaterOrEqual(t, out.shiftTook, time.Duration(0), "Envoy 1 never reached 90%% of its new rate")
			assert.LessOrEqual(t, out.shiftTook, cfg.TTL+cfg.InFlight+2*tt.report+time.Duration(serverTickNs))
		})
	}
}

// TestRLQSScenarioWithinShareAtEveryStep runs rlqs-abrupt-shift (a global
// limit enforced only through Envoys in three regions) and its variant
// with 10 Envoys per region, rlqs-many-envoys, and checks after
// every event of the tier and every request through it that each region's
// Envoys hold no more than the region's share. The share the coordinator
// lowers is reached TTL + InFlight after the server read it at the latest
// (rls/quota's invariant), and the server reads it every ShareRefresh, so
// the bound at t is the largest share in force within that span before t.
// It also checks that the Envoys' usage reached the coordinators: after
// the shift, eu-west's share is above the default third and us-east's
// below it. The Envoys hold, besides the assignments in force, the full
// bucket of every assignment a new one replaced before it expired
// (envoyBucket.heldWithReplaced); and each file meets its target.
//
// With two and three RLQS replicas per region (rlqs_replicas; for
// rlqs-many-envoys three only), the bound
// is the same a ShareRefresh later (a replica lowers its claim one call
// after its Envoys' larger assignments ran out), and it holds over all
// the replicas' Envoys together.
func TestRLQSScenarioWithinShareAtEveryStep(t *testing.T) {
	// (rlqs-many-envoys with 2 replicas is left out: 20 s under -race.)
	for f, ns := range map[string][]int{"rlqs-abrupt-shift": {1, 2, 3}, "rlqs-many-envoys": {1, 3}} {
		for _, n := range ns {
			t.Run(fmt.Sprintf("%s/%d replicas", f, n), func(t *testing.T) { runRLQSScenarioWithinShare(t, "scenarios/"+f+".json", n) })
		}
	}
}

func runRLQSScenarioWithinShare(t *testing.T, file string, replicas int) {
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	sc, err := ParseScenario(data)
	require.NoError(t, err)
	sc.RLQSReplicas = replicas
	e, err := newEngine(context.Background(), sc, Options{})
	require.NoError(t, err)
	require.NotNil(t, e.tier)
	k, ok := e.rec.Lookup("acct-shift", "pro")
	require.True(t, ok)
	pol := e.rec.keys[k].policy
	n := int64(len(sc.Regions))
	def := quota.Amount{RateMilli: pol.RateMilli() / n, BurstMilli: int64(pol.Burst*1000) / n}
	cfg := quota.DefaultConfig()
	lag := int64(cfg.TTL + cfg.InFlight + time.Second + time.Duration(serverTickNs))
	if replicas > 1 {
		lag += int64(time.Second)
	}
	type point struct {
		at int64
		a  quota.Amount
	}
	hist := make([][]point, n)
	shareAt := func(r int, at int64) quota.Amount {
		if rec, ok := e.tier.shares[r][k]; ok && at < rec.expireNs {
			return quota.Amount{RateMilli: rec.rate, BurstMilli: rec.burst}
		}
		return def
	}
	checks := 0
	e.tier.observe = func(at int64, r int) {
		s := shareAt(r, at)
		h := append(hist[r], point{at, s})
		for len(h) > 1 && h[1].at <= at-lag {
			h = h[1:]
		}
		hist[r] = h
		var bound quota.Amount
		for _, p := range h {
			bound.RateMilli, bound.BurstMilli = max(bound.RateMilli, p.a.RateMilli), max(bound.BurstMilli, p.a.BurstMilli)
		}
		held := e.tier.regions[r].held(at, k)
		checks++
		if held.RateMilli > bound.RateMilli || held.BurstMilli > bound.BurstMilli {
			require.Failf(t, "above the share", "%s at %v: Envoys hold %+v, share bound %+v", sc.Regions[r], time.Duration(at), held, bound)
		}
	}
	require.NoError(t, e.run())
	require.Greater(t, checks, 100_000)
	require.Len(t, e.tier.regions[0].srvs, replicas)
	end := e.endNs
	assert.Greater(t, shareAt(1, end).RateMilli, def.RateMilli, "eu-west's share never grew: the coordinators did not see its Envoys' usage")
	assert.Less(t, shareAt(0, end).RateMilli, def.RateMilli, "us-east's share never shrank")
	st := e.envoyStats()
	for r, name := range sc.Regions {
		if st.ActiveSec[r] == 0 {
			assert.Zero(t, st.Reports[r]+st.Responses[r], "%s: an Envoy without buckets sends nothing", name)
			continue
		}
		perSec := st.ActiveSec[r]
		t.Logf("%s: %d Envoys, %.0f Envoy-seconds with a bucket; per Envoy per second %.2f reports, %.2f responses", name, st.Envoys[r],
			perSec, float64(st.Reports[r])/perSec, float64(st.Responses[r])/perSec)
		assert.InDelta(t, 1/sc.EnvoyReportSec, float64(st.Reports[r])/perSec, 0.05, "%s: one report per reporting interval", name)
		assert.LessOrEqual(t, float64(st.Responses[r])/perSec, 4.0, "at most one response per server tick")
	}
	rep := e.rec.Report(e.startNs / nsPerSec)
	assert.True(t, rep.Pass, "%+v", rep.Worst)
}

// TestEnvoyUsageSurvivesStoreDown: while a region's store is down the RLQS
// server's usage writes fail; the tier's sink hands the counts back, the
// server keeps them (for two epochs) and writes them after the outage, so
// the coordinator still sees every request. A 15 s outage (under two
// epochs of 10 s) loses nothing: the usage added to the region is every
// request its Envoys decided, up to the reports of the last second.
func TestEnvoyUsageSurvivesStoreDown(t *testing.T) {
	sc, err := ParseScenario(patch(t, map[string]any{
		"duration_s": 200,
		"envoys":     raw(`{"a": 2}`),
		"faults":     raw(`[{"kind": "store_down", "region": "a", "from_s": 100, "to_s": 115}]`),
		"traffic":    raw(`[{"key": "k", "policies": ["p"], "arrivals": "uniform", "rate": {"a": [[0, 50]]}}]`),
	}))
	require.NoError(t, err)
	e, err := newEngine(context.Background(), sc, Options{})
	require.NoError(t, err)
	var usage int64
	add := e.tier.addUsage
	e.tier.addUsage = func(r, k int, demand, admitted int64) {
		usage += demand
		add(r, k, demand, admitted)
	}
	atStart, atEnd := int64(-1), int64(-1)
	e.tier.observe = func(at int64, r int) {
		switch {
		case at < 100*nsPerSec:
			atStart = usage
		case at < 115*nsPerSec:
			atEnd = usage
		}
	}
	require.NoError(t, e.run())
	assert.Equal(t, atStart, atEnd, "usage was written while the store was down")
	requests := e.rec.decisions
	assert.LessOrEqual(t, usage, requests)
	assert.GreaterOrEqual(t, usage, requests-2*50, "usage lost in the outage: %d of %d requests reached the region's usage", usage, requests)
}

// TestRLQSScenarioDeterministic: the same file and seed give the same
// outputs byte for byte through the RLQS tier too (FORMAT.md).
func TestRLQSScenarioDeterministic(t *testing.T) {
	data, err := os.ReadFile("scenarios/rlqs-flash-crowd.json")
	require.NoError(t, err)
	sc, err := ParseScenario(data)
	require.NoError(t, err)
	var outs [2]map[string][]byte
	for i := range outs {
		rep, err := Run(context.Background(), sc, Options{})
		require.NoError(t, err)
		dir := t.TempDir()
		require.NoError(t, rep.WriteFiles(dir))
		outs[i] = map[string][]byte{}
		for _, f := range []string{".windows.csv", ".seconds.csv"} {
			b, err := os.ReadFile(dir + "/" + sc.Name + f)
			require.NoError(t, err)
			outs[i][f] = b
		}
	}
	assert.Equal(t, outs[0], outs[1])
}

// TestRLQSThirtyEnvoysSteadyWindows runs rlqs-many-envoys with 30 Envoys
// per region (each sees about 5 requests a second against a part near
// 3.3/s) and checks every window but the shift's within 3 % of the ideal
// global limiter. With a quarter of the share's burst held spare (the
// default before), each Envoy's bucket held 3 or 4 tokens, which
// overflowed between Poisson arrivals: 4.4 to 4.9 % under after the
// shift.
func TestRLQSThirtyEnvoysSteadyWindows(t *testing.T) {
	data, err := os.ReadFile("scenarios/rlqs-many-envoys.json")
	require.NoError(t, err)
	sc, err := ParseScenario(data)
	require.NoError(t, err)
	for r := range sc.Envoys {
		sc.Envoys[r] = 30
	}
	e, err := newEngine(context.Background(), sc, Options{})
	require.NoError(t, err)
	require.NoError(t, e.run())
	rep := e.rec.Report(e.startNs / nsPerSec)
	k, ok := e.rec.Lookup("acct-shift", "pro")
	require.True(t, ok)
	allowance := float64(e.rec.keys[k].allowanceMilli(sc.WindowSec))
	require.Equal(t, 11, e.rec.windows)
	for w := range e.rec.windows {
		start := sc.WarmupSec + int64(w)*sc.WindowSec
		errW := rep.windowError(k, w, allowance)
		t.Logf("window at %d s: %+.1f %%", start, 100*errW)
		if start == 300 {
			continue // the shift: eu-west's share is the default's until the coordinators move it
		}
		assert.InDelta(t, 0, errW, 0.03, "window at %d s", start)
	}
}
