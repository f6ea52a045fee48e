package region_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/dailyquota"
	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/region"
)

// windowWithRoom picks a window length (s) whose current window has at
// least 15 minutes left, so the test never straddles a window boundary.
func windowWithRoom(now time.Time) int64 {
	for _, s := range []int64{86_400, 90_000} {
		if dailyquota.Fixed(time.Duration(s)*time.Second).At(now).End().Sub(now) > 15*time.Minute {
			return s
		}
	}
	panic("unreachable: the two window lengths never end within 15 minutes of each other")
}

// gateway is one region's limiter on its Redis, flushing its usage (so
// its coordinator finds the active keys) every 100 ms.
type gateway struct {
	name string
	rs   *limiter.RedisStore
	lim  *limiter.Limiter
}

// TestCoordinatorsReplicateDailyQuota runs three coordinators whose only
// global policy is a fixed window (no bucket to share), each beside a
// gateway (the production limiter on the region's own redis-server, usage
// flushed to it), over one kfake broker. Admissions in every region reach
// every other region's Redis through the coordinators' replication; once
// they have, a region that admitted nothing itself is refused because of
// the others' counts, and the remainder split has set every region's cap
// to its own count. Every wait is bounded by a deadline.
func TestCoordinatorsReplicateDailyQuota(t *testing.T) {
	const limit = 100
	names := []string{"ap", "eu", "us"}
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(kc.Close)

	windowS := windowWithRoom(time.Now())
	doc := fmt.Sprintf(`[{"id":"day","algorithm":"fixed_window","limit":%d,"window_s":%d,"scope":"global","subject":"account"},
		{"id":"local","algorithm":"token_bucket","rate_per_sec":1000,"subject":"ip"}]`, limit, windowS)
	pols, err := limiter.ParsePolicies([]byte(doc))
	require.NoError(t, err)
	subj := limiter.Subject{Kind: limiter.SubjectAccount, Value: "acme"}

	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(wait):
			t.Errorf("coordinators and flushers did not stop within %v", wait)
		}
	})
	var coords []*region.Coordinator
	var gws []*gateway
	for _, name := range names {
		srv := redistest.StartServer(t)
		cfg := region.DefaultConfig()
		cfg.Region, cfg.Regions, cfg.Epoch = name, names, time.Second
		cfg.MaxWait, cfg.CollectDelay = 500*time.Millisecond, 200*time.Millisecond
		cfg.RedisAddrs, cfg.KafkaBrokers = []string{srv.Addr()}, kc.ListenAddrs()
		cfg.Listen, cfg.Policies = "127.0.0.1:0", pols
		c, err := region.New(cfg)
		require.NoError(t, err, "a fixed window alone is enough for a coordinator")
		coords = append(coords, c)

		client := srv.Client()
		rs := limiter.NewRedisStore(client)
		lcfg := limiter.DefaultConfig()
		lcfg.Store, lcfg.Region, lcfg.Regions = rs, name, len(names)
		lcfg.UsageEpoch = cfg.Epoch // the coordinator's epoch, as cmd/quotient gateway sets it
		lcfg.Deadline = 2 * time.Second
		lcfg.DenyCacheMaxKeys = -1
		lim, err := limiter.New(lcfg, pols)
		require.NoError(t, err)
		fl := limiter.NewUsageFlusher(lim, limiter.NewRedisUsageSink(client, 0, lcfg.UsageEpoch, 3), limiter.UsageFlusherConfig{Interval: 100 * time.Millisecond})
		gws = append(gws, &gateway{name: name, rs: rs, lim: lim})
		wg.Add(2)
		go func() { defer wg.Done(); _ = c.Run(ctx) }()
		go func() { defer wg.Done(); fl.Run(ctx) }()
	}

	admit := func(g *gateway, n int) {
		t.Helper()
		for i := range n {
			d, err := g.lim.Check(ctx, limiter.Request{Identity: limiter.Identity{Account: subj.Value}, Cost: 1})
			require.NoError(t, err)
			require.True(t, d.Allowed, "%s: request %d of %d refused", g.name, i+1, n)
		}
	}
	views := func() ([]limiter.WindowCounts, error) {
		out := make([]limiter.WindowCounts, len(gws))
		for i, g := range gws {
			wc, err := g.rs.WindowCounts(ctx, subj, "day")
			if err != nil {
				return nil, err
			}
			out[i] = wc
		}
		return out, nil
	}
	waitFor := func(what string, cond func([]limiter.WindowCounts) bool) {
		t.Helper()
		deadline := time.Now().Add(wait)
		for {
			vs, err := views()
			require.NoError(t, err)
			if cond(vs) {
				return
			}
			require.True(t, time.Now().Before(deadline), "%s: not within %v; views %+v", what, wait, vs)
			time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
		}
	}
	equalTo := func(want map[string]int64) func([]limiter.WindowCounts) bool {
		return func(vs []limiter.WindowCounts) bool {
			for _, v := range vs {
				for _, r := range names {
					if v.Counts[r] != want[r] {
						return false
					}
				}
			}
			return true
		}
	}

	// Every region admits some, concurrently; every view converges to the
	// true totals.
	first := map[string]int64{"ap": 10, "eu": 25, "us": 40}
	var lwg sync.WaitGroup
	for _, g := range gws {
		lwg.Add(1)
		go func() { defer lwg.Done(); admit(g, int(first[g.name])) }()
	}
	lwg.Wait()
	start := time.Now()
	waitFor("first counts replicated", equalTo(first))
	t.Logf("three regions' counts visible everywhere %v after the last admission", time.Since(start).Round(time.Millisecond))

	// eu spends the rest of the limit. Once that has replicated, ap and us
	// (which admitted less than the limit themselves) refuse, and every
	// region's cap is its own count (no remainder left to split).
	admit(gws[1], limit-75)
	second := map[string]int64{"ap": 10, "eu": 50, "us": 40}
	waitFor("the spent limit replicated, caps set", func(vs []limiter.WindowCounts) bool {
		if !equalTo(second)(vs) {
			return false
		}
		for i, v := range vs {
			if v.Cap != second[names[i]] {
				return false
			}
		}
		return true
	})
	for _, g := range gws {
		d, err := g.lim.Check(ctx, limiter.Request{Identity: limiter.Identity{Account: subj.Value}, Cost: 1})
		require.NoError(t, err)
		assert.False(t, d.Allowed, "%s admits past the global limit it learnt by replication", g.name)
	}

	for i, c := range coords {
		mfs, err := c.Registry().Gather()
		require.NoError(t, err)
		got := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				got[mf.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
		assert.GreaterOrEqual(t, got["quotient_dailyquota_published_total"], 1.0, names[i])
		assert.GreaterOrEqual(t, got["quotient_dailyquota_merged_total"], 2.0, "%s merged the other two regions' counts", names[i])
		assert.GreaterOrEqual(t, got["quotient_dailyquota_caps_set_total"], 1.0, names[i])
		assert.Zero(t, got["quotient_dailyquota_invalid_total"], names[i])
		assert.Less(t, got["quotient_dailyquota_lag_max_seconds"], wait.Seconds(), names[i])
	}
}
