package rebalancer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
	"github.com/quotientlabs/quotient/rebalancer/redisio"
	"github.com/quotientlabs/quotient/shares"
)

// The three-region test runs, on loopback: three redis-servers, one kfake
// broker, three coordinators (Core + Driver + redisio + kafkabus), and per
// region a gateway as a library caller (limiter.Limiter on the region's
// Redis with a UsageFlusher) driving demand for keys with a global limit.
// Epochs are 1 s. Every wait is bounded by a deadline.

const e2eEpoch = time.Second

// e2eUsageShards is the usage hashes per epoch of the end-to-end tests'
// gateways and coordinators: about their keys over 64, as the packed
// layout wants (limiter.RedisUsageSink), not the default 16,384, which
// costs a collection 64 round trips however few keys there are.
const e2eUsageShards = 4

// cuttable is a rebalancer.Bus that can be cut off (reports neither leave
// nor arrive) and can publish every report twice (duplicates on Kafka).
type cuttable struct {
	inner rebalancer.Bus
	cut   atomic.Bool
	twice bool
}

func (c *cuttable) Publish(ctx context.Context, r *rebalancer.Report) error {
	if c.cut.Load() {
		return nil // lost on the way
	}
	if err := c.inner.Publish(ctx, r); err != nil {
		return err
	}
	if c.twice {
		return c.inner.Publish(ctx, r)
	}
	return nil
}

func (c *cuttable) Receive(ctx context.Context) (*rebalancer.Report, error) {
	for {
		r, err := c.inner.Receive(ctx)
		if err != nil || !c.cut.Load() {
			return r, err
		}
	}
}

type e2eRegion struct {
	name    string
	redis   *redis.Client
	bus     *cuttable
	lim     *limiter.Limiter
	driver  *rebalancer.Driver
	decided atomic.Int64 // decisions made
}

type e2eObserver struct{ r *e2eRegion }

func (o e2eObserver) Collected(rebalancer.CollectInfo) {}
func (o e2eObserver) Decided(rebalancer.DecideInfo)    { o.r.decided.Add(1) }
func (o e2eObserver) Received(rebalancer.ReceiveInfo)  {}

type e2e struct {
	t        *testing.T
	ctx      context.Context
	policy   *limiter.Policy
	limit    shares.Limit
	regions  []*e2eRegion
	subjects []limiter.Subject

	mu     sync.Mutex
	demand map[string]int      // region -> requests per 10 ms tick for subjects[0]
	perSec map[int64]*[2]int64 // unix second -> demand, admitted (subjects[0], all regions)
	regSec map[string]map[int64]int64
}

func startE2E(t *testing.T) *e2e {
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	brokers := kc.ListenAddrs()

	pols, err := limiter.ParsePolicies([]byte(`[{"id":"g","algorithm":"token_bucket","rate_per_sec":300,"burst":300,"scope":"global"}]`))
	require.NoError(t, err)
	e := &e2e{
		t: t, ctx: ctx, policy: pols[0],
		limit:    shares.Limit{RateMilli: pols[0].RateMilli(), BurstMilli: pols[0].BurstMilli(), Regions: 3},
		subjects: []limiter.Subject{{Kind: limiter.SubjectAPIKey, Value: "hot"}, {Kind: limiter.SubjectAPIKey, Value: "warm"}},
		demand:   map[string]int{}, perSec: map[int64]*[2]int64{}, regSec: map[string]map[int64]int64{},
	}
	names := []string{"ap", "eu", "us"}
	var wg sync.WaitGroup
	var starts []func()
	for _, name := range names {
		srv := redistest.StartServer(t)
		client := srv.Client()
		r := &e2eRegion{name: name, redis: client}
		e.regions = append(e.regions, r)

		cl, err := kafkautil.New(kafkautil.DefaultConfig(brokers...))
		require.NoError(t, err)
		bcfg := kafkabus.DefaultConfig()
		bcfg.TopicPollInterval = 100 * time.Millisecond
		bcfg.Lookback = 10 * e2eEpoch
		bus, err := kafkabus.New(cl, bcfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = bus.Close(); _ = cl.Close() })
		ad, err := kafkabus.NewAdapter(bus, e2eEpoch, nil)
		require.NoError(t, err)
		r.bus = &cuttable{inner: ad, twice: name == "eu"}

		cfg := rebalancer.DefaultConfig()
		cfg.Region, cfg.Regions, cfg.Epoch, cfg.MaxWait = name, names, e2eEpoch, 500*time.Millisecond
		core, err := rebalancer.New(cfg, rebalancer.PolicyMap{"g": e.limit})
		require.NoError(t, err)
		r.driver, err = rebalancer.NewDriver(core, rebalancer.DriverConfig{
			Usage: redisio.NewSource(client, e2eUsageShards), Shares: redisio.NewSink(client, 0), Bus: r.bus,
			CollectDelay: 250 * time.Millisecond, Observer: e2eObserver{r},
		})
		require.NoError(t, err)

		lcfg := limiter.DefaultConfig()
		lcfg.Store, lcfg.Regions, lcfg.UsageEpoch = limiter.NewRedisStore(client), 3, e2eEpoch
		lcfg.Deadline = time.Second // a loaded test machine; the deadline is not under test
		lcfg.DenyCacheMaxKeys = -1  // every attempt reaches Redis, so demand is exact
		r.lim, err = limiter.New(lcfg, pols)
		require.NoError(t, err)
		fl := limiter.NewUsageFlusher(r.lim, limiter.NewRedisUsageSink(client, e2eUsageShards, e2eEpoch, 3), limiter.UsageFlusherConfig{Interval: 100 * time.Millisecond})

		starts = append(starts, func() {
			wg.Add(4)
			go func() { defer wg.Done(); _ = ad.Run(ctx) }()
			go func() { defer wg.Done(); _ = r.driver.Run(ctx) }()
			go func() { defer wg.Done(); fl.Run(ctx) }()
			go func() { defer wg.Done(); e.gateway(r) }()
		})
	}
	// Registered last, so it runs first: stop every goroutine before the
	// servers and buses they use are closed.
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, f := range starts {
		f()
	}
	return e
}

