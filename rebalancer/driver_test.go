package rebalancer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/shares"
)

// The driver tests run three Drivers in a synctest bubble (virtual time,
// the system clock is the bubble's) over an in-memory bus that loses,
// duplicates, delays and reorders reports, with in-memory stores whose
// records expire like Redis keys. The world checks after every write and
// every 50 ms that the shares all regions enforce sum to at most L and B.

var _ Bus = (*chaosPort)(nil)
var _ UsageSource = (*fakeSource)(nil)
var _ ShareSink = (*fakeSink)(nil)

type world struct {
	t       *testing.T
	lim     shares.Limit
	keys    []Key
	regions []string

	mu     sync.Mutex
	stores map[string]map[Key]record // by region
	checks int
	cut    map[string]bool // regions whose bus link is cut

	// bus behaviour
	r                      *rand.Rand
	loss, dup              float64
	maxDelay               time.Duration
	minDelay               time.Duration // added to every delivery's delay
	ackDelay               time.Duration // a report's publication returns after it (set before the drivers run)
	ports                  map[string]*chaosPort
	writeFail              map[string]bool
	demand                 func(region string, epoch int64, k Key) int64
	published, delivered   int
	duplicated, lostReport int
}

func newWorld(t *testing.T, regions []string, lim shares.Limit, keys []Key) *world {
	w := &world{
		t: t, lim: lim, keys: keys, regions: regions,
		stores: map[string]map[Key]record{}, cut: map[string]bool{},
		r: rand.New(rand.NewPCG(7, 11)), ports: map[string]*chaosPort{}, writeFail: map[string]bool{},
	}
	for _, r := range regions {
		w.stores[r] = map[Key]record{}
		w.ports[r] = &chaosPort{w: w, region: r, inbox: make(chan *Report, 1024)}
	}
	return w
}

func (w *world) enforcedLocked(region string, k Key, t time.Time) shares.Share {
	if rec, ok := w.stores[region][k]; ok && t.Before(rec.expireAt) {
		return rec.share
	}
	return w.lim.Default()
}

// check asserts the safety invariant now.
func (w *world) checkLocked(now time.Time) {
	w.checks++
	for _, k := range w.keys {
		var sum shares.Share
		for _, r := range w.regions {
			s := w.enforcedLocked(r, k, now)
			sum.RateMilli += s.RateMilli
			sum.BurstMilli += s.BurstMilli
		}
		if sum.RateMilli > w.lim.RateMilli || sum.BurstMilli > w.lim.BurstMilli {
			w.t.Errorf("at %v key %v: enforced sum %+v exceeds %+v", now, k, sum, w.lim)
		}
	}
}

func (w *world) enforced(region string, k Key) shares.Share {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.enforcedLocked(region, k, time.Now())
}

type chaosPort struct {
	w      *world
	region string
	inbox  chan *Report
}

func cloneReport(r *Report) *Report {
	c := *r
	c.Heard = slices.Clone(r.Heard)
	c.Keys = slices.Clone(r.Keys)
	return &c
}

func (p *chaosPort) Publish(ctx context.Context, r *Report) error {
	p.deliver(r)
	return awaitAck(ctx, p.w.ackDelay) // delivered, then acknowledged
}

// awaitAck waits d (a publication's acknowledgement), or fails with ctx's
// error when it ends first.
func awaitAck(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *chaosPort) deliver(r *Report) {
	w := p.w
	w.mu.Lock()
	defer w.mu.Unlock()
	w.published++
	for _, to := range w.regions {
		if w.cut[p.region] || w.cut[to] {
			continue
		}
		copies := 1
		if to != p.region {
			if w.r.Float64() < w.loss {
				w.lostReport++
				continue
			}
			if w.r.Float64() < w.dup {
				w.duplicated++
				copies = 2
			}
		}
		for range copies {
			delay := w.minDelay
			if w.maxDelay > 0 {
				delay += time.Duration(w.r.Int64N(int64(w.maxDelay)))
			}
			c, inbox := cloneReport(r), w.ports[to].inbox
			time.AfterFunc(delay, func() {
				select {
				case inbox <- c:
				default:
					w.t.Errorf("inbox of %s full", to)
				}
			})
		}
	}
}

