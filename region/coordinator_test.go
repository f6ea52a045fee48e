package region_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/region"
)

const wait = 30 * time.Second

func policies(t *testing.T) []*limiter.Policy {
	p, err := limiter.ParsePolicies([]byte(`[
		{"id":"g","algorithm":"token_bucket","rate_per_sec":300,"scope":"global"},
		{"id":"w","algorithm":"fixed_window","limit":1000,"window_s":86400,"scope":"global"},
		{"id":"r","algorithm":"token_bucket","rate_per_sec":5}]`))
	require.NoError(t, err)
	return p
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestThreeCoordinators runs three coordinators (2 s epochs) on loopback
// Redis servers and one kfake broker: each hears the others (regions alive
// 3, decisions in mode grow), serves /metrics and /healthz, and stops
// gracefully when its context is cancelled. (With 1 s epochs, a 500 ms
// max-wait and the race detector beside two other packages' tests, CI saw
// 30 s without one timely complete view: a grow decision must come within
// the epoch after the one decided.)
func TestThreeCoordinators(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	names := []string{"ap", "eu", "us"}
	type running struct {
		c      *region.Coordinator
		cancel context.CancelFunc
		done   chan error
	}
	var rs []running
	for _, name := range names {
		srv := redistest.StartServer(t)
		cfg := region.DefaultConfig()
		cfg.Region, cfg.Regions, cfg.Epoch = name, names, 2*time.Second
		cfg.MaxWait, cfg.CollectDelay = time.Second, 400*time.Millisecond
		cfg.RedisAddrs, cfg.KafkaBrokers = []string{srv.Addr()}, kc.ListenAddrs()
		cfg.Listen, cfg.Policies = "127.0.0.1:0", policies(t)
		c, err := region.New(cfg)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		r := running{c: c, cancel: cancel, done: make(chan error, 1)}
		go func() { r.done <- c.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			select {
			case <-r.done:
			case <-time.After(wait):
				t.Errorf("coordinator did not stop within %v", wait)
			}
		})
		rs = append(rs, r)
	}

	deadline := time.Now().Add(2 * wait) // 30 epochs
	for _, r := range rs {
		for {
			alive := mustGauge(t, r.c, "quotient_coordinator_regions_alive").value()
			grow := counterSum(t, r.c, "quotient_coordinator_decisions_total", "mode", "grow")
			if alive == 3 && grow > 0 {
				break
			}
			require.True(t, time.Now().Before(deadline), "coordinator %s: regions alive %v, grow decisions %v by the deadline", r.c.Addr(), alive, grow)
			time.Sleep(100 * time.Millisecond) // polling a condition with a deadline
		}
		code, body := get(t, "http://"+r.c.Addr()+"/healthz")
		assert.Equal(t, http.StatusOK, code, body)
		var h map[string]any
		require.NoError(t, json.Unmarshal([]byte(body), &h))
		assert.Equal(t, "ok", h["status"])
		tr, ok := h["transfers"].(map[string]any)
		require.True(t, ok, "/healthz shows the transfers: %s", body)
		assert.NotEmpty(t, tr["last_pressure"], "the pressure marks are read: %s", body)
		code, body = get(t, "http://"+r.c.Addr()+"/metrics")
		assert.Equal(t, http.StatusOK, code)
		for _, m := range []string{"quotient_coordinator_epoch_duration_seconds", "quotient_coordinator_keys", "quotient_coordinator_report_lag_seconds", "quotient_coordinator_regions_alive", `quotient_coordinator_decisions_total{late="false",mode="grow"}`, "go_goroutines",
			`quotient_coordinator_transfer_asks_total{direction="sent"}`, `quotient_coordinator_transfer_gives_total{direction="received",outcome="accepted"}`, "quotient_coordinator_transfer_rate_moved_milli_total", "quotient_coordinator_transfer_malformed_total"} {
			assert.Contains(t, body, m)
		}
	}

	// Graceful shutdown: Run returns nil, the port is closed.
	r := rs[0]
	addr := r.c.Addr()
	r.cancel()
	select {
	case err := <-r.done:
		assert.NoError(t, err)
		r.done <- err
	case <-time.After(wait):
		t.Fatalf("Run did not return within %v of cancel", wait)
	}
	assert.False(t, r.c.Status().Running)
	_, err = http.Get("http://" + addr + "/healthz")
	assert.Error(t, err, "the HTTP server is closed")
}

