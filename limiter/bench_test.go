package limiter

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// benchCallers is the number of concurrent callers of the Redis benchmarks,
// as the issue asks: 64 goroutines against one local redis-server.
const benchCallers = 64

// benchKeys is the number of distinct subjects the benchmarks spread over.
const benchKeys = 10_000

func benchPolicies(tb testing.TB) []*Policy {
	ps, err := ParsePolicies([]byte(`[
		{"id":"burst","algorithm":"token_bucket","rate_per_sec":1000,"burst":2000},
		{"id":"daily","algorithm":"fixed_window","limit":100000000,"window_s":86400}
	]`))
	require.NoError(tb, err)
	return ps
}

// benchLimiter is a limiter on the Redis store for throughput benchmarks:
// a deadline long enough that queueing on two cores never sends a call to
// the fallback, and no deny cache, so every decision is a store call.
func benchLimiter(tb testing.TB, client *redis.Client, policies []*Policy) *Limiter {
	cfg := DefaultConfig()
	cfg.Store = NewRedisStore(client)
	cfg.Deadline = 10 * time.Second
	cfg.DenyCacheMaxKeys = -1
	cfg.EventSampleRate = -1
	l, err := New(cfg, policies)
	require.NoError(tb, err)
	return l
}

// storeCheck is one Check that must be answered by the store.
func storeCheck(l *Limiter, i int) error {
	d, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: benchKeyNames[i%benchKeys]}, Method: "GET", Path: "/v1/x"})
	if err == nil && d.Source != SourceStore {
		err = fmt.Errorf("decision answered by %s, not the store", d.Source)
	}
	return err
}

func benchClient(tb testing.TB) *redis.Client {
	srv := redistest.StartServer(tb)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: benchCallers, ContextTimeoutEnabled: true})
	srv.PinFromEnv(tb) // redistest.PinCPUsEnv, set by scripts/bench-limiter.sh
	return client
}

// benchPipelineConfig is DefaultPipelineConfig with Workers from
// QUOTIENT_BENCH_PIPELINE_WORKERS when set (to compare worker counts on
// one machine without rebuilding).
func benchPipelineConfig(tb testing.TB) PipelineConfig {
	cfg := DefaultPipelineConfig()
	// As benchLimiter's deadline: a round trip that waits for a core on a
	// loaded machine (1 s by default) must not send the benchmark's calls
	// to the fallback, which fails the run.
	cfg.Timeout = 10 * time.Second
	if v := os.Getenv("QUOTIENT_BENCH_PIPELINE_WORKERS"); v != "" {
		w, err := strconv.Atoi(v)
		require.NoError(tb, err, "QUOTIENT_BENCH_PIPELINE_WORKERS")
		cfg.Workers, cfg.MaxQueue = w, w*cfg.MaxBatch
	}
	return cfg
}

// runParallel runs n calls of fn spread over benchCallers goroutines and
// returns the wall time and every call's latency.
func runParallel(tb testing.TB, n int, fn func(i int) error) (time.Duration, []time.Duration) {
	var next atomic.Int64
	lat := make([]time.Duration, n)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	start := time.Now()
	for range benchCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t := time.Now()
				if err := fn(i); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				lat[i] = time.Since(t)
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		tb.Fatal(err)
	}
	return time.Since(start), lat
}

// redisCost is what a redis-server has spent: the time its script calls
// took (INFO commandstats: usec of evalsha and eval, the measure the issue
// names) and its whole CPU time (INFO cpu: user plus system, which also
// counts reading, parsing and answering commands).
type redisCost struct {
	scriptUs, cpuUs float64
	calls           int64
}