func (p *chaosPort) Receive(ctx context.Context) (*Report, error) {
	select {
	case r := <-p.inbox:
		p.w.mu.Lock()
		p.w.delivered++
		p.w.mu.Unlock()
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type fakeSource struct {
	w      *world
	region string
	fail   bool
	drop   bool // the gateways dropped every count: no usage, marked incomplete
}

func (s *fakeSource) Usage(_ context.Context, epoch int64) ([]Usage, error) {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	if s.fail {
		return nil, errors.New("fake: usage unavailable")
	}
	if s.drop {
		return nil, fmt.Errorf("%w: fake: gateways dropped usage of epoch %d", ErrUsageIncomplete, epoch)
	}
	var out []Usage
	for _, k := range s.w.keys {
		if d := s.w.demand(s.region, epoch, k); d > 0 {
			out = append(out, Usage{Key: k, Demand: d, Admitted: d / 2})
		}
	}
	return out, nil
}

type fakeSink struct {
	w      *world
	region string
	writes int
}

func (s *fakeSink) Write(_ context.Context, ups []Update) error {
	w := s.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.writeFail[s.region] {
		return errors.New("fake: store unavailable")
	}
	now := time.Now()
	st := w.stores[s.region]
	for _, u := range ups {
		if u.Delete {
			delete(st, u.Key)
			continue
		}
		st[u.Key] = record{share: u.Share, expireAt: u.ExpireAt}
	}
	s.writes++
	w.checkLocked(now)
	return nil
}

// observerLog records decisions per region.
type observerLog struct {
	mu        sync.Mutex
	decisions []DecideInfo
	collects  []CollectInfo
	receipts  map[Receipt]int
}

func (o *observerLog) Collected(c CollectInfo) {
	o.mu.Lock()
	o.collects = append(o.collects, c)
	o.mu.Unlock()
}

func (o *observerLog) Decided(d DecideInfo) {
	o.mu.Lock()
	d.Decision.Updates = nil
	o.decisions = append(o.decisions, d)
	o.mu.Unlock()
}

func (o *observerLog) Received(r ReceiveInfo) {
	o.mu.Lock()
	if o.receipts == nil {
		o.receipts = map[Receipt]int{}
	}
	o.receipts[r.Receipt]++
	o.mu.Unlock()
}

func (o *observerLog) modes() map[shares.Mode]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := map[shares.Mode]int{}
	for _, d := range o.decisions {
		m[d.Decision.Mode]++
	}
	return m
}

type testRegion struct {
	name   string
	driver *Driver
	obs    *observerLog
	source *fakeSource
	sink   *fakeSink
}

func startRegions(t *testing.T, ctx context.Context, w *world, cfg Config) []*testRegion {
	var out []*testRegion
	policies := PolicyMap{"p": w.lim}
	for _, name := range w.regions {
		c := cfg
		c.Region, c.Regions = name, w.regions
		core, err := New(c, policies)
		require.NoError(t, err)
		tr := &testRegion{name: name, obs: &observerLog{}, source: &fakeSource{w: w, region: name}, sink: &fakeSink{w: w, region: name}}
		tr.driver, err = NewDriver(core, DriverConfig{Usage: tr.source, Shares: tr.sink, Bus: w.ports[name], Observer: tr.obs})
		require.NoError(t, err)
		out = append(out, tr)
		go func() { assert.ErrorIs(t, tr.driver.Run(ctx), context.Canceled) }()
	}
	return out
}

// watch checks the invariant every 50 ms of virtual time until d passes,
// and returns the mean rate share each region enforced for key k meanwhile.
func (w *world) watch(d time.Duration, k Key) map[string]int64 {
	end := time.Now().Add(d)
	sums, n := map[string]int64{}, int64(0)
	for time.Now().Before(end) {
		time.Sleep(50 * time.Millisecond) // virtual time: advances the bubble's clock
		w.mu.Lock()
		now := time.Now()
		w.checkLocked(now)
		for _, r := range w.regions {
			sums[r] += w.enforcedLocked(r, k, now).RateMilli
		}
		n++
		w.mu.Unlock()
	}
	for r := range sums {
		sums[r] /= n
	}
	return sums
}

func driverTestConfig() Config {
	cfg := DefaultConfig()
	cfg.Epoch = time.Second
	cfg.MaxWait = 400 * time.Millisecond
	// The timelines of the driver tests count a warm-up of K+1 epochs (see
	// testConfig).
	cfg.WarmupEpochs = cfg.SilenceEpochs + 1
	return cfg
}

// TestDriverChaosKeepsSumWithinLimit: reports lost, duplicated and delayed
// (so late, and with long delays reordered) between three regions with
// skewed demand; the enforced sum never exceeds the limit. With moderate
// chaos the busy region's share grows; with delays beyond an epoch the
// regions mostly fall back (a region that hears another only late cannot
// tell it from a cut link), which is safe, not accurate.
func TestDriverChaosKeepsSumWithinLimit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		loss, dup float64
		maxDelay  time.Duration
		grows     bool
	}{
		{"moderate", 0.1, 0.2, 600 * time.Millisecond, true},
		{"reordering", 0.3, 0.3, 2500 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lim := shares.Limit{RateMilli: 300_000, BurstMilli: 600_000, Regions: 3}
				keys := []Key{{PolicyID: "p", Subject: "k:a"}, {PolicyID: "p", Subject: "k:b"}}
				w := newWorld(t, []string{"eu", "us", "ap"}, lim, keys)
				w.loss, w.dup, w.maxDelay = tc.loss, tc.dup, tc.maxDelay
				w.demand = func(region string, epoch int64, k Key) int64 {
					switch {
					case region == "us" && k.Subject == "k:a":
						return 500
					case region == "eu":
						return 50
					}
					return 5
				}
				ctx, cancel := context.WithCancel(t.Context())
				regs := startRegions(t, ctx, w, driverTestConfig())
				w.watch(20*time.Second, keys[0]) // warm-up and convergence
				mean := w.watch(60*time.Second, keys[0])
				t.Logf("mean rate shares of %v: %v", keys[0], mean)
				cancel()
				synctest.Wait()

				w.mu.Lock()
				defer w.mu.Unlock()
				assert.Positive(t, w.duplicated)
				assert.Positive(t, w.lostReport)
				assert.Greater(t, w.checks, 1000)
				stale := 0
				for _, r := range regs {
					m := r.obs.modes()
					t.Logf("%s: modes %v receipts %v", r.name, m, r.obs.receipts)
					assert.Positive(t, r.obs.receipts[Duplicate], "region %s saw no duplicate", r.name)
					stale += r.obs.receipts[Stale]
					assert.False(t, r.driver.Status().Running)
					if tc.grows {
						assert.Positive(t, m[shares.Grow], "region %s never grew: %v", r.name, m)
					}
				}
				if tc.grows {
					assert.Greater(t, mean["us"], lim.Default().RateMilli*5/4, "the busy region's share grew")
					assert.Less(t, mean["ap"], lim.Default().RateMilli, "the idle region's share shrank")
				} else {
					assert.Positive(t, stale, "reports arrived out of order")
				}
			})
		})
	}
}

