package rebalancer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/shares"
)

func freshCore(t *testing.T, region string, fresh bool) *Core {
	cfg := DefaultConfig()
	cfg.Region, cfg.Regions = region, []string{"eu", "us"}
	c, err := New(cfg, PolicyMap{"api": {RateMilli: 2_000_000, BurstMilli: 4_000_000, Regions: 2}})
	require.NoError(t, err)
	if fresh {
		require.NoError(t, c.StartFresh())
	}
	return c
}

var freshKey = Key{PolicyID: "api", Subject: "k"}

// A Core told it starts fresh publishes its first epoch's report (wanting
// nothing: it is in fallback until the others hear it) and writes its
// first decision; a cold Core does neither for WarmupEpochs.
func TestStartFreshSkipsTheWarmup(t *testing.T) {
	e0 := EpochOf(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), 10*time.Second)
	at := func(e int64) time.Time { return EpochStart(e+1, 10*time.Second).Add(time.Second) }
	usage := []Usage{{Key: freshKey, Demand: 30_000, Admitted: 10_000}} // 3000/s of a 2000/s limit
	for _, fresh := range []bool{false, true} {
		c := freshCore(t, "eu", fresh)
		pub, err := c.Collect(at(e0), usage)
		require.NoError(t, err)
		d, err := c.Decide(at(e0).Add(3 * time.Second))
		require.NoError(t, err)
		assert.Equal(t, shares.Fallback, d.Mode, "fresh=%v: in fallback until the others hear it", fresh)
		if !fresh {
			assert.Nil(t, pub.Report, "a cold Core warms up: no report")
			assert.Empty(t, d.Updates, "a cold Core warms up: no write")
			continue
		}
		require.NotNil(t, pub.Report, "a fresh Core reports its first epoch")
		require.Len(t, pub.Report.Keys, 1)
		assert.Equal(t, shares.Share{}, pub.Report.Keys[0].Want, "its first report wants nothing")
		assert.Equal(t, e0, pub.Report.Started)
		assert.NotEmpty(t, d.Updates, "a fresh Core writes each key once")
		assert.True(t, c.Fresh())
	}
	c := freshCore(t, "eu", false)
	_, err := c.Collect(at(e0), nil)
	require.NoError(t, err)
	assert.ErrorIs(t, c.StartFresh(), ErrStartFresh, "too late after the first Collect")
}

// A fresh Core that sees a report of its own region it did not publish
// (another Core's) warms up as if it had started after both: no report
// and no write for WarmupEpochs; its own reports coming back change
// nothing.
func TestStartFreshRevokedByAnotherCoresReport(t *testing.T) {
	const epoch = 10 * time.Second
	e0 := EpochOf(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), epoch)
	at := func(e int64) time.Time { return EpochStart(e+1, epoch).Add(time.Second) }
	usage := []Usage{{Key: freshKey, Demand: 500, Admitted: 500}}
	c := freshCore(t, "eu", true)
	var mine []*Report
	for e := e0; e < e0+3; e++ {
		pub, err := c.Collect(at(e), usage)
		require.NoError(t, err)
		require.NotNil(t, pub.Report)
		mine = append(mine, pub.Report)
		_, err = c.Decide(at(e).Add(3 * time.Second))
		require.NoError(t, err)
	}
	for _, r := range mine {
		rc, err := c.Receive(r)
		require.NoError(t, err)
		assert.Equal(t, Own, rc)
	}
	require.True(t, c.Fresh(), "its own reports do not revoke")
	// A stale leader's report (another Started) of the epoch before.
	other := &Report{Region: "eu", Epoch: e0 + 1, Seq: e0 + 1, Started: e0 - 40}
	rc, err := c.Receive(other)
	require.NoError(t, err)
	assert.Equal(t, Own, rc)
	assert.False(t, c.Fresh())
	assert.Equal(t, int64(1), c.Stats().FreshRevoked)
	w := c.Config().WarmupEpochs
	// Warm-up from the epoch after its own last report (e0+2).
	for e := e0 + 3; e < e0+3+w; e++ {
		pub, err := c.Collect(at(e), usage)
		require.NoError(t, err)
		assert.Nil(t, pub.Report, "epoch %d: warming up again", e)
		assert.Empty(t, pub.Updates)
		d, err := c.Decide(at(e).Add(3 * time.Second))
		require.NoError(t, err)
		assert.Empty(t, d.Updates, "epoch %d: no write while warming up", e)
		assert.Equal(t, shares.Fallback, d.Mode)
	}
	pub, err := c.Collect(at(e0+3+w), usage)
	require.NoError(t, err)
	require.NotNil(t, pub.Report)
	require.Len(t, pub.Report.Keys, 1)
	assert.Equal(t, shares.Share{RateMilli: 1_000_000, BurstMilli: 2_000_000}, pub.Report.Keys[0].Share, "it claims the default again, as a new Core")

	// Not started yet: a report of its region makes it warm up as usual.
	c = freshCore(t, "eu", true)
	_, err = c.Receive(&Report{Region: "eu", Epoch: e0 - 3, Seq: e0 - 3, Started: e0 - 50})
	require.NoError(t, err)
	pub, err = c.Collect(at(e0), usage)
	require.NoError(t, err)
	assert.Nil(t, pub.Report)
}

