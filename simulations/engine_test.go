package simulations

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
)

func parse(t testing.TB, data string) *Scenario {
	t.Helper()
	sc, err := ParseScenario([]byte(data))
	require.NoError(t, err)
	return sc
}

func run(t testing.TB, sc *Scenario, opt Options) *Report {
	t.Helper()
	rep, err := Run(context.Background(), sc, opt)
	require.NoError(t, err)
	return rep
}

// outputs renders every output of rep into memory, by file suffix.
func outputs(t *testing.T, rep *Report) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for suffix, write := range map[string]func(*bytes.Buffer) error{
		"summary": func(b *bytes.Buffer) error { return rep.WriteSummary(b) },
		"windows": func(b *bytes.Buffer) error { return rep.WriteWindows(b) },
		"seconds": func(b *bytes.Buffer) error { return rep.WriteSeconds(b) },
		"svg":     func(b *bytes.Buffer) error { return rep.WritePlot(b) },
	} {
		var b bytes.Buffer
		require.NoError(t, write(&b))
		out[suffix] = b.Bytes()
	}
	return out
}

// busy exercises every part of the engine: skew, a lossy duplicating bus,
// a partition, both faults, a group and uniform arrivals.
const busy = `{
  "name": "busy", "seed": 11, "duration_s": 240, "regions": ["a", "b", "c"],
  "epoch_s": 5, "window_s": 30, "warmup_s": 30,
  "network": {"latency_ms": 80, "jitter_ms": 40, "loss": 0.2, "duplicate": 0.2,
    "partitions": [{"regions": ["c"], "from_s": 100, "to_s": 140}]},
  "clock_skew_ms": {"b": 700, "c": -300},
  "faults": [{"kind": "coordinator_down", "region": "a", "from_s": 60, "to_s": 90},
             {"kind": "store_down", "region": "b", "from_s": 150, "to_s": 170}],
  "policies": [{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 30, "burst": 60},
               {"id": "w", "scope": "global", "algorithm": "fixed_window", "limit": 500, "window_s": 60}],
  "traffic": [{"key": "k", "policies": ["p", "w"], "rate": {"a": [[0, 20], [120, 5]], "b": [[0, 10]], "c": [[30, 15]]}},
              {"key": "k", "policies": ["p"], "cost": 5, "arrivals": "uniform", "rate": {"c": [[0, 1]]}},
              {"key_prefix": "g", "count": 50, "policies": ["p"], "total_rate": [[0, 200]], "zipf_s": 1.2,
               "region_mix": {"a": 0.2, "b": 0.3, "c": 0.5}}]
}`

func TestRunIsDeterministic(t *testing.T) {
	sc := parse(t, busy)
	opt := Options{NewCoordinator: newEchoCoordinator(nil)}
	a := outputs(t, run(t, sc, opt))
	b := outputs(t, run(t, sc, opt))
	for k := range a {
		assert.Equal(t, string(a[k]), string(b[k]), "output %s differs between two runs", k)
	}
	// Another seed changes the draws.
	sc2 := parse(t, strings.Replace(busy, `"seed": 11`, `"seed": 12`, 1))
	c := outputs(t, run(t, sc2, opt))
	assert.NotEqual(t, string(a["windows"]), string(c["windows"]))
}