// TestDriverCutRegionFallsBack: a region cut off from the bus falls back
// and the others assume it at the default; the sum stays within L through
// the cut and the heal, and growth resumes after the heal.
func TestDriverCutRegionFallsBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 3}
		keys := []Key{{PolicyID: "p", Subject: "k:a"}}
		w := newWorld(t, []string{"eu", "us", "ap"}, lim, keys)
		w.demand = func(region string, epoch int64, k Key) int64 {
			if region == "ap" {
				return 1000
			}
			return 10
		}
		ctx, cancel := context.WithCancel(t.Context())
		regs := startRegions(t, ctx, w, driverTestConfig())
		w.watch(15*time.Second, keys[0])
		require.Greater(t, w.enforced("ap", keys[0]).RateMilli, lim.Default().RateMilli)

		w.mu.Lock()
		w.cut["ap"] = true
		w.mu.Unlock()
		w.watch(10*time.Second, keys[0])
		assert.LessOrEqual(t, w.enforced("ap", keys[0]).RateMilli, lim.Default().RateMilli, "cut region fell back")

		w.mu.Lock()
		w.cut["ap"] = false
		w.mu.Unlock()
		w.watch(15*time.Second, keys[0])
		assert.Greater(t, w.enforced("ap", keys[0]).RateMilli, lim.Default().RateMilli, "growth resumed after the heal")
		cancel()
		synctest.Wait()
		assert.Positive(t, regs[2].obs.modes()[shares.Fallback])
	})
}