// fakeHistory answers Published from the times at which each region's
// reports were published.
type fakeHistory struct {
	mu    sync.Mutex
	at    map[string][]time.Time
	err   error
	since []time.Time
}

func (h *fakeHistory) Published(_ context.Context, region string, since time.Time) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.since = append(h.since, since)
	if h.err != nil {
		return false, h.err
	}
	for _, t := range h.at[region] {
		if !t.Before(since) {
			return true, nil
		}
	}
	return false, nil
}

// The driver skips the warm-up only when the bus shows no report of its
// region in the span: eu reported 3 epochs before the start (a restart)
// and warms up; us reported FirstStartEpochs+2 epochs before (an outage
// long enough) and starts fresh; ap cannot read the history and warms up.
func TestDriverFirstStartFromHistory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := driverTestConfig()
		lim := shares.Limit{RateMilli: 300_000, BurstMilli: 600_000, Regions: 3}
		keys := []Key{{PolicyID: "p", Subject: "k:a"}}
		w := newWorld(t, []string{"ap", "eu", "us"}, lim, keys)
		w.demand = func(string, int64, Key) int64 { return 100 }
		now := time.Now()
		span := time.Duration(FirstStartEpochs(cfg)) * cfg.Epoch
		hist := &fakeHistory{at: map[string][]time.Time{
			"eu": {now.Add(-3 * cfg.Epoch)},
			"us": {now.Add(-span - 2*cfg.Epoch)},
		}}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		drivers := map[string]*Driver{}
		obs := map[string]*observerLog{}
		for _, name := range w.regions {
			c := cfg
			c.Region, c.Regions = name, w.regions
			core, err := New(c, PolicyMap{"p": lim})
			require.NoError(t, err)
			var h ReportHistory = hist
			if name == "ap" {
				h = &fakeHistory{err: errors.New("fake: topic unreadable")}
			}
			obs[name] = &observerLog{}
			d, err := NewDriver(core, DriverConfig{Usage: &fakeSource{w: w, region: name}, Shares: &fakeSink{w: w, region: name}, Bus: w.ports[name], Observer: obs[name], History: h})
			require.NoError(t, err)
			drivers[name] = d
			go func() { assert.ErrorIs(t, d.Run(ctx), context.Canceled) }()
		}
		time.Sleep(2*cfg.Epoch + cfg.Epoch/2)
		synctest.Wait()
		assert.False(t, drivers["eu"].core.Fresh(), "eu reported within the span")
		assert.True(t, drivers["us"].core.Fresh(), "us did not")
		assert.False(t, drivers["ap"].core.Fresh(), "ap cannot tell")
		hist.mu.Lock()
		f := EpochOf(now, cfg.Epoch)
		for _, s := range hist.since {
			assert.Equal(t, EpochStart(f-FirstStartEpochs(cfg)-1, cfg.Epoch), s, "the span starts FirstStartEpochs before the first epoch, one epoch earlier for clock skew")
		}
		hist.mu.Unlock()
		for name, o := range obs {
			o.mu.Lock()
			require.NotEmpty(t, o.collects, name)
			assert.Equal(t, name == "us", o.collects[0].Published, "%s: first epoch published", name)
			o.mu.Unlock()
		}
		cancel()
	})
}