func TestOutputsFollowTheFormat(t *testing.T) {
	sc := parse(t, busy)
	rep := run(t, sc, Options{})
	rep.Wall = 1500 * time.Millisecond
	dir := t.TempDir()
	require.NoError(t, rep.WriteFiles(dir))
	for _, suffix := range []string{".summary.json", ".windows.csv", ".seconds.csv", ".svg"} {
		_, err := os.Stat(filepath.Join(dir, "busy"+suffix))
		require.NoError(t, err, suffix)
	}
	out := outputs(t, rep)

	windows := strings.Split(strings.TrimSpace(string(out["windows"])), "\n")
	assert.Equal(t, "window_start_s,window_end_s,key,policy,region,demand,admitted,ideal", windows[0])
	// (240-30)/30 = 7 windows; tracked pairs: (k,p), (k,w) and 50 g keys;
	// 3 regions and one "*" row each.
	assert.Len(t, windows[1:], 7*52*4)
	assert.Equal(t, "30,60,k,p,a", strings.Join(strings.Split(windows[1], ",")[:5], ","))
	assert.Regexp(t, `^30,60,k,p,\*,\d+,\d+,\d+(\.\d+)?$`, windows[4])
	assert.Regexp(t, `^30,60,k,p,a,\d+,\d+,$`, windows[1], "the ideal is only on the global row")

	seconds := strings.Split(strings.TrimSpace(string(out["seconds"])), "\n")
	assert.Equal(t, "t_s,key,policy,region,demand,admitted,share", seconds[0])
	assert.Len(t, seconds[1:], 240*2*3, "named pairs only: (k,p) and (k,w)")
	assert.Equal(t, "0,k,p,a,", seconds[1][:len("0,k,p,a,")])
	// Static shares: L/n of the bucket, the whole limit of the window.
	assert.True(t, strings.HasSuffix(seconds[1], ",10"), seconds[1])
	assert.True(t, strings.HasSuffix(seconds[4], ",500"), seconds[4])

	summary := string(out["summary"])
	for _, field := range []string{`"scenario": "busy"`, `"pass":`, `"seed": 11`, `"simulated_s": 240`, `"wall_s": 1.5`, `"decisions":`, `"keys":`, `"worst":`, `"mean_abs_error":`} {
		assert.Contains(t, summary, field)
	}
	assert.True(t, bytes.HasPrefix(out["svg"], []byte("<?xml")), "an SVG document")
}

// idealCase runs the ideal over fixed per-second demand.
func TestIdeal(t *testing.T) {
	bucket := &limiter.Policy{ID: "b", Scope: limiter.ScopeGlobal, Algorithm: limiter.TokenBucket, RatePerSec: 10, Burst: 25}
	window := &limiter.Policy{ID: "w", Scope: limiter.ScopeGlobal, Algorithm: limiter.FixedWindow, Limit: 30, WindowSec: 4}
	require.NoError(t, bucket.Validate())
	require.NoError(t, window.Validate())
	tests := []struct {
		name      string
		policy    *limiter.Policy
		startUnix int64
		demand    []int64
		want      []int64 // cost units
	}{
		{"bucket starts full", bucket, 0, []int64{30, 0, 0, 0}, []int64{25, 0, 0, 0}},
		{"bucket then refills by L", bucket, 0, []int64{30, 30, 30, 5}, []int64{25, 10, 10, 5}},
		{"bucket refills to burst", bucket, 0, []int64{25, 0, 0, 0, 40}, []int64{25, 0, 0, 0, 25}},
		{"bucket under the limit", bucket, 0, []int64{7, 7, 7}, []int64{7, 7, 7}},
		{"window caps at Q", window, 0, []int64{10, 15, 10, 10, 10}, []int64{10, 15, 5, 0, 10}},
		{"window aligned to the Unix epoch", window, 2, []int64{20, 20, 20}, []int64{20, 10, 20}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tk := &trackedKey{policy: tt.policy, secDemand: tt.demand}
			got := tk.idealMilli(tt.startUnix)
			want := make([]int64, len(tt.want))
			for i, v := range tt.want {
				want[i] = v * 1000
			}
			assert.Equal(t, want, got)
		})
	}
}

// With the static stand-in, a key whose demand is all in one region gets
// only that region's default share: admitted ~ L/3 a second against an
// ideal of L, an under-service of about 2/3.
func TestStaticSharesUnderServeOneRegion(t *testing.T) {
	rep := run(t, loadScenario(t, "single-region"), Options{NewCoordinator: NewStaticCoordinator})
	assert.False(t, rep.Pass)
	require.Len(t, rep.Keys, 1)
	assert.InDelta(t, 2.0/3, rep.Keys[0].MaxUnder, 0.01)
	assert.Zero(t, rep.Keys[0].MaxOver)
}

