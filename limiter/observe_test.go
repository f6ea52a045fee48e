package limiter

import (
	"context"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gatherValue returns the value of the metric name whose labels include
// labels (a counter, gauge or histogram sample count), summed over matching
// series; it fails the test when none matches.
func gatherValue(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	found := false
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			found = true
			sum += metricValue(m)
		}
	}
	require.True(t, found, "no series %s%v", name, labels)
	return sum
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

func TestMetricsLabelsAreBounded(t *testing.T) {
	clock := newManualClock()
	store := newFlakyStore()
	reg := prometheus.NewRegistry()
	l, err := New(Config{Store: store, Clock: clock, Metrics: reg, Breaker: BreakerConfig{MinCalls: 5}}, mustPolicies(t, denyPolicies))
	require.NoError(t, err)
	ctx := context.Background()
	for i := range 5 {
		_, err := l.Check(ctx, Request{Identity: Identity{APIKey: "key-" + string(rune('a'+i))}, Method: "GET", Path: "/secret/path"})
		require.NoError(t, err)
	}
	for range 5 {
		_, err := l.Check(ctx, Request{Identity: Identity{APIKey: "abuser"}, Method: "GET", Path: "/"})
		require.NoError(t, err)
	}
	store.failing.Store(true)
	for range 10 { // 9 successes so far: the 9th failure opens the breaker
		_, err := l.Check(ctx, Request{Identity: Identity{APIKey: "x"}, Method: "GET", Path: "/"})
		require.NoError(t, err)
	}

	assert.Equal(t, 8.0, gatherValue(t, reg, "quotient_limiter_decisions_total", map[string]string{"policy": "tb", "decision": "allowed", "source": "store"}))
	assert.Equal(t, 1.0, gatherValue(t, reg, "quotient_limiter_decisions_total", map[string]string{"policy": "tb", "decision": "rejected", "source": "store"}))
	assert.Equal(t, 1.0, gatherValue(t, reg, "quotient_limiter_deny_cache_hits_total", map[string]string{"policy": "tb"}))
	assert.Equal(t, 9.0, gatherValue(t, reg, "quotient_limiter_store_errors_total", nil))
	assert.Equal(t, 2.0, gatherValue(t, reg, "quotient_limiter_breaker_state", nil), "open")
	assert.Equal(t, 6.0, gatherValue(t, reg, "quotient_limiter_fallback_decisions_total", map[string]string{"policy": "tb", "decision": "allowed"}), "burst 3 x 2")
	assert.Equal(t, 4.0, gatherValue(t, reg, "quotient_limiter_fallback_decisions_total", map[string]string{"policy": "tb", "decision": "rejected"}))
	assert.Equal(t, 20.0, gatherValue(t, reg, "quotient_limiter_check_duration_seconds", nil))

	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				assert.Contains(t, []string{"policy", "decision", "source"}, lp.GetName(), mf.GetName())
				assert.NotContains(t, lp.GetValue(), "key-")
				assert.NotContains(t, lp.GetValue(), "/secret")
			}
		}
	}

	_, err = New(Config{Metrics: reg}, nil)
	require.ErrorContains(t, err, "Metrics", "registering twice on one registry is an error naming the field")
}

type captureSink struct {
	mu     sync.Mutex
	events []Event
}

func (c *captureSink) Emit(e Event) {
	c.mu.Lock()
	c.events = append(c.events, e)
	c.mu.Unlock()
}

func TestEventsAreSampled(t *testing.T) {
	all := &captureSink{}
	l, err := New(Config{Events: all, EventSampleRate: 1}, mustPolicies(t, denyPolicies))
	require.NoError(t, err)
	for range 4 {
		_, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: "k", Tier: "pro"}, Method: "GET", Path: "/p"})
		require.NoError(t, err)
	}
	require.Len(t, all.events, 4)
	e := all.events[3]
	assert.False(t, e.Allowed)
	assert.Equal(t, "/p", e.Path)
	assert.Equal(t, "pro", e.Tier)
	require.Len(t, e.Policies, 3)
	assert.Equal(t, "k:k", e.Policies[0].SubjectKey)

	some := &captureSink{}
	l, err = New(Config{Events: some}, mustPolicies(t, denyPolicies))
	require.NoError(t, err)
	const n = 20_000
	for i := range n {
		_, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: string(rune(i))}, Method: "GET", Path: "/"})
		require.NoError(t, err)
	}
	assert.InDelta(t, n/100, len(some.events), n/100*0.3, "1%% by default")

	none := &captureSink{}
	l, err = New(Config{Events: none, EventSampleRate: -1}, mustPolicies(t, denyPolicies))
	require.NoError(t, err)
	for range 100 {
		_, _ = l.Check(context.Background(), Request{Identity: Identity{APIKey: "k"}, Method: "GET", Path: "/"})
	}
	assert.Empty(t, none.events)
}
