package rebalancer_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
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

// The transfer test runs two regions on loopback: a redis-server each, one
// kfake broker carrying reports and transfers, a coordinator each (Core +
// Driver with PressureSource and TransferBus, redisio, kafkabus) and a
// gateway each as a library caller (limiter.Limiter on the region's Redis,
// flushing usage and pressure marks every 250 ms). Epochs are 4 s, so an
// epoch decision cannot move share within the time the test allows for
// the transfer. Every wait is bounded.

const xferEpoch = 4 * time.Second

type xferRegion struct {
	name   string
	redis  *redis.Client
	lim    *limiter.Limiter
	driver *rebalancer.Driver
	obs    *xferObserver
}

// xferObserver counts transfers and keeps the last events of the epoch
// path, printed when the test fails (from the driver's goroutine).
type xferObserver struct {
	mu     sync.Mutex
	kinds  map[string]int
	moved  int64 // rate milli accepted
	events []string
	modes  map[int64]shares.Mode // decisions by epoch (the last one of each)
	last   []shares.Mode         // the modes of the decisions, in order
}

// decided reports whether this region decided epoch m, and how.
func (o *xferObserver) decided(m int64) (shares.Mode, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	mode, ok := o.modes[m]
	return mode, ok
}

// grew reports whether this region's last n decisions grew.
func (o *xferObserver) grew(n int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.last) < n {
		return false
	}
	for _, m := range o.last[len(o.last)-n:] {
		if m != shares.Grow {
			return false
		}
	}
	return true
}

func (o *xferObserver) event(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
	if len(o.events) > 150 {
		o.events = o.events[1:]
	}
}

// Write takes the driver's debug log lines into the events.
func (o *xferObserver) Write(p []byte) (int, error) {
	o.event("log: %s", strings.TrimSpace(string(p)))
	return len(p), nil
}

func (o *xferObserver) Collected(c rebalancer.CollectInfo) {
	o.event("collected %d published %v err %v", c.Epoch, c.Published, c.UsageErr)
}

func (o *xferObserver) Decided(d rebalancer.DecideInfo) {
	o.mu.Lock()
	o.modes[d.Decision.Epoch] = d.Decision.Mode
	o.last = append(o.last, d.Decision.Mode)
	o.mu.Unlock()
	o.event("decided %d mode %v complete %v late %v silent %v", d.Decision.Epoch, d.Decision.Mode, d.Decision.Complete, d.Late, d.Decision.Silent)
}

func (o *xferObserver) Received(r rebalancer.ReceiveInfo) {
	o.event("received %s/%d lag %v err %v", r.Region, r.Epoch, r.Lag.Round(time.Millisecond), r.Err)
}
func (o *xferObserver) Transferred(t rebalancer.TransferInfo) {
	o.event("%v from/to %s keys %d amount %v reason %q refusal %v err %v", t.Kind, t.Region, t.Keys, t.Amount, t.Reason, t.Refusal, t.Err)
	o.mu.Lock()
	defer o.mu.Unlock()
	k := t.Kind.String()
	if t.Reason != "" {
		k += "/" + t.Reason
	}
	if t.Kind == rebalancer.GiveReceived && !t.Accepted && t.Refusal != rebalancer.GiveAccepted {
		k += "/" + t.Refusal.String()
	}
	o.kinds[k]++
	if t.Kind == rebalancer.GiveReceived && t.Accepted {
		o.moved += t.Amount.RateMilli
	}
}

// dropTime drops slog's time attribute (the events carry their own).
func dropTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}

func (o *xferObserver) snapshot() (map[string]int, int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]int{}
	for k, v := range o.kinds {
		out[k] = v
	}
	return out, o.moved
}