// A coordinator that hands the whole limit to the region with the demand
// makes single-region pass: shares reach the limiter through the seam.
func TestSharesFromTheCoordinatorAreEnforced(t *testing.T) {
	sc := loadScenario(t, "single-region")
	give := func(info RegionInfo) (Coordinator, error) {
		return &giveAll{info: info}, nil
	}
	rep := run(t, sc, Options{NewCoordinator: give})
	assert.True(t, rep.Pass, "worst %+v", rep.Worst)
	assert.Less(t, rep.Worst.MaxUnder, 0.05)
	out := outputs(t, rep)
	// us-east's share becomes the whole limit (100/s) after the first epoch.
	assert.Contains(t, string(out["seconds"]), "\n20,acct-one,pro,us-east,")
	assert.Regexp(t, regexp.MustCompile(`\n20,acct-one,pro,us-east,\d+,\d+,100\n`), string(out["seconds"]))
	assert.Regexp(t, regexp.MustCompile(`\n20,acct-one,pro,eu-west,0,0,0.001\n`), string(out["seconds"]))
}

// giveAll gives region 0 the whole limit of every key it saw and the others
// a thousandth of a token.
type giveAll struct{ info RegionInfo }

func (g *giveAll) Receive(time.Time, Message) TickResult { return TickResult{} }

func (g *giveAll) Tick(_ time.Time, boundary bool, usage []Usage) TickResult {
	var res TickResult
	for _, p := range g.info.Policies {
		for _, key := range []string{"acct-one"} {
			rate, burst := p.RateMilli(), p.BurstMilli()
			if g.info.Self != 0 {
				rate, burst = 1, 1
			}
			res.Shares = append(res.Shares, ShareUpdate{Policy: p.ID, Subject: limiter.Subject{Kind: p.Subject, Value: key}, RateMilli: rate, BurstMilli: burst, TTL: time.Minute})
		}
	}
	return res
}

// echo publishes one message per epoch boundary carrying its send time and
// records what it receives and when it ticks.
type echo struct {
	self int
	log  *echoLog
}

type sent struct {
	from   int
	at     time.Time // sender's clock
	serial int
}

type received struct {
	to  int
	at  time.Time // receiver's clock
	msg sent
}

type echoLog struct {
	ticks    map[int][]time.Time
	wakes    map[int][]time.Time
	received []received
	usage    map[int]int64
	serial   int
}

func newEchoCoordinator(log *echoLog) NewCoordinator {
	if log == nil {
		log = &echoLog{}
	}
	log.ticks, log.wakes, log.usage = map[int][]time.Time{}, map[int][]time.Time{}, map[int]int64{}
	return func(info RegionInfo) (Coordinator, error) { return &echo{self: info.Self, log: log}, nil }
}

func (e *echo) Receive(now time.Time, m Message) TickResult {
	e.log.received = append(e.log.received, received{to: e.self, at: now, msg: m.Payload.(sent)})
	return TickResult{}
}

func (e *echo) Tick(now time.Time, boundary bool, usage []Usage) TickResult {
	if !boundary {
		e.log.wakes[e.self] = append(e.log.wakes[e.self], now)
		return TickResult{}
	}
	e.log.ticks[e.self] = append(e.log.ticks[e.self], now)
	for _, u := range usage {
		e.log.usage[e.self] += u.Demand
	}
	e.log.serial++
	return TickResult{Publish: []any{sent{from: e.self, at: now, serial: e.log.serial}}, Wake: now.Add(time.Second)}
}