func mustGauge(t *testing.T, c *region.Coordinator, name string) *gaugeReader {
	return &gaugeReader{t: t, c: c, name: name}
}

// gaugeReader reads one unlabelled metric from a coordinator's registry.
type gaugeReader struct {
	t    *testing.T
	c    *region.Coordinator
	name string
}

func (g *gaugeReader) value() float64 {
	mfs, err := g.c.Registry().Gather()
	require.NoError(g.t, err)
	for _, mf := range mfs {
		if mf.GetName() == g.name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

func counterSum(t *testing.T, c *region.Coordinator, name, label, value string) float64 {
	mfs, err := c.Registry().Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

func TestNewRejectsBadConfig(t *testing.T) {
	ok := region.DefaultConfig()
	ok.Region, ok.Regions = "a", []string{"a", "b"}
	ok.RedisAddrs, ok.KafkaBrokers, ok.Listen, ok.Policies = []string{"127.0.0.1:1"}, []string{"127.0.0.1:2"}, "127.0.0.1:0", policies(t)
	for want, mutate := range map[string]func(*region.Config){
		"RedisAddrs":       func(c *region.Config) { c.RedisAddrs = nil },
		"RedisCluster":     func(c *region.Config) { c.RedisCluster, c.RedisAddrs = true, []string{"x:1", "y:2"} },
		"KafkaBrokers":     func(c *region.Config) { c.KafkaBrokers = nil },
		"Policies":         func(c *region.Config) { c.Policies = c.Policies[2:] }, // no global policy left
		"Regions":          func(c *region.Config) { c.Region = "z" },
		"Epoch":            func(c *region.Config) { c.Epoch = time.Microsecond },
		"brokers[0]":       func(c *region.Config) { c.KafkaBrokers = []string{"nohost"} },
		"listen on":        func(c *region.Config) { c.Listen = "256.0.0.1:99999" },
		"ShutdownTimeout":  func(c *region.Config) { c.ShutdownTimeout = -1 },
		"PressureInterval": func(c *region.Config) { c.PressureInterval = -time.Second },
		"TransferTopic":    func(c *region.Config) { c.TransferTopic = c.Topic },
	} {
		c := ok
		mutate(&c)
		_, err := region.New(c)
		require.Error(t, err, want)
		assert.True(t, strings.Contains(err.Error(), want), "%s: %v", want, err)
	}
	c, err := region.New(ok)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	assert.NoError(t, c.Run(ctx), "a cancelled Run stops at once")
	assert.Error(t, c.Run(ctx), "Run twice")
}

func TestGlobalLimits(t *testing.T) {
	limits, skipped := region.GlobalLimits(policies(t), 3)
	assert.Equal(t, 1, skipped, "global fixed window")
	require.Len(t, limits, 1)
	l, ok := limits.Limit("g")
	require.True(t, ok)
	assert.Equal(t, int64(300_000), l.RateMilli)
	assert.Equal(t, 3, l.Regions)
	assert.Equal(t, int64(1000), l.MinCostMilli, "unlisted requests cost 1")
}

// TestNewRefusesBurstBelowOneRequestPerRegion: a global policy whose burst
// cannot give each region one request (2 tokens over 3 regions) is
// refused at start, with the policy and the burst to set in the error.
func TestNewRefusesBurstBelowOneRequestPerRegion(t *testing.T) {
	p, err := limiter.ParsePolicies([]byte(`[{"id":"tiny","algorithm":"token_bucket","rate_per_sec":10,"burst":2,"scope":"global"}]`))
	require.NoError(t, err)
	_, err = region.New(region.Config{Region: "a", Regions: []string{"a", "b", "c"}, RedisAddrs: []string{"127.0.0.1:1"}, KafkaBrokers: []string{"127.0.0.1:1"}, Policies: p})
	require.ErrorIs(t, err, region.ErrConfig)
	assert.ErrorContains(t, err, `global policy "tiny": shares: invalid limit: burst 2 over 3 regions gives each less than one request of cost 1: raise the burst to at least 3`)
}