// gateway sends, every 10 ms, demand[region] requests of cost 1 for the
// hot subject and one for the warm subject, and counts per second.
func (e *e2e) gateway(r *e2eRegion) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-tick.C:
		}
		e.mu.Lock()
		n := e.demand[r.name]
		e.mu.Unlock()
		var admitted int64
		for range n {
			d, err := r.lim.Check(e.ctx, limiter.Request{Identity: limiter.Identity{APIKey: e.subjects[0].Value}, Cost: 1})
			if err != nil {
				return // context over
			}
			if d.Allowed {
				admitted++
			}
		}
		if _, err := r.lim.Check(e.ctx, limiter.Request{Identity: limiter.Identity{APIKey: e.subjects[1].Value}, Cost: 1}); err != nil {
			return
		}
		sec := time.Now().Unix()
		e.mu.Lock()
		c := e.perSec[sec]
		if c == nil {
			c = &[2]int64{}
			e.perSec[sec] = c
		}
		c[0] += int64(n)
		c[1] += admitted
		if e.regSec[r.name] == nil {
			e.regSec[r.name] = map[int64]int64{}
		}
		e.regSec[r.name][sec] += admitted
		e.mu.Unlock()
	}
}

func (e *e2e) setDemand(perTick map[string]int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.demand = perTick
}

// share reads the share region r enforces for subject now (absent = default).
func (e *e2e) share(r *e2eRegion, subj limiter.Subject) shares.Share {
	v, err := r.redis.HMGet(e.ctx, limiter.ShareKey(subj, e.policy.ID), "r", "b").Result()
	require.NoError(e.t, err)
	if v[0] == nil || v[1] == nil {
		return e.limit.Default()
	}
	var s shares.Share
	_, err = fmt.Sscan(v[0].(string), &s.RateMilli)
	require.NoError(e.t, err)
	_, err = fmt.Sscan(v[1].(string), &s.BurstMilli)
	require.NoError(e.t, err)
	return s
}

func (e *e2e) region(name string) *e2eRegion {
	for _, r := range e.regions {
		if r.name == name {
			return r
		}
	}
	e.t.Fatalf("no region %s", name)
	return nil
}

// checkSum asserts that the shares in force sum to at most L and B for
// every subject, and returns the hot subject's shares by region.
func (e *e2e) checkSum() map[string]shares.Share {
	out := map[string]shares.Share{}
	for i, subj := range e.subjects {
		var sum shares.Share
		for _, r := range e.regions {
			s := e.share(r, subj)
			sum.RateMilli += s.RateMilli
			sum.BurstMilli += s.BurstMilli
			if i == 0 {
				out[r.name] = s
			}
		}
		require.LessOrEqual(e.t, sum.RateMilli, e.limit.RateMilli, "rate shares of %v: %v", subj, out)
		require.LessOrEqual(e.t, sum.BurstMilli, e.limit.BurstMilli, "burst shares of %v: %v", subj, out)
	}
	return out
}

// watch checks the sum every 50 ms for d (bounded by the test's context).
func (e *e2e) watch(d time.Duration) map[string]shares.Share {
	end := time.Now().Add(d)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	last := e.checkSum()
	for time.Now().Before(end) {
		select {
		case <-e.ctx.Done():
			e.t.Fatal("test context ended")
		case <-tick.C:
		}
		last = e.checkSum()
	}
	return last
}