func TestBusAndClocks(t *testing.T) {
	sc := parse(t, busy)
	log := &echoLog{}
	run(t, sc, Options{NewCoordinator: newEchoCoordinator(log)})
	skew := map[int]time.Duration{0: 0, 1: 700 * time.Millisecond, 2: -300 * time.Millisecond}

	// Boundaries fall on multiples of the epoch of each region's own clock.
	for r, ticks := range log.ticks {
		require.NotEmpty(t, ticks)
		for _, at := range ticks {
			assert.Zero(t, at.UnixMilli()%5000, "region %d ticked at %v", r, at)
		}
		// Each boundary asked for a wake-up one second later.
		require.NotEmpty(t, log.wakes[r])
		assert.Equal(t, ticks[0].Add(time.Second), log.wakes[r][0])
	}
	// Region a's coordinator is down from 60 to 90 s: no tick in between.
	for _, at := range log.ticks[0] {
		s := at.Sub(DefaultStart).Seconds()
		assert.False(t, s >= 60 && s < 90, "a ticked at %v s while down", s)
	}
	assert.Len(t, log.ticks[1], 240/5+HeadStartEpochs, "b ticks every epoch, from the head start on")

	perLink := map[[2]int]int{}
	dups := map[[2]int]int{}
	seen := map[[2]int]bool{}
	for _, rc := range log.received {
		from, to := rc.msg.from, rc.to
		require.NotEqual(t, from, to, "a region does not receive its own messages")
		// Delivery delay on the true clock: latency 80 +- 40 ms, except for
		// messages held while the receiver's coordinator was down.
		trueSent := rc.msg.at.Add(-skew[from])
		trueRecv := rc.at.Add(-skew[to])
		delay := trueRecv.Sub(trueSent)
		// (a's first boundary after its outage, at 90 s, hands them over).
		held := to == 0 && trueRecv.Equal(DefaultStart.Add(90*time.Second))
		if held {
			assert.Less(t, trueSent.Sub(DefaultStart), 90*time.Second)
		} else {
			assert.True(t, delay >= 40*time.Millisecond && delay <= 120*time.Millisecond, "delay %v", delay)
		}
		// Nothing crosses the partition of c between 100 and 140 s.
		sentS := trueSent.Sub(DefaultStart).Seconds()
		if (from == 2) != (to == 2) {
			assert.False(t, sentS >= 100 && sentS < 140, "message %d->%d sent at %v s crossed the partition", from, to, sentS)
		}
		link := [2]int{from, to}
		perLink[link]++
		if k := [2]int{rc.msg.serial, to}; seen[k] {
			dups[link]++
		} else {
			seen[k] = true
		}
	}
	// 48 boundaries per region, loss 0.2, duplication 0.2: about 46 a link.
	total, totalDups := 0, 0
	for link, n := range perLink {
		assert.True(t, n > 25 && n < 70, "link %v got %d", link, n)
		total += n
		totalDups += dups[link]
	}
	assert.Positive(t, totalDups, "some messages are duplicated")
	assert.Less(t, totalDups, total/3)
	// Usage reaches the coordinators (except epochs lost while a is down).
	for r := range 3 {
		assert.Positive(t, log.usage[r])
	}
}

func TestStoreDownFollowsFailureModes(t *testing.T) {
	base := `{"name": "sd", "seed": 1, "duration_s": 180, "regions": ["a", "b"], "window_s": 30, "warmup_s": 30,
	  "faults": [{"kind": "store_down", "region": "a", "from_s": 60, "to_s": 120}],
	  "policies": [{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 20, "burst": 20, "on_store_failure": "MODE"}],
	  "traffic": [{"key": "k", "policies": ["p"], "arrivals": "uniform", "rate": {"a": [[0, 100]]}}]}`
	admittedDuringOutage := func(mode string) int64 {
		rep := run(t, parse(t, strings.Replace(base, "MODE", mode, 1)), Options{})
		k, ok := rep.rec.Lookup("k", "p")
		require.True(t, ok)
		var n int64
		for w := 1; w <= 2; w++ { // windows [60,90) and [90,120)
			n += rep.rec.keys[k].winAdmitted[0][w]
		}
		return n
	}
	assert.Zero(t, admittedDuringOutage("closed"), "closed rejects everything")
	// open: twice the default share (2 x 10/s) for 60 s, plus a burst.
	assert.InDelta(t, 2*10*60+20, float64(admittedDuringOutage("open")), 25)
	// local: the default share, one instance per region.
	assert.InDelta(t, 10*60+10, float64(admittedDuringOutage("local")), 15)
}