// TestDriverTransfersShiftWithinAnEpoch: all of a key's demand moves from
// region a to region b right after an epoch starts; b's enforced share
// reaches 90% of L through asks and gives before that epoch ends (so
// before any epoch decision could grow it), and the shares the two
// regions enforce never sum above L or B (checked every 20 ms).
func TestDriverTransfersShiftWithinAnEpoch(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	pols, err := limiter.ParsePolicies([]byte(`[{"id":"g","algorithm":"token_bucket","rate_per_sec":200,"burst":200,"scope":"global"}]`))
	require.NoError(t, err)
	lim := shares.Limit{RateMilli: pols[0].RateMilli(), BurstMilli: pols[0].BurstMilli(), Regions: 2, MinCostMilli: 1000}
	subj := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "hot"}
	names := []string{"a", "b"}

	var demand sync.Map // region -> *atomic.Int64, requests per 10 ms
	var wg sync.WaitGroup
	var regions []*xferRegion
	for _, name := range names {
		client := redistest.StartServer(t).Client()
		r := &xferRegion{name: name, redis: client, obs: &xferObserver{kinds: map[string]int{}, modes: map[int64]shares.Mode{}}}
		regions = append(regions, r)
		cl, err := kafkautil.New(kafkautil.DefaultConfig(kc.ListenAddrs()...))
		require.NoError(t, err)
		bcfg := kafkabus.DefaultConfig()
		bcfg.TopicPollInterval, bcfg.Lookback = 100*time.Millisecond, 10*xferEpoch
		bus, err := kafkabus.New(cl, bcfg)
		require.NoError(t, err)
		tcfg := kafkabus.DefaultTransferConfig()
		tcfg.TopicPollInterval = 100 * time.Millisecond
		tbus, err := kafkabus.NewTransferBus(cl, tcfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = bus.Close(); _ = tbus.Close(); _ = cl.Close() })
		ad, err := kafkabus.NewAdapter(bus, xferEpoch, nil)
		require.NoError(t, err)
		tad, err := kafkabus.NewTransferAdapter(tbus, xferEpoch, nil)
		require.NoError(t, err)

		cfg := rebalancer.DefaultConfig()
		// MaxWait 2 s of the 4 s epoch: on a loaded machine (race tests
		// of other packages beside it) reports took over a second, and a
		// region whose decision fell back for that neither asks nor gives.
		cfg.Region, cfg.Regions, cfg.Epoch, cfg.MaxWait = name, names, xferEpoch, 2*time.Second
		cfg.SilenceEpochs, cfg.WarmupEpochs, cfg.AskInterval = 2, 3, 500*time.Millisecond
		core, err := rebalancer.New(cfg, rebalancer.PolicyMap{"g": lim})
		require.NoError(t, err)
		pressure := redisio.NewPressureSource(client, e2eUsageShards, xferEpoch, 0)
		pressure.SetWindow(250 * time.Millisecond) // the gateways' flush interval here
		r.driver, err = rebalancer.NewDriver(core, rebalancer.DriverConfig{
			Usage: redisio.NewSource(client, e2eUsageShards), Shares: redisio.NewSink(client, 0), Bus: ad,
			CollectDelay: 500 * time.Millisecond, Observer: r.obs,
			Logger:   slog.New(slog.NewTextHandler(r.obs, &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: dropTime})),
			Pressure: pressure, Transfers: tad, PressureInterval: 250 * time.Millisecond,
		})
		require.NoError(t, err)

		lcfg := limiter.DefaultConfig()
		lcfg.Store, lcfg.Regions, lcfg.UsageEpoch = limiter.NewRedisStore(client), 2, xferEpoch
		lcfg.Deadline = time.Second // a loaded machine; the deadline is not under test
		lcfg.DenyCacheMaxKeys = -1  // every attempt reaches Redis, so demand is exact
		r.lim, err = limiter.New(lcfg, pols)
		require.NoError(t, err)
		fl := limiter.NewUsageFlusher(r.lim, limiter.NewRedisUsageSink(client, e2eUsageShards, xferEpoch, 3), limiter.UsageFlusherConfig{Interval: 250 * time.Millisecond})
		n := &atomic.Int64{}
		demand.Store(name, n)
		wg.Add(5)
		go func() { defer wg.Done(); _ = ad.Run(ctx) }()
		go func() { defer wg.Done(); _ = tad.Run(ctx) }()
		go func() { defer wg.Done(); _ = r.driver.Run(ctx) }()
		go func() { defer wg.Done(); fl.Run(ctx) }()
		go func() {
			defer wg.Done()
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				for range n.Load() {
					if _, err := r.lim.Check(ctx, limiter.Request{Identity: limiter.Identity{APIKey: subj.Value}, Cost: 1}); err != nil {
						return
					}
				}
			}
		}()
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if t.Failed() {
			for _, r := range regions {
				r.obs.mu.Lock()
				t.Logf("region %s, last events:\n%s", r.name, strings.Join(r.obs.events, "\n"))
				r.obs.mu.Unlock()
			}
		}
	})
	setDemand := func(a, b int64) {
		v, _ := demand.Load("a")
		v.(*atomic.Int64).Store(a)
		v, _ = demand.Load("b")
		v.(*atomic.Int64).Store(b)
	}
	share := func(r *xferRegion) shares.Share {
		v, err := r.redis.HMGet(ctx, limiter.ShareKey(subj, "g"), "r", "b").Result()
		require.NoError(t, err)
		if v[0] == nil || v[1] == nil {
			return lim.Default()
		}
		var s shares.Share
		_, err = fmt.Sscan(v[0].(string), &s.RateMilli)
		require.NoError(t, err)
		_, err = fmt.Sscan(v[1].(string), &s.BurstMilli)
		require.NoError(t, err)
		return s
	}
	var checks int
	// waitUntil checks the sum every 20 ms until cond holds, or fails at
	// the deadline or once over (when not nil) holds; it returns when cond
	// first held and the shares then.
	waitUntilOr := func(deadline time.Time, over func() bool, what string, cond func(a, b shares.Share) bool) (time.Time, shares.Share, shares.Share) {
		t.Helper()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			sa, sb := share(regions[0]), share(regions[1])
			checks++
			require.LessOrEqual(t, sa.RateMilli+sb.RateMilli, lim.RateMilli, "rate shares a %v b %v", sa, sb)
			require.LessOrEqual(t, sa.BurstMilli+sb.BurstMilli, lim.BurstMilli, "burst shares a %v b %v", sa, sb)
			if cond(sa, sb) {
				return time.Now(), sa, sb
			}
			late := !time.Now().Before(deadline)
			if late || (over != nil && over()) {
				ka, _ := regions[0].obs.snapshot()
				kb, _ := regions[1].obs.snapshot()
				why := fmt.Sprintf("not by %v", deadline.Format(time.TimeOnly))
				if !late {
					why = "the waited-for event came first"
				}
				require.Fail(t, what, "%s; shares a %v b %v; transfers of a %v, of b %v", why, sa, sb, ka, kb)
			}
			<-tick.C
		}
	}
	waitUntil := func(deadline time.Time, what string, cond func(a, b shares.Share) bool) (time.Time, shares.Share, shares.Share) {
		t.Helper()
		return waitUntilOr(deadline, nil, what, cond)
	}

	// Phase 1: a wants 300/s of L = 200/s, b nothing. After the warm-up
	// (3 epochs), a holds almost all of L, and both regions are past
	// their fallback decisions (a region whose last decision fell back
	// refuses gives): each made two growing decisions in a row.
	setDemand(3, 0)
	_, sa, sb := waitUntil(time.Now().Add(14*xferEpoch), "a holds 90% of L, both regions growing", func(a, _ shares.Share) bool {
		return a.RateMilli >= lim.RateMilli*9/10 && regions[0].obs.grew(2) && regions[1].obs.grew(2)
	})
	t.Logf("before the shift: a %v, b %v", sa, sb)
	bBefore := sb

	// Phase 2: right after the next epoch starts, all the demand moves to b.
	next := rebalancer.EpochStart(rebalancer.EpochOf(time.Now(), xferEpoch)+1, xferEpoch).Add(100 * time.Millisecond)
	waitUntil(next, "", func(shares.Share, shares.Share) bool { return !time.Now().Before(next) })
	shiftAt := time.Now()
	setDemand(0, 3)
	// b reaches 90% of L before it decides the shift's epoch: the first
	// decision that sees b's new demand, so until then only gives can
	// grow b. (The deadline follows b's own decision, which a loaded
	// machine delays as it delays the transfers; the wall-clock bound of
	// three epochs after the shift's only bounds the wait.)
	shiftEpoch := rebalancer.EpochOf(shiftAt, xferEpoch)
	bDecidedShift := func() bool { _, ok := regions[1].obs.decided(shiftEpoch); return ok }
	at, sa, sb := waitUntilOr(rebalancer.EpochStart(shiftEpoch+3, xferEpoch), bDecidedShift,
		"b reaches 90% of L before it decides the shift's epoch (no decision could grow it by then)",
		func(_, b shares.Share) bool { return b.RateMilli >= lim.RateMilli*9/10 })
	took := at.Sub(shiftAt)
	// The driver writes an accepted give's share before it tells the
	// observer: wait (bounded) for the observer to count what b holds.
	need := lim.RateMilli*9/10 - bBefore.RateMilli
	assert.Eventually(t, func() bool { _, moved := regions[1].obs.snapshot(); return moved >= need },
		xferEpoch, 10*time.Millisecond, "the gifts account for b's growth (%d milli/s)", need)
	kinds, moved := regions[1].obs.snapshot()
	t.Logf("after the shift: b reached 90%% of L in %v (a %v, b %v); b's transfers %v, %d milli/s accepted; a's %v; %d sum checks",
		took.Round(10*time.Millisecond), sa, sb, kinds, moved, func() map[string]int { k, _ := regions[0].obs.snapshot(); return k }(), checks)
	assert.Positive(t, kinds["give_received"], "b accepted gives")
	// The sum holds for two more epochs, decisions included.
	until := at.Add(2 * xferEpoch)
	waitUntil(until.Add(time.Second), "", func(shares.Share, shares.Share) bool { return !time.Now().Before(until) })
	for _, r := range regions {
		st := r.driver.Status()
		assert.True(t, st.Transfers.Enabled)
		assert.Zero(t, st.Unwritten, r.name)
	}
}
