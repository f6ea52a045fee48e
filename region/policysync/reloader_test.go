package policysync_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/region/policysync"
)

// TestReloaderKeepsLastGood: a snapshot stored without a notification is
// picked up by the periodic read; a snapshot that does not parse, an older
// one, and Redis down all keep the set in force; the metrics say which
// version is in force.
func TestReloaderKeepsLastGood(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs := redistest.StartServer(t)
	lim, err := limiter.New(limiter.DefaultConfig(), nil)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	r, err := policysync.NewReloader(policysync.ReloaderConfig{Client: rs.Client(), Target: lim, Interval: 50 * time.Millisecond, Metrics: reg})
	require.NoError(t, err)
	go func() { _ = r.Run(ctx) }()

	// Stored behind the Materializer's back: no PUBLISH.
	good := `{"generation":4,"policies":[{"id":"p","version":4,"algorithm":"token_bucket","rate_per_sec":5}],"overrides":[]}`
	require.NoError(t, rs.Client().HSet(ctx, policysync.SnapshotKey, "gen", 4, "doc", good).Err())
	waitUntil(t, 10*time.Second, "periodic reload", func() bool { return r.Generation() == 4 })
	assert.Equal(t, 4.0, gaugeValue(t, r.VersionGauge("p")))

	require.NoError(t, rs.Client().HSet(ctx, policysync.SnapshotKey, "doc", `{"generation":5,"policies":[{"id":"p","algorithm":"warp_drive"}]}`).Err())
	require.ErrorIs(t, r.Load(ctx), policysync.ErrBadSnapshot)
	require.NoError(t, rs.Client().HSet(ctx, policysync.SnapshotKey, "doc", `{"generation":3,"policies":[]}`).Err())
	require.NoError(t, r.Load(ctx))
	rs.Stop()
	require.Error(t, r.Load(ctx))
	assert.Equal(t, int64(4), r.Generation())
	require.Len(t, lim.Policies(), 1)
	assert.Equal(t, int64(4), lim.Policies()[0].Version)
	assert.GreaterOrEqual(t, counterValue(t, r.ReloadCounter("invalid")), 1.0)
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	var m dto.Metric
	require.NoError(t, g.Write(&m))
	return m.GetGauge().GetValue()
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}