func TestArrivals(t *testing.T) {
	sc := parse(t, `{"name": "arr", "seed": 5, "duration_s": 200, "regions": ["a", "b"], "window_s": 100, "warmup_s": 0,
	  "policies": [{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 1000000, "burst": 1000000}],
	  "traffic": [{"key": "u", "policies": ["p"], "arrivals": "uniform", "rate": {"a": [[0, 10], [100, 0], [150, 4]]}},
	              {"key": "p", "policies": ["p"], "rate": {"b": [[0, 50]]}},
	              {"key_prefix": "z", "count": 20, "policies": ["p"], "arrivals": "uniform", "total_rate": [[0, 100]], "zipf_s": 1, "region_mix": {"a": 0.25, "b": 0.75}}]}`)
	rep := run(t, sc, Options{})
	demand := func(key string, region int) int64 {
		k, ok := rep.rec.Lookup(key, "p")
		require.True(t, ok)
		var n int64
		for _, v := range rep.rec.keys[k].winDemand[region] {
			n += v
		}
		return n
	}
	// Uniform: exactly rate x time, evenly spaced in each step.
	assert.Equal(t, int64(10*100+4*50), demand("u", 0))
	// Poisson: 10,000 expected, standard deviation 100.
	assert.InDelta(t, 10000, float64(demand("p", 1)), 400)
	// Zipf with s=1 over 20 keys: the top key gets 1/H(20) = 27.8%.
	var total, top, second int64
	for i := range 20 {
		n := demand("z"+strconv.Itoa(i), 0) + demand("z"+strconv.Itoa(i), 1)
		total += n
		if i == 0 {
			top = n
		}
		if i == 1 {
			second = n
		}
	}
	assert.InDelta(t, 20000, float64(total), 1)
	h20 := 0.0
	for i := 1; i <= 20; i++ {
		h20 += 1 / float64(i)
	}
	assert.InDelta(t, 1/h20, float64(top)/float64(total), 0.02)
	assert.InDelta(t, 0.5/h20, float64(second)/float64(total), 0.02)
	// The region mix.
	var inA int64
	for i := range 20 {
		inA += demand("z"+strconv.Itoa(i), 0)
	}
	assert.InDelta(t, 0.25, float64(inA)/float64(total), 0.02)
	assert.Equal(t, int64(10*100+4*50)+demand("p", 1)+total, rep.Decisions)
}

func TestRunHonoursCancellation(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var seen int64
	_, err := Run(ctx, parse(t, busy), Options{Progress: func(done, total int64) {
		seen = done
		if done == 10 {
			cancel()
		}
	}})
	require.ErrorIs(t, err, ErrInternal)
	assert.Equal(t, int64(10), seen)
}

func TestProgressCountsEverySecond(t *testing.T) {
	var calls, last int64
	run(t, parse(t, minimal), Options{Progress: func(done, total int64) {
		calls++
		last = done
		assert.Equal(t, int64(120), total)
	}})
	assert.Equal(t, int64(120), calls)
	assert.Equal(t, int64(120), last)
}

func TestErrorMetric(t *testing.T) {
	// Demand well under the limit in every region: nothing is refused and
	// the error is exactly zero.
	rep := run(t, parse(t, `{"name": "zero", "seed": 1, "duration_s": 180, "regions": ["a", "b"],
	  "policies": [{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 100, "burst": 100}],
	  "traffic": [{"key": "k", "policies": ["p"], "rate": {"a": [[0, 5]], "b": [[0, 5]]}}]}`), Options{})
	assert.True(t, rep.Pass)
	assert.Zero(t, rep.Worst.MaxOver)
	assert.Zero(t, rep.Worst.MaxUnder)
	assert.Equal(t, 2, rep.Keys[0].Windows)
	assert.False(t, math.IsNaN(rep.Keys[0].MeanAbsError))
}