func readRedisCost(tb testing.TB, client *redis.Client) redisCost {
	info, err := client.Info(context.Background(), "commandstats", "cpu").Result()
	require.NoError(tb, err)
	var c redisCost
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(line, cmd); ok {
				var calls int64
				var usec float64
				_, err := fmt.Sscanf(rest, "calls=%d,usec=%g,", &calls, &usec)
				require.NoError(tb, err, line)
				c.calls += calls
				c.scriptUs += usec
			}
		}
		for _, f := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if rest, ok := strings.CutPrefix(line, f); ok {
				sec, err := strconv.ParseFloat(rest, 64)
				require.NoError(tb, err, line)
				c.cpuUs += sec * 1e6
			}
		}
	}
	return c
}

func (c redisCost) sub(d redisCost) redisCost {
	return redisCost{scriptUs: c.scriptUs - d.scriptUs, cpuUs: c.cpuUs - d.cpuUs, calls: c.calls - d.calls}
}

// compareRun is one contender of BenchmarkCompareRedisRate: its time and
// what it cost Redis.
type compareRun struct {
	name string
	fn   func(i int) error
	time time.Duration
	cost redisCost
	// clientCPU is the CPU time (user + system) of this process, the
	// callers, the pipeline and the client, over the run's rounds.
	clientCPU time.Duration
}

// processCPU is the CPU time this process has used so far (getrusage:
// user plus system, every thread). Unlike wall time, other processes on
// the same cores do not inflate it much.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	require.NoError(tb, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCompareRedisRate measures, in the same run against the same
// redis-server, Limiter.Check with two policies per request (directly, and
// through a store with automatic pipelining, the gateway's default) and
// redis_rate's Allow with one, all with 64 concurrent callers, interleaved
// round by round, and reports decisions per second of each, the ratios to
// redis_rate, and what a decision cost Redis: the script time per decision
// (INFO commandstats usec / decisions) and Redis's whole CPU time per
// decision (INFO cpu), with their ratios to redis_rate's, and the CPU
// time of the benchmark process (callers, pipeline, client) per decision.
func BenchmarkCompareRedisRate(b *testing.B) {
	client := benchClient(b)
	l := benchLimiter(b, client, benchPolicies(b))
	ps, err := NewPipelinedRedisStore(client, benchPipelineConfig(b))
	require.NoError(b, err)
	b.Cleanup(ps.Close)
	cfg := DefaultConfig()
	cfg.Store, cfg.Deadline, cfg.DenyCacheMaxKeys, cfg.EventSampleRate = ps, 10*time.Second, -1, -1
	lp, err := New(cfg, benchPolicies(b))
	require.NoError(b, err)
	rr := redis_rate.NewLimiter(client)
	ctx := context.Background()
	runs := []*compareRun{
		{name: "quotient", fn: func(i int) error { return storeCheck(l, i) }},
		{name: "quotient_pipelined", fn: func(i int) error { return storeCheck(lp, i) }},
		{name: "redis_rate", fn: func(i int) error {
			_, err := rr.Allow(ctx, benchKeyNames[i%benchKeys], redis_rate.PerSecond(1000))
			return err
		}},
	}
	// Warm up: scripts loaded, connection pools full.
	for _, r := range runs {
		runParallel(b, 2*benchCallers, r.fn)
	}
	const perRound = 20_000
	b.ResetTimer()
	for round := 0; round < b.N; round++ {
		for _, r := range runs {
			c0 := readRedisCost(b, client)
			u0 := processCPU(b)
			d, _ := runParallel(b, perRound, r.fn)
			r.clientCPU += processCPU(b) - u0
			r.time += d
			r.cost = r.cost.add(readRedisCost(b, client).sub(c0))
		}
	}
	b.StopTimer()
	n := float64(b.N * perRound)
	rate := func(r *compareRun) float64 { return n / r.time.Seconds() }
	q, p, rr0 := runs[0], runs[1], runs[2]
	for _, r := range runs {
		b.ReportMetric(rate(r), r.name+"_decisions/s")
	}
	b.ReportMetric(rate(q)/rate(rr0), "ratio")
	b.ReportMetric(rate(p)/rate(rr0), "ratio_pipelined")
	for _, r := range runs {
		b.ReportMetric(r.cost.scriptUs/n, r.name+"_redis_script_µs/decision")
		b.ReportMetric(r.cost.cpuUs/n, r.name+"_redis_cpu_µs/decision")
		b.ReportMetric(float64(r.cost.calls)/n, r.name+"_script_calls/decision")
		b.ReportMetric(float64(r.clientCPU.Microseconds())/n, r.name+"_client_cpu_µs/decision")
	}
	b.ReportMetric(p.cost.scriptUs/rr0.cost.scriptUs, "redis_script_ratio_pipelined")
	b.ReportMetric(p.cost.cpuUs/rr0.cost.cpuUs, "redis_cpu_ratio_pipelined")
	b.ReportMetric(0, "ns/op")
}