// TestDriverWriteFailureStopsPublishing: while a region's share writes fail
// it publishes nothing (its report would claim shares its store does not
// hold); once writes succeed it publishes again.
func TestDriverWriteFailureStopsPublishing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 3}
		keys := []Key{{PolicyID: "p", Subject: "k:a"}}
		w := newWorld(t, []string{"eu", "us", "ap"}, lim, keys)
		w.demand = func(region string, epoch int64, k Key) int64 {
			if region == "eu" {
				return 1000
			}
			return 10
		}
		ctx, cancel := context.WithCancel(t.Context())
		regs := startRegions(t, ctx, w, driverTestConfig())
		w.watch(12*time.Second, keys[0])
		eu := regs[0]
		require.Greater(t, w.enforced("eu", keys[0]).RateMilli, lim.Default().RateMilli)

		w.mu.Lock()
		w.writeFail["eu"] = true
		// Demand moves away, so eu's next decisions shrink (and must be written).
		w.demand = func(region string, epoch int64, k Key) int64 {
			if region == "us" {
				return 1000
			}
			return 0
		}
		w.mu.Unlock()
		w.watch(6*time.Second, keys[0])
		st := eu.driver.Status()
		assert.Positive(t, st.Unwritten)
		assert.Error(t, st.LastWriteError)
		eu.obs.mu.Lock()
		last := eu.obs.collects[len(eu.obs.collects)-1]
		eu.obs.mu.Unlock()
		assert.False(t, last.Published)
		assert.ErrorContains(t, last.PublishErr, "share updates unwritten")

		w.mu.Lock()
		w.writeFail["eu"] = false
		w.mu.Unlock()
		w.watch(6*time.Second, keys[0])
		st = eu.driver.Status()
		assert.Zero(t, st.Unwritten)
		assert.NoError(t, st.LastWriteError)
		eu.obs.mu.Lock()
		last = eu.obs.collects[len(eu.obs.collects)-1]
		eu.obs.mu.Unlock()
		assert.True(t, last.Published)
		cancel()
		synctest.Wait()
	})
}

// TestDriverUsageFailureCollectsNothing: a failing usage source makes the
// region report no usage (its share can only shrink), not stall.
func TestDriverUsageFailureCollectsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 3}
		keys := []Key{{PolicyID: "p", Subject: "k:a"}}
		w := newWorld(t, []string{"eu", "us", "ap"}, lim, keys)
		w.demand = func(string, int64, Key) int64 { return 100 }
		ctx, cancel := context.WithCancel(t.Context())
		regs := startRegions(t, ctx, w, driverTestConfig())
		w.mu.Lock()
		regs[1].source.fail = true
		w.mu.Unlock()
		w.watch(8*time.Second, keys[0])
		cancel()
		synctest.Wait()
		obs := regs[1].obs
		require.NotEmpty(t, obs.collects)
		for _, c := range obs.collects {
			assert.Error(t, c.UsageErr)
			assert.Zero(t, c.UsageKeys)
		}
		assert.NotEmpty(t, obs.decisions, "decisions continue")
	})
}