// The production rebalancer moves the share to where the demand is, and
// the shares the regions enforce never add up to more than the limit, at
// every simulated second, whatever the bus does.
func TestRebalancerSharesFollowDemandWithinTheLimit(t *testing.T) {
	rep := run(t, loadScenario(t, "single-region"), Options{NewCoordinator: DefaultCoordinator})
	k, ok := rep.rec.Lookup("acct-one", "pro")
	require.True(t, ok)
	tk := rep.rec.keys[k]
	assert.GreaterOrEqual(t, tk.secShareMilli[0][300], 90*tk.policy.RateMilli()/100, "us-east holds most of L once shares settle")
	assert.Less(t, rep.Worst.MaxUnder, 0.2)

	for _, sc := range []*Scenario{parse(t, busy), loadScenario(t, "partition"), loadScenario(t, "coordinator-down")} {
		rep := run(t, sc, Options{NewCoordinator: DefaultCoordinator})
		for _, k := range rep.rec.Named() {
			tk := rep.rec.keys[k]
			if tk.policy.Algorithm == limiter.FixedWindow {
				continue
			}
			for s := range sc.DurationSec {
				var sum int64
				for r := range sc.Regions {
					sum += tk.secShareMilli[r][s]
				}
				require.LessOrEqual(t, sum, tk.policy.RateMilli(), "%s: %s at %d s", sc.Name, tk.key, s)
			}
		}
	}
}

func TestCoordinatorsStartBeforeTheTraffic(t *testing.T) {
	sc := parse(t, minimal)
	warm, cold := &echoLog{}, &echoLog{}
	run(t, sc, Options{NewCoordinator: newEchoCoordinator(warm)})
	run(t, sc, Options{NewCoordinator: newEchoCoordinator(cold), ColdStart: true})
	epoch := time.Duration(sc.EpochSec) * time.Second
	assert.Equal(t, DefaultStart.Add(-(HeadStartEpochs-1)*epoch), warm.ticks[0][0], "first boundary after the head start")
	assert.Equal(t, DefaultStart.Add(epoch), cold.ticks[0][0])
	assert.Len(t, warm.ticks[0], len(cold.ticks[0])+HeadStartEpochs)
}

// replicator is a test stand-in for the daily-quota replication (issue 6):
// every second it publishes its region's own count of one key's replicated
// window, and merges what it receives. It shows the seam carries what that
// replication needs; the product's version belongs in dailyquota/.
type replicator struct {
	info    RegionInfo
	subject limiter.Subject
	policy  *limiter.Policy
}

func (r *replicator) Receive(_ time.Time, m Message) TickResult {
	if wc, ok := m.Payload.(WindowCount); ok {
		return TickResult{Windows: []WindowCount{wc}}
	}
	return TickResult{}
}

func (r *replicator) Tick(now time.Time, _ bool, _ []Usage) TickResult {
	res := TickResult{Wake: now.Truncate(time.Second).Add(time.Second)}
	self := r.info.Regions[r.info.Self]
	wc := r.info.WindowCounts(now, r.subject, r.policy.ID)
	if wc.StartMs != 0 {
		res.Publish = []any{WindowCount{Policy: r.policy.ID, Subject: r.subject, WindowStartMs: wc.StartMs,
			WindowMs: r.policy.WindowMs(), Region: self, Count: wc.Counts[self]}}
	}
	return res
}

func TestWindowReplicationSeam(t *testing.T) {
	sc := loadScenario(t, "fixed-window-replicated")
	rebalancerOnly := NewRebalancerCoordinator(rebalancer.DefaultConfig())
	alone := run(t, sc, Options{NewCoordinator: rebalancerOnly})
	assert.Greater(t, alone.Worst.MaxOver, 1.0, "each region spends the whole limit on its own")

	repl := func(info RegionInfo) (Coordinator, error) {
		return &replicator{info: info, subject: limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "acct-day"}, policy: info.Policies[0]}, nil
	}
	rep := run(t, sc, Options{NewCoordinator: Combine(rebalancerOnly, repl)})
	assert.True(t, rep.Pass, "worst %+v", rep.Worst)
	assert.Less(t, rep.Worst.MaxOver, 0.01)
}