func (c redisCost) add(d redisCost) redisCost {
	return redisCost{scriptUs: c.scriptUs + d.scriptUs, cpuUs: c.cpuUs + d.cpuUs, calls: c.calls + d.calls}
}

// benchKeyNames are the benchmarks' API keys, made once so that building
// them is not measured.
var benchKeyNames = func() []string {
	k := make([]string, benchKeys)
	for i := range k {
		k[i] = fmt.Sprintf("key-%d", i)
	}
	return k
}()

// BenchmarkCheckLatencyAtHalfPeak finds the peak decision rate of Check
// (two policies, 64 callers), then offers half of it, paced, and reports the
// latency percentiles of one Check in microseconds: direct (one script
// call per Check) and pipelined (NewPipelinedRedisStore, the gateway's
// default), each at half its own peak. To show where the tail comes from
// it also reports how late the pacer released the calls (percentiles),
// the share of calls released within 100 µs of their time and their p99,
// and the garbage collections per second of the measured loop with their
// stop-the-world pause.
func BenchmarkCheckLatencyAtHalfPeak(b *testing.B) {
	for _, pipelined := range []bool{false, true} {
		name := "direct"
		if pipelined {
			name = "pipelined"
		}
		b.Run(name, func(b *testing.B) {
			client := benchClient(b)
			l := benchLimiter(b, client, benchPolicies(b))
			if pipelined {
				ps, err := NewPipelinedRedisStore(client, benchPipelineConfig(b))
				require.NoError(b, err)
				b.Cleanup(ps.Close)
				cfg := DefaultConfig()
				cfg.Store, cfg.Deadline, cfg.DenyCacheMaxKeys, cfg.EventSampleRate = ps, 10*time.Second, -1, -1
				l, err = New(cfg, benchPolicies(b))
				require.NoError(b, err)
			}
			latencyAtHalfPeak(b, l)
		})
	}
}