func TestNewDriverRejectsBadConfig(t *testing.T) {
	core, err := New(Config{Region: "a", Regions: []string{"a"}}, PolicyMap{})
	require.NoError(t, err)
	w := newWorld(t, []string{"a"}, shares.Limit{RateMilli: 1, Regions: 1}, nil)
	ok := DriverConfig{Usage: &fakeSource{w: w}, Shares: &fakeSink{w: w}, Bus: w.ports["a"]}
	for name, mutate := range map[string]func(*DriverConfig){
		"Usage":         func(c *DriverConfig) { c.Usage = nil },
		"Shares":        func(c *DriverConfig) { c.Shares = nil },
		"Bus":           func(c *DriverConfig) { c.Bus = nil },
		"CollectDelay":  func(c *DriverConfig) { c.CollectDelay = 5 * time.Second },
		"IOTimeout":     func(c *DriverConfig) { c.IOTimeout = -1 },
		"RetryInterval": func(c *DriverConfig) { c.RetryInterval = -1 },
	} {
		c := ok
		mutate(&c)
		_, err := NewDriver(core, c)
		assert.ErrorIs(t, err, ErrConfig, name)
		assert.ErrorContains(t, err, name)
	}
	_, err = NewDriver(nil, ok)
	assert.ErrorIs(t, err, ErrConfig)
	d, err := NewDriver(core, ok)
	require.NoError(t, err)
	assert.False(t, d.Status().Running)
}

// TestDriverRefusesFarFutureReport: one report of epoch 2^40 (corrupt, or
// from a clock far outside the skew the protocol assumes) is refused and
// counted as Future; the region goes on deciding with growth instead of
// staying in fallback for good (the report would have been the sender's
// latest forever, so its real reports never counted as heard).
func TestDriverRefusesFarFutureReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 3}
		keys := []Key{{PolicyID: "p", Subject: "k:a"}}
		w := newWorld(t, []string{"eu", "us", "ap"}, lim, keys)
		w.demand = func(region string, _ int64, _ Key) int64 {
			if region == "eu" {
				return 250
			}
			return 0
		}
		ctx, cancel := context.WithCancel(t.Context())
		regs := startRegions(t, ctx, w, driverTestConfig())
		w.ports["eu"].inbox <- &Report{Region: "us", Epoch: 1 << 40, Seq: 1 << 40, Heard: []Heard{{Region: "us", Epoch: 1 << 40}}}
		w.watch(14*time.Second, keys[0])
		cancel()
		synctest.Wait()
		eu := regs[0].obs
		eu.mu.Lock()
		defer eu.mu.Unlock()
		assert.Equal(t, 1, eu.receipts[Future], "the far-future report is refused and counted")
		require.NotEmpty(t, eu.decisions)
		var grows int
		for _, d := range eu.decisions[len(eu.decisions)-3:] {
			if d.Decision.Mode == shares.Grow {
				grows++
			}
		}
		assert.Equal(t, 3, grows, "eu's last three decisions grow (not in fallback): %+v", eu.decisions[len(eu.decisions)-3:])
		assert.Equal(t, int64(1), regs[0].driver.core.Stats().Future)
	})
}

// TestDriverUsageFailureHoldsDemand: a busy region whose usage reads fail
// keeps its share and its smoothed demand (both are unknown, not zero)
// while the reads fail; the enforced sum stays within the limit.
func TestDriverUsageFailureHoldsDemand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 3}
		keys := []Key{{PolicyID: "p", Subject: "k:a"}}
		w := newWorld(t, []string{"eu", "us", "ap"}, lim, keys)
		w.demand = func(region string, _ int64, _ Key) int64 {
			if region == "eu" {
				return 250
			}
			return 0
		}
		ctx, cancel := context.WithCancel(t.Context())
		regs := startRegions(t, ctx, w, driverTestConfig())
		w.watch(14*time.Second, keys[0])
		before := w.enforced("eu", keys[0])
		require.Greater(t, before.RateMilli, 2*lim.Default().RateMilli, "eu grew into the others' shares")
		w.mu.Lock()
		regs[0].source.fail = true
		w.mu.Unlock()
		// Every 50 ms through four failed collections: eu keeps its share
		// (the last decisions may still move it by rounding dust as the
		// views converge; before holding, a failed read cut it to the
		// floor, 1.5% of the default).
		end := time.Now().Add(4 * time.Second)
		for time.Now().Before(end) {
			time.Sleep(50 * time.Millisecond)
			got := w.enforced("eu", keys[0])
			assert.InDelta(t, before.RateMilli, got.RateMilli, float64(lim.RateMilli/1000), "eu's share while its reads fail")
		}
		cancel()
		synctest.Wait()
		obs := regs[0].obs
		obs.mu.Lock()
		defer obs.mu.Unlock()
		last := obs.collects[len(obs.collects)-1]
		assert.True(t, last.UsageUnknown)
		assert.Error(t, last.UsageErr)
		assert.GreaterOrEqual(t, last.CoreStats.UnknownUsage, int64(3))
	})
}

