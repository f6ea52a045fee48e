package rebalancer

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/shares"
)

// TestCoreAdopt: a Core that adopts the store's records publishes its first
// collected epoch, claiming exactly the records (the default for keys
// without one), keeps their lifetimes, refreshes a record below the
// default that is about to expire, and smooths nothing away at its first
// epoch.
func TestCoreAdopt(t *testing.T) {
	lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 2}
	cfg := DefaultConfig()
	cfg.Region, cfg.Regions, cfg.Epoch = "a", []string{"a", "b"}, time.Second
	cfg.MaxWait, cfg.ShrinkAtCollect = 400*time.Millisecond, false
	c, err := New(cfg, PolicyMap{"p": lim})
	require.NoError(t, err)

	const e = int64(1_000_000) // the epoch being collected
	now := EpochStart(e+1, cfg.Epoch).Add(300 * time.Millisecond)
	above := Key{PolicyID: "p", Subject: "above"}
	below := Key{PolicyID: "p", Subject: "below"}
	soon := Key{PolicyID: "p", Subject: "soon"}
	idle := Key{PolicyID: "p", Subject: "idle"}
	recs := []ShareRecord{
		{Key: above, Share: shares.Share{RateMilli: 250_000, BurstMilli: 250_000}, ExpireAt: EpochStart(e+4, cfg.Epoch)},
		{Key: below, Share: shares.Share{RateMilli: 50_000, BurstMilli: 50_000}, ExpireAt: EpochStart(e+300, cfg.Epoch)},
		{Key: soon, Share: shares.Share{RateMilli: 60_000, BurstMilli: 60_000}, ExpireAt: EpochStart(e+2, cfg.Epoch)},
		{Key: Key{PolicyID: "gone", Subject: "x"}, Share: shares.Share{RateMilli: 1, BurstMilli: 1}},
	}
	ups, err := c.Adopt(now, recs)
	require.NoError(t, err)
	require.Len(t, ups, 1, "only the record below the default that expires within two epochs is refreshed")
	assert.Equal(t, soon, ups[0].Key)
	assert.Equal(t, recs[2].Share, ups[0].Share)
	assert.True(t, ups[0].ExpireAt.After(recs[2].ExpireAt))
	_, err = c.Adopt(now, recs)
	require.ErrorIs(t, err, ErrAdopt)

	// 200 units in a 1 s epoch: 200,000 milli per second.
	pub, err := c.Collect(now, []Usage{{Key: above, Demand: 200, Admitted: 200}, {Key: idle, Demand: 100, Admitted: 100}})
	require.NoError(t, err)
	require.NotNil(t, pub.Report, "no warm-up: the first epoch is reported")
	assert.Equal(t, e, pub.Report.Epoch)
	assert.Empty(t, pub.Updates)
	got := map[Key]KeyReport{}
	for _, k := range pub.Report.Keys {
		got[k.Key] = k
	}
	assert.Equal(t, recs[0].Share, got[above].Share, "claims the record above the default")
	assert.Equal(t, int64(200_000), got[above].SmoothedDemandMilli, "first epoch: demand taken as is")
	assert.Equal(t, recs[1].Share, got[below].Share)
	assert.Equal(t, recs[2].Share, got[soon].Share)
	assert.Equal(t, lim.Default(), got[idle].Share, "no record: the default")
	_, err = c.Adopt(now, nil)
	require.ErrorIs(t, err, ErrAdopt)

	// The decision (b silent: fallback) writes what changes, with the
	// lifetimes of the record rule; the unchanged record below the default
	// is not rewritten.
	d, err := c.Decide(now.Add(500 * time.Millisecond))
	require.NoError(t, err)
	for _, u := range d.Updates {
		assert.NotEqual(t, below, u.Key, "the unchanged record below the default is not rewritten")
	}

	_, err = New(cfg, PolicyMap{"p": lim})
	require.NoError(t, err)
	c2, _ := New(cfg, PolicyMap{"p": lim})
	_, err = c2.Adopt(now, []ShareRecord{{Key: above}, {Key: above}})
	require.ErrorIs(t, err, ErrAdopt, "a key twice")
	_, err = c2.Adopt(now, []ShareRecord{{Key: above, Share: shares.Share{RateMilli: -1}}})
	require.ErrorIs(t, err, ErrAdopt, "a negative share")
}

// worldRecords reads a region's records from the world's store.
type worldRecords struct {
	w      *world
	region string
}