func latencyAtHalfPeak(b *testing.B, l *Limiter) {
	check := func(i int) error { return storeCheck(l, i) }
	runParallel(b, 2*benchCallers, check) // warm up
	const peakOps = 30_000
	peakTime, _ := runParallel(b, peakOps, check)
	peak := float64(peakOps) / peakTime.Seconds()
	pace := rate.NewLimiter(rate.Limit(peak/2), 1)
	var all, late []time.Duration
	var gcs uint32
	var gcPause uint64
	var ms runtime.MemStats
	var elapsed time.Duration
	b.ResetTimer()
	for range b.N {
		const n = 20_000
		lat := make([]time.Duration, n)
		lateBy := make([]time.Duration, n)
		runtime.ReadMemStats(&ms)
		gc0, pause0 := ms.NumGC, ms.PauseTotalNs
		d, _ := runParallel(b, n, func(i int) error {
			// pace.Wait, keeping the time the pacer gave this call: a
			// sleeping Go process wakes its timers at 1 ms granularity
			// (netpoll's epoll timeout), so calls scheduled 1/rate apart
			// can start together, late.
			at := time.Now()
			r := pace.Reserve()
			at = at.Add(r.Delay())
			time.Sleep(time.Until(at))
			// Only the Check is timed, not the wait for the pacer.
			t := time.Now()
			lateBy[i] = t.Sub(at)
			err := check(i)
			lat[i] = time.Since(t)
			return err
		})
		elapsed += d
		runtime.ReadMemStats(&ms)
		gcs += ms.NumGC - gc0
		gcPause += ms.PauseTotalNs - pause0
		all = append(all, lat...)
		late = append(late, lateBy...)
	}
	b.StopTimer()
	// The Checks that started within 100 µs of their time, apart from
	// those the pacer released late (in a burst, behind others).
	var onTime []time.Duration
	for i, d := range late {
		if d < 100*time.Microsecond {
			onTime = append(onTime, all[i])
		}
	}
	pct := func(v []time.Duration, p float64) float64 {
		if len(v) == 0 {
			return 0
		}
		slices.Sort(v)
		return float64(v[int(p*float64(len(v)-1))].Microseconds())
	}
	b.ReportMetric(peak, "peak_decisions/s")
	b.ReportMetric(pct(all, 0.50), "p50_µs")
	b.ReportMetric(pct(all, 0.99), "p99_µs")
	b.ReportMetric(pct(late, 0.50), "pacer_late_p50_µs")
	b.ReportMetric(pct(late, 0.99), "pacer_late_p99_µs")
	b.ReportMetric(float64(len(onTime))/float64(len(all)), "on_time_share")
	b.ReportMetric(pct(onTime, 0.99), "on_time_p99_µs")
	b.ReportMetric(float64(gcs)/elapsed.Seconds(), "gcs/s")
	b.ReportMetric(float64(gcPause)/1e3/float64(max(gcs, 1)), "gc_stw_µs/gc")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkBucketMemory reports the bytes Redis uses for one token bucket
// (MEMORY USAGE of the key, which includes the key itself and its
// overhead), with a realistic 32-character API key.
func BenchmarkBucketMemory(b *testing.B) {
	client := benchClient(b)
	l, err := New(Config{Store: NewRedisStore(client)}, benchPolicies(b)[:1])
	require.NoError(b, err)
	ctx := context.Background()
	subj := Subject{Kind: SubjectAPIKey, Value: "k_8f2a4c1d9e7b6a5f3c2d1e0f9a8b7c6d"}
	var bytes int64
	for range b.N {
		_, err := l.checkSubjectAt(ctx, time.Now(), subj, l.Policies(), 1)
		require.NoError(b, err)
		bytes, err = client.MemoryUsage(ctx, StateKey(subj, l.Policies()[0])).Result()
		require.NoError(b, err)
	}
	b.ReportMetric(float64(bytes), "bytes/bucket")
}

// BenchmarkMemoryStore is the in-process store on one core: one token
// bucket policy, 10,000 subjects, selection included, each decision into a
// reused Decision (CheckInto), as a hot loop such as the simulator's does.
func BenchmarkMemoryStore(b *testing.B) {
	l, err := New(Config{}, benchPolicies(b)[:1])
	require.NoError(b, err)
	ctx := context.Background()
	reqs := make([]Request, benchKeys)
	for i := range reqs {
		reqs[i] = Request{Identity: Identity{APIKey: fmt.Sprintf("key-%d", i)}, Method: "GET", Path: "/v1/x"}
	}
	now := time.Now()
	var d Decision
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if err := l.CheckInto(ctx, now.Add(time.Duration(i)*time.Microsecond), reqs[i%benchKeys], &d); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

// BenchmarkMemoryStoreParallel is the in-process store with every core.
func BenchmarkMemoryStoreParallel(b *testing.B) {
	l, err := New(Config{}, benchPolicies(b)[:1])
	require.NoError(b, err)
	ctx := context.Background()
	now := time.Now()
	b.ReportAllocs()
	b.SetParallelism(benchCallers / runtime.GOMAXPROCS(0))
	var id atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		req := Request{Identity: Identity{APIKey: fmt.Sprintf("key-%d", id.Add(1))}, Method: "GET", Path: "/v1/x"}
		for pb.Next() {
			if _, err := l.CheckAt(ctx, now, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestBucketMemoryBudget holds the seed design's budget (section 3.1): at
// most 120 bytes of Redis memory per token bucket, key included.
func TestBucketMemoryBudget(t *testing.T) {
	client := benchClient(t)
	l, err := New(Config{Store: NewRedisStore(client)}, benchPolicies(t)[:1])
	require.NoError(t, err)
	ctx := context.Background()
	subj := Subject{Kind: SubjectAPIKey, Value: "k_8f2a4c1d9e7b6a5f3c2d1e0f9a8b7c6d"}
	_, err = l.checkSubjectAt(ctx, time.Now(), subj, l.Policies(), 1)
	require.NoError(t, err)
	key := StateKey(subj, l.Policies()[0])
	bytes, err := client.MemoryUsage(ctx, key).Result()
	require.NoError(t, err)
	t.Logf("MEMORY USAGE %s = %d bytes", key, bytes)
	// 120 bytes on Redis 7.0 with this key: the 12-byte state (tokens and
	// their millisecond, see bucketState) is the largest value that stays
	// in jemalloc's 32-byte class with its object header; the one-integer
	// state before it took 104 bytes but minted tokens when a rate fell.
	require.LessOrEqual(t, bytes, int64(120))
	v, err := client.Get(ctx, key).Result()
	require.NoError(t, err)
	require.Len(t, v, 12, "a bucket's state is 12 bytes")
	ttl, err := client.PTTL(ctx, key).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, time.Duration(0), "every key has a TTL")
	require.LessOrEqual(t, ttl, 3*time.Second, "a bucket lives until it would be full again, plus a second")
}

// scriptCalls is the number of script calls (EVALSHA and EVAL) every node
// behind client has served.
func scriptCalls(tb testing.TB, client redis.UniversalClient) int64 {
	ctx := context.Background()
	var total atomic.Int64
	count := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(info, "\n") {
			for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd+"calls="); ok {
					n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
					if err != nil {
						return err
					}
					total.Add(n)
				}
			}
		}
		return nil
	}
	var err error
	if cl, ok := client.(*redis.ClusterClient); ok {
		err = cl.ForEachMaster(ctx, count)
	} else {
		err = count(ctx, client.(*redis.Client))
	}
	require.NoError(tb, err)
	return total.Load()
}

// BenchmarkKeyAccountPair measures Check with issue #19's pair of
// policies (a per-key token bucket and a per-account fixed window), 64
// concurrent callers over 1,000 keys of 100 accounts, on a standalone
// redis-server and on a three-node cluster (where a key and its account
// share a node for about a third of the requests), and reports decisions
// per second and script calls per request:
//
//   - key_only: the key's policy alone (one subject: the baseline);
//   - admitted: both policies, limits high enough that all are admitted;
//   - account_rejects: both, every account exhausted, so the key consumes
//     and, across nodes, is refunded (no deny cache: every request is a
//     store decision).
func BenchmarkKeyAccountPair(b *testing.B) {
	const keys, accounts, perRound = 1000, 100, 5000
	pair := func(acctLimit int) string {
		return fmt.Sprintf(`[
		{"id":"burst","subject":"api_key","algorithm":"token_bucket","rate_per_sec":1000000,"burst":1000000},
		{"id":"acct","subject":"account","algorithm":"fixed_window","limit":%d,"window_s":3600}]`, acctLimit)
	}
	cases := []struct {
		name, policies string
		wantAllowed    bool
	}{
		{"key_only", `[{"id":"burst","subject":"api_key","algorithm":"token_bucket","rate_per_sec":1000000,"burst":1000000}]`, true},
		{"admitted", pair(1_000_000_000), true},
		{"account_rejects", pair(1), false},
	}
	layouts := []struct {
		name   string
		client func(b *testing.B) redis.UniversalClient
	}{
		{"standalone", func(b *testing.B) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: redistest.StartServer(b).Addr(), PoolSize: benchCallers, ContextTimeoutEnabled: true})
		}},
		{"cluster", func(b *testing.B) redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.StartCluster(b).Addrs(), PoolSize: benchCallers, ContextTimeoutEnabled: true})
		}},
	}
	for _, lay := range layouts {
		b.Run(lay.name, func(b *testing.B) {
			client := lay.client(b)
			b.Cleanup(func() { _ = client.Close() })
			for _, c := range cases {
				b.Run(c.name, func(b *testing.B) {
					cfg := DefaultConfig()
					cfg.Store, cfg.Deadline, cfg.DenyCacheMaxKeys, cfg.EventSampleRate = NewRedisStore(client), 10*time.Second, -1, -1
					ps, err := ParsePolicies([]byte(c.policies))
					require.NoError(b, err)
					l, err := New(cfg, ps)
					require.NoError(b, err)
					check := func(i int) error {
						id := Identity{APIKey: fmt.Sprintf("key-%d", i%keys), Account: fmt.Sprintf("acct-%d", i%accounts)}
						d, err := l.Check(context.Background(), Request{Identity: id})
						if err == nil && d.Source != SourceStore {
							err = fmt.Errorf("decision answered by %s, not the store", d.Source)
						}
						if err == nil && i >= accounts && d.Allowed != c.wantAllowed {
							err = fmt.Errorf("request %d: allowed %v, want %v", i, d.Allowed, c.wantAllowed)
						}
						return err
					}
					// Warm up: load the script, fill the connection pools
					// and exhaust the accounts of account_rejects.
					runParallel(b, accounts, check)
					calls0 := scriptCalls(b, client)
					var elapsed time.Duration
					b.ResetTimer()
					for range b.N {
						d, _ := runParallel(b, perRound, func(i int) error { return check(i + accounts) })
						elapsed += d
					}
					b.StopTimer()
					n := float64(b.N * perRound)
					b.ReportMetric(float64(scriptCalls(b, client)-calls0)/n, "calls/req")
					b.ReportMetric(n/elapsed.Seconds(), "decisions/s")
					b.ReportMetric(0, "ns/op")
				})
			}
		})
	}
}