// TestDriverIncompleteUsageHoldsShare: a busy region whose gateways drop
// their usage (their key bound, marked incomplete) keeps its share while
// it lasts, and the driver says so (CollectInfo.UsageIncomplete, no
// usage_read error); the enforced sum stays within the limit.
func TestDriverIncompleteUsageHoldsShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 3}
		keys := []Key{{PolicyID: "p", Subject: "k:a"}}
		w := newWorld(t, []string{"eu", "us", "ap"}, lim, keys)
		w.demand = func(region string, _ int64, _ Key) int64 {
			if region == "eu" {
				return 250
			}
			return 0
		}
		ctx, cancel := context.WithCancel(t.Context())
		regs := startRegions(t, ctx, w, driverTestConfig())
		w.watch(14*time.Second, keys[0])
		before := w.enforced("eu", keys[0])
		require.Greater(t, before.RateMilli, 2*lim.Default().RateMilli, "eu grew into the others' shares")
		w.mu.Lock()
		regs[0].source.drop = true
		w.mu.Unlock()
		end := time.Now().Add(4 * time.Second)
		for time.Now().Before(end) {
			time.Sleep(50 * time.Millisecond)
			got := w.enforced("eu", keys[0])
			assert.GreaterOrEqual(t, got.RateMilli, before.RateMilli-lim.RateMilli/1000, "eu's share while its usage is dropped")
		}
		cancel()
		synctest.Wait()
		obs := regs[0].obs
		obs.mu.Lock()
		defer obs.mu.Unlock()
		last := obs.collects[len(obs.collects)-1]
		assert.True(t, last.UsageIncomplete)
		assert.False(t, last.UsageUnknown)
		assert.ErrorIs(t, last.UsageErr, ErrUsageIncomplete)
		assert.GreaterOrEqual(t, last.CoreStats.IncompleteUsage, int64(3))
		assert.Zero(t, last.CoreStats.UnknownUsage)
	})
}

// TestDriverLateReportsStillGrow: every report arrives 300-400 ms after it
// is published, so after MaxWait (400 ms after the epoch; the driver
// publishes 200 ms after it). Each decision holds at the deadline and the
// epoch is decided again, with growth, when the last report lands: the
// busy region takes most of the limit and the enforced sum stays within
// it. (Before, every decision held and the busy region stayed at the
// default.)
func TestDriverLateReportsStillGrow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 3}
		keys := []Key{{PolicyID: "p", Subject: "k:a"}}
		w := newWorld(t, []string{"eu", "us", "ap"}, lim, keys)
		w.minDelay, w.maxDelay = 300*time.Millisecond, 100*time.Millisecond
		w.demand = func(region string, _ int64, _ Key) int64 {
			if region == "eu" {
				return 250
			}
			return 0
		}
		ctx, cancel := context.WithCancel(t.Context())
		regs := startRegions(t, ctx, w, driverTestConfig())
		w.watch(14*time.Second, keys[0])
		mean := w.watch(4*time.Second, keys[0])
		cancel()
		synctest.Wait()
		assert.Greater(t, mean["eu"], 2*lim.Default().RateMilli, "eu grew: %v", mean)
		obs := regs[0].obs
		obs.mu.Lock()
		defer obs.mu.Unlock()
		var again, grow int
		for _, d := range obs.decisions {
			if d.Decision.Again {
				again++
			}
			if d.Decision.Mode == shares.Grow {
				grow++
			}
		}
		assert.Positive(t, again)
		assert.Equal(t, grow, again, "every growth was a second decision")
	})
}