// waitUntil checks the sum every 50 ms until cond holds for the hot
// subject's shares, or fails at the deadline.
func (e *e2e) waitUntil(deadline time.Time, what string, cond func(map[string]shares.Share) bool) time.Time {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		s := e.checkSum()
		if cond(s) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not by %v; shares %v", what, deadline, s)
		}
		<-tick.C
	}
}

// windowErrors compares the global admitted with the ideal global token
// bucket (FORMAT.md: rate L, burst B, full at the start, fed the global
// demand second by second) over windows of w seconds in [from, to).
func (e *e2e) windowErrors(from, to int64, w int64) []float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	L, B := e.limit.RateMilli/1000, e.limit.BurstMilli/1000
	tokens := B
	var errs []float64
	var adm, ideal int64
	for s := from; s < to; s++ {
		c := e.perSec[s]
		if c == nil {
			c = &[2]int64{}
		}
		tokens = min(B, tokens+L)
		got := min(c[0], tokens)
		tokens -= got
		adm += c[1]
		ideal += got
		if (s-from+1)%w == 0 {
			errs = append(errs, float64(adm-ideal)/float64(L*w))
			adm, ideal = 0, 0
		}
	}
	return errs
}

func epochNow() int64 { return rebalancer.EpochOf(time.Now(), e2eEpoch) }

// TestThreeRegions runs the phases in order on one deployment: skewed
// demand (accuracy against the ideal, shares toward demand), demand moving
// to another region (shares follow within two epochs), one region cut off
// from Kafka and healed (the sum of shares in force never exceeds L).
func TestThreeRegions(t *testing.T) {
	if testing.Short() {
		t.Skip("three-region test runs about 60 s; not in -short")
	}
	e := startE2E(t)
	def := e.limit.Default()

	// Phase 1: skewed demand. us wants 400/s, eu 100/s, ap 20/s of L = 300/s.
	e.setDemand(map[string]int{"us": 4, "eu": 1, "ap": 0})
	// Warm-up (WarmupEpochs = 4), then shares move toward demand.
	e.waitUntil(time.Now().Add(20*e2eEpoch), "us grows above the default", func(s map[string]shares.Share) bool {
		return s["us"].RateMilli > def.RateMilli*3/2 && s["ap"].RateMilli < def.RateMilli
	})
	start := time.Now().Unix() + 1
	last := e.watch(15 * e2eEpoch)
	end := time.Now().Unix()
	errs := e.windowErrors(start, end, 5)
	t.Logf("skewed: shares %v, window errors %.3f", last, errs)
	require.NotEmpty(t, errs)
	for i, x := range errs {
		assert.InDelta(t, 0, x, 0.15, "window %d: global admitted vs ideal", i)
	}
	assert.Greater(t, last["us"].RateMilli, last["eu"].RateMilli)
	assert.Greater(t, last["eu"].RateMilli, last["ap"].RateMilli)

	// Phase 2: demand moves to ap. The shares follow within two epochs of
	// the first epoch with the new demand.
	before := e.checkSum()
	e.setDemand(map[string]int{"us": 0, "eu": 1, "ap": 4})
	first := epochNow() + 1 // first full epoch of the new demand
	deadline := rebalancer.EpochStart(first+2, e2eEpoch).Add(500*time.Millisecond + 250*time.Millisecond + 500*time.Millisecond)
	at := e.waitUntil(deadline, "ap's share follows demand", func(s map[string]shares.Share) bool {
		return s["ap"].RateMilli > def.RateMilli && s["us"].RateMilli < before["us"].RateMilli
	})
	t.Logf("moved: shares before %v, followed %v after the first full epoch", before, at.Sub(rebalancer.EpochStart(first, e2eEpoch)))

	// Phase 3: ap is cut off from Kafka, then healed; the sum of the shares
	// in force stays within L throughout.
	ap := e.region("ap")
	ap.bus.cut.Store(true)
	cutShares := e.watch(8 * e2eEpoch)
	t.Logf("cut: shares %v", cutShares)
	assert.LessOrEqual(t, cutShares["ap"].RateMilli, def.RateMilli, "the cut region fell back")
	ap.bus.cut.Store(false)
	e.waitUntil(time.Now().Add(15*e2eEpoch), "ap grows again after the heal", func(s map[string]shares.Share) bool {
		return s["ap"].RateMilli > def.RateMilli
	})
	for _, r := range e.regions {
		assert.Positive(t, r.decided.Load(), "region %s decided", r.name)
		st := r.driver.Status()
		assert.True(t, st.Running)
		assert.Zero(t, st.Unwritten)
	}
}