// BenchmarkCheckAllocs is one Check at a time with two policies against a
// local redis-server, direct and pipelined, into a reused Decision
// (CheckInto), for its allocations per decision (-benchmem) and its
// latency alone.
func BenchmarkCheckAllocs(b *testing.B) {
	for _, pipelined := range []bool{false, true} {
		name := "direct"
		if pipelined {
			name = "pipelined"
		}
		b.Run(name, func(b *testing.B) {
			client := benchClient(b)
			cfg := DefaultConfig()
			cfg.Store, cfg.Deadline, cfg.DenyCacheMaxKeys, cfg.EventSampleRate = NewRedisStore(client), 10*time.Second, -1, -1
			if pipelined {
				ps, err := NewPipelinedRedisStore(client, benchPipelineConfig(b))
				require.NoError(b, err)
				b.Cleanup(ps.Close)
				cfg.Store = ps
			}
			l, err := New(cfg, benchPolicies(b))
			require.NoError(b, err)
			ctx := context.Background()
			reqs := make([]Request, benchKeys)
			for i := range reqs {
				reqs[i] = Request{Identity: Identity{APIKey: benchKeyNames[i]}, Method: "GET", Path: "/v1/x"}
			}
			var d Decision
			require.NoError(b, l.CheckInto(ctx, time.Now(), reqs[0], &d))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if err := l.CheckInto(ctx, time.Now(), reqs[i%benchKeys], &d); err != nil {
					b.Fatal(err)
				}
				if d.Source != SourceStore {
					b.Fatalf("decision answered by %s, not the store", d.Source)
				}
			}
		})
	}
}