func (r worldRecords) Records(context.Context) ([]ShareRecord, error) {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	now := time.Now()
	var out []ShareRecord
	for k, rec := range r.w.stores[r.region] {
		if now.Before(rec.expireAt) {
			out = append(out, ShareRecord{Key: k, Share: rec.share, ExpireAt: rec.expireAt})
		}
	}
	return out, nil
}

// TestDriverFenceWarmStart: as TestDriverFenceLeaderChange, but the
// successor adopts the region's records: region a has grown above the
// default when its leader dies; a2 takes over 1.5 epochs later and
// publishes a report for every epoch it claims (no gap beyond the epoch
// the dead leader claimed), while the enforced sum stays within the limit
// at every write and every 50 ms.
func TestDriverFenceWarmStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 2}
		k := Key{PolicyID: "p", Subject: "k"}
		w := newWorld(t, []string{"a", "b"}, lim, []Key{k})
		w.demand = func(r string, _ int64, _ Key) int64 {
			if r == "a" {
				return 260
			}
			return 30
		}
		cfg := driverTestConfig()
		fence := &memFence{}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()

		pubs := &recordingBus{Bus: w.ports["a"]}
		obs := map[string]*observerLog{}
		start := func(name string) (context.CancelFunc, chan error) {
			c := cfg
			c.Region, c.Regions = name[:1], w.regions
			core, err := New(c, PolicyMap{"p": lim})
			require.NoError(t, err)
			obs[name] = &observerLog{}
			dc := DriverConfig{Usage: &fakeSource{w: w, region: c.Region}, Shares: &fakeSink{w: w, region: c.Region}, Bus: w.ports[c.Region], Observer: obs[name]}
			if c.Region == "a" {
				dc.Bus, dc.Fence, dc.Records = &namedBus{pubs, name}, replica{fence, name}, worldRecords{w, "a"}
			}
			d, err := NewDriver(core, dc)
			require.NoError(t, err)
			dctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- d.Run(dctx) }()
			return stop, done
		}
		_, bDone := start("b")
		stopA1, a1Done := start("a1")
		w.watch(12*time.Second, k)
		grown := w.enforced("a", k)
		require.Greater(t, grown.RateMilli, lim.Default().RateMilli, "a grew above the default before its leader dies")
		stopA1()
		assert.ErrorIs(t, <-a1Done, context.Canceled)
		w.watch(1500*time.Millisecond, k)
		stopA2, a2Done := start("a2")
		mean := w.watch(12*time.Second, k)
		assert.Greater(t, mean["a"], lim.Default().RateMilli, "under a2, a stays above the default on average (no needless shrink)")
		stopA2()
		assert.ErrorIs(t, <-a2Done, context.Canceled)
		cancel()
		assert.ErrorIs(t, <-bDone, context.Canceled)

		claims := fence.snapshot()
		by := map[string][]int64{}
		for i, c := range claims {
			by[c.by] = append(by[c.by], c.epoch)
			if i > 0 {
				require.Equal(t, claims[i-1].epoch+1, c.epoch, "claimed epochs are consecutive: %v", claims)
			}
		}
		require.Len(t, by, 2)
		a1Last := by["a1"][len(by["a1"])-1]
		assert.Equal(t, a1Last+1, by["a2"][0], "a2 resumes after a1's last claim")

		pubs.mu.Lock()
		out := append([]claim(nil), pubs.out...)
		pubs.mu.Unlock()
		seen := map[int64]bool{}
		for _, p := range out {
			require.False(t, seen[p.epoch], "epoch %d published twice: %v", p.epoch, out)
			seen[p.epoch] = true
		}
		for _, e := range by["a2"] {
			assert.True(t, seen[e], "epoch %d claimed by a2 is published (warm start: no warm-up)", e)
		}
		first := true
		for _, e := range by["a1"] {
			if e < by["a1"][0]+cfg.WarmupEpochs || e == a1Last {
				continue
			}
			assert.True(t, seen[e], "epoch %d claimed by a1 is published", e)
			first = false
		}
		assert.False(t, first)
		// a2's first decision keeps a above the default: no needless shrink.
		o := obs["a2"]
		o.mu.Lock()
		require.NotEmpty(t, o.collects)
		assert.True(t, o.collects[0].Published)
		o.mu.Unlock()
		assert.Positive(t, w.checks)
		t.Logf("claims by replica %v; %d reports published; a enforced %+v before the kill, %+v at the end", by, len(out), grown, w.enforced("a", k))
	})
}
