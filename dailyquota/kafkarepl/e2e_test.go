package kafkarepl_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/dailyquota"
	"github.com/quotientlabs/quotient/dailyquota/kafkarepl"
	"github.com/quotientlabs/quotient/dailyquota/redisio"
	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
)

// The three-region test runs, on loopback: three redis-servers, one kfake
// broker persisting its log in a directory (so it can be stopped and
// restarted on the same port like a real broker), and per region a gateway
// (limiter.Limiter on the region's Redis with a UsageFlusher) and a
// replication driver (dailyquota.Driver + redisio + kafkarepl) with the
// production intervals (publish every 1 s, usage flushed every 1 s). The
// bus wrapper publishes every batch reversed, then the previous batch
// again (stale, smaller counts), then the batch itself: duplicated and
// reordered messages on Kafka. Every wait is bounded by a deadline.

// messyBus duplicates and reorders what it publishes.
type messyBus struct {
	inner *kafkarepl.Bus
	mu    sync.Mutex
	prev  []dailyquota.Count
}

func (m *messyBus) Publish(ctx context.Context, counts []dailyquota.Count) error {
	rev := slices.Clone(counts)
	slices.Reverse(rev)
	m.mu.Lock()
	prev := m.prev
	m.prev = slices.Clone(counts)
	m.mu.Unlock()
	for _, batch := range [][]dailyquota.Count{rev, prev, counts} {
		if err := m.inner.Publish(ctx, batch); err != nil {
			return err
		}
	}
	return nil
}

func (m *messyBus) Run(ctx context.Context, deliver func(dailyquota.Count)) error {
	return m.inner.Run(ctx, deliver)
}

type admission struct {
	at     time.Time
	region int
}

type region struct {
	name   string
	rs     *limiter.RedisStore
	lim    *limiter.Limiter
	driver *dailyquota.Driver
	bus    *kafkarepl.Bus
}

// windowWithRoom picks a window length whose current window has at least
// 15 minutes left, so the test never straddles a boundary (daily windows
// end at UTC midnight; 25 h windows elsewhere).
func windowWithRoom(now time.Time) int64 {
	for _, s := range []int64{86_400, 90_000} {
		w := dailyquota.Fixed(time.Duration(s) * time.Second).At(now)
		if w.End().Sub(now) > 15*time.Minute {
			return s
		}
	}
	panic("unreachable: the two window lengths never end within 15 minutes of each other")
}

func TestThreeRegionsKafkaOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("three redis-servers, a broker and a 20 s outage; runs in make test")
	}
	const limit = 3000
	names := []string{"us-east", "eu-west", "ap-south"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	dataDir := t.TempDir()
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DataDir(dataDir))
	require.NoError(t, err)
	addr := broker.ListenAddrs()[0]
	defer func() { broker.Close() }()
	var port int
	_, err = fmt.Sscanf(addr[len("127.0.0.1:"):], "%d", &port)
	require.NoError(t, err, "broker address %s", addr)

	windowS := windowWithRoom(time.Now())
	pol, err := limiter.ParsePolicy(fmt.Appendf(nil, `{"id":"day","algorithm":"fixed_window","limit":%d,"window_s":%d,"scope":"global","subject":"account","on_store_failure":"closed"}`, limit, windowS))
	require.NoError(t, err)
	policies := redisio.Policies([]*limiter.Policy{pol})
	require.Len(t, policies, 1)
	subj := limiter.Subject{Kind: limiter.SubjectAccount, Value: "acme"}

	runCtx, stopAll := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopAll()

	regions := make([]*region, len(names))
	for i, name := range names {
		srv := redistest.StartServer(t)
		client := srv.Client()
		rs := limiter.NewRedisStore(client)
		cfg := limiter.DefaultConfig()
		cfg.Store, cfg.Region, cfg.Regions = rs, name, len(names)
		cfg.Deadline = 2 * time.Second
		cfg.DenyCacheMaxKeys = -1
		lim, err := limiter.New(cfg, []*limiter.Policy{pol})
		require.NoError(t, err)
		fl := limiter.NewUsageFlusher(lim, limiter.NewRedisUsageSink(client, 0, cfg.UsageEpoch, 3), limiter.UsageFlusherConfig{Interval: time.Second})

		cl, err := kafkautil.New(kafkautil.DefaultConfig(addr))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cl.Close() })
		bcfg := kafkarepl.DefaultConfig()
		bcfg.Partitions = 3
		bcfg.TopicPollInterval = 500 * time.Millisecond
		bus, err := kafkarepl.New(cl, bcfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = bus.Close() })

		dcfg := dailyquota.DefaultDriverConfig(name, names, policies)
		drv, err := dailyquota.NewDriver(dcfg, redisio.NewStore(rs), redisio.NewActive(client, cfg.UsageEpoch, 0), &messyBus{inner: bus})
		require.NoError(t, err)
		regions[i] = &region{name: name, rs: rs, lim: lim, driver: drv, bus: bus}
		wg.Add(2)
		go func() { defer wg.Done(); fl.Run(runCtx) }()
		go func() { defer wg.Done(); _ = drv.Run(runCtx) }()
	}

	// Load: every region asks 100 times a second, concurrently.
	var mu sync.Mutex
	var admitted []admission
	tally := make([]int64, len(names))
	loadCtx, stopLoad := context.WithCancel(runCtx)
	var lwg sync.WaitGroup
	for i, r := range regions {
		lwg.Add(1)
		go func() {
			defer lwg.Done()
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-loadCtx.Done():
					return
				case <-tick.C:
				}
				d, err := r.lim.Check(loadCtx, limiter.Request{Identity: limiter.Identity{Account: subj.Value}, Cost: 1})
				if err == nil && d.Allowed {
					mu.Lock()
					admitted = append(admitted, admission{time.Now(), i})
					tally[i]++
					mu.Unlock()
				}
			}
		}()
	}
	total := func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return tally[0] + tally[1] + tally[2]
	}
	// views returns every region's stored counts.
	views := func() []map[string]int64 {
		out := make([]map[string]int64, len(regions))
		for i, r := range regions {
			wc, err := r.rs.WindowCounts(ctx, subj, "day")
			if err != nil {
				return nil
			}
			out[i] = wc.Counts
		}
		return out
	}
	waitFor := func(what string, within time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for !cond() {
			if time.Now().After(deadline) {
				for _, r := range regions {
					t.Logf("%s: driver %+v bus %+v views %v", r.name, r.driver.Stats(), r.bus.Stats(), views())
				}
				require.FailNow(t, "timed out waiting", "%s (after %v)", what, within)
			}
			select {
			case <-ctx.Done():
				require.FailNow(t, "test deadline", what)
			case <-tick.C:
			}
		}
	}

	// Phase 1, connected: spend until the remainder is within the split
	// threshold (20% of the limit), and check the views follow.
	waitFor("80% of the limit admitted", 60*time.Second, func() bool { return total() >= limit*82/100 })
	waitFor("every region sees the others", 10*time.Second, func() bool {
		v := views()
		for i := range v {
			if v == nil || len(v[i]) != 3 {
				return false
			}
		}
		return true
	})

	// Phase 2: the broker goes away for 20 s while the load goes on.
	cutAt := time.Now()
	atCut := total()
	broker.Close()
	outage := time.NewTimer(20 * time.Second)
	select {
	case <-outage.C:
	case <-ctx.Done():
		require.FailNow(t, "test deadline during the outage")
	}
	duringOutage := total() - atCut
	broker, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.DataDir(dataDir))
	require.NoError(t, err, "restart the broker on port %d", port)
	healAt := time.Now()
	t.Logf("outage %v: %d admitted before, %d during", healAt.Sub(cutAt).Round(time.Millisecond), atCut, duringOutage)

	// Phase 3: load continues for a while after the heal, then stops; every
	// view must converge to the true totals.
	waitFor("5 s after the heal", 10*time.Second, func() bool { return time.Since(healAt) > 5*time.Second })
	stopLoad()
	lwg.Wait()
	mu.Lock()
	want := map[string]int64{}
	for i, n := range names {
		want[n] = tally[i]
	}
	mu.Unlock()
	waitFor("every view equals the true totals", 60*time.Second, func() bool {
		v := views()
		if v == nil {
			return false
		}
		for i := range v {
			if !assert.ObjectsAreEqual(want, v[i]) {
				return false
			}
		}
		return true
	})
	for i, r := range regions {
		wc, err := r.rs.WindowCounts(ctx, subj, "day")
		require.NoError(t, err)
		assert.Equal(t, want, wc.Counts, "region %s", r.name)
		st := r.driver.Stats()
		t.Logf("%s: %+v", names[i], st)
		assert.Positive(t, st.PublishFailures, "%s: publishing failed during the outage", r.name)
		assert.Positive(t, st.Merged, "%s merged the others' counts", r.name)
	}

	// The bound: total <= L + what the other regions admitted during one lag
	// before the last admission. The lag here is the outage plus the
	// measured lag and two passes (publish interval, usage flush).
	var lagMax int64
	for _, r := range regions {
		lagMax = max(lagMax, r.driver.Stats().LagMaxMs)
	}
	D := healAt.Sub(cutAt) + time.Duration(lagMax)*time.Millisecond + 2*time.Second
	sum := want["us-east"] + want["eu-west"] + want["ap-south"]
	bound := overshootBound(admitted, D)
	t.Logf("limit %d, admitted %d (overshoot %d), documented bound with D=%v: %d", limit, sum, max(0, sum-limit), D.Round(time.Millisecond), bound)
	assert.LessOrEqual(t, sum, int64(limit)+bound)
	// The split engaged before the cut (the remainder was under 20% of the
	// limit), so during the outage every region stopped at its cap. Without
	// caps each of the three regions would have spent the whole remainder
	// on its own during 20 s of load (overshoot 2 x remainder); with them
	// the overshoot is only what was admitted in flight when the caps were
	// last computed, which grows with the replication lag (on a loaded
	// machine, a good part of one remainder).
	remainder := int64(limit) - atCut
	assert.Less(t, sum-limit, 2*remainder, "caps hold the overshoot below what three uncapped regions would spend")

	// Replication lag, admission to visible in the other regions, on a
	// fresh subject, five times.
	var lags []time.Duration
	for k := range 5 {
		probe := limiter.Subject{Kind: limiter.SubjectAccount, Value: fmt.Sprintf("probe-%d", k)}
		from := regions[k%3]
		t0 := time.Now()
		d, err := from.lim.Check(ctx, limiter.Request{Identity: limiter.Identity{Account: probe.Value}, Cost: 1})
		require.NoError(t, err)
		require.True(t, d.Allowed)
		waitFor("probe visible everywhere", 15*time.Second, func() bool {
			for _, r := range regions {
				wc, err := r.rs.WindowCounts(ctx, probe, "day")
				if err != nil || wc.Counts[from.name] != 1 {
					return false
				}
			}
			return true
		})
		lags = append(lags, time.Since(t0))
	}
	slices.Sort(lags)
	t.Logf("replication lag, admission to visible in every region (publish every 1 s, usage flush every 1 s): min %v median %v max %v",
		lags[0].Round(time.Millisecond), lags[2].Round(time.Millisecond), lags[4].Round(time.Millisecond))
}

// overshootBound is the documented bound: with s the region whose last
// admission came last, at t, what the other regions admitted in (t-D, t].
func overshootBound(adm []admission, D time.Duration) int64 {
	if len(adm) == 0 {
		return 0
	}
	sort.Slice(adm, func(i, j int) bool { return adm[i].at.Before(adm[j].at) })
	last := adm[len(adm)-1]
	var n int64
	for _, a := range adm {
		if a.region != last.region && a.at.After(last.at.Add(-D)) {
			n++
		}
	}
	return n
}
