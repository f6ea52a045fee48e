package limiter

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
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
	d, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: fmt.Sprintf("key-%d", i%benchKeys)}, Method: "GET", Path: "/v1/x"})
	if err == nil && d.Source != SourceStore {
		err = fmt.Errorf("decision answered by %s, not the store", d.Source)
	}
	return err
}

func benchClient(tb testing.TB) *redis.Client {
	srv := redistest.StartServer(tb)
	return redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: benchCallers, ContextTimeoutEnabled: true})
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

// BenchmarkCompareRedisRate measures, in the same run against the same
// redis-server, Limiter.Check with two policies per request (directly, and
// through a store with automatic pipelining) and redis_rate's Allow with
// one, all with 64 concurrent callers, and reports decisions per second of
// each and the ratios to redis_rate.
func BenchmarkCompareRedisRate(b *testing.B) {
	client := benchClient(b)
	l := benchLimiter(b, client, benchPolicies(b))
	ps, err := NewPipelinedRedisStore(client, DefaultPipelineConfig())
	require.NoError(b, err)
	b.Cleanup(ps.Close)
	cfg := DefaultConfig()
	cfg.Store, cfg.Deadline, cfg.DenyCacheMaxKeys, cfg.EventSampleRate = ps, 10*time.Second, -1, -1
	lp, err := New(cfg, benchPolicies(b))
	require.NoError(b, err)
	rr := redis_rate.NewLimiter(client)
	ctx := context.Background()
	const perRound = 20_000
	var qTime, pTime, rTime time.Duration
	b.ResetTimer()
	for round := 0; round < b.N; round++ {
		d, _ := runParallel(b, perRound, func(i int) error { return storeCheck(l, i) })
		qTime += d
		d, _ = runParallel(b, perRound, func(i int) error { return storeCheck(lp, i) })
		pTime += d
		d, _ = runParallel(b, perRound, func(i int) error {
			_, err := rr.Allow(ctx, fmt.Sprintf("key-%d", i%benchKeys), redis_rate.PerSecond(1000))
			return err
		})
		rTime += d
	}
	b.StopTimer()
	n := float64(b.N * perRound)
	q, p, r := n/qTime.Seconds(), n/pTime.Seconds(), n/rTime.Seconds()
	b.ReportMetric(q, "quotient_decisions/s")
	b.ReportMetric(p, "quotient_pipelined_decisions/s")
	b.ReportMetric(r, "redis_rate_decisions/s")
	b.ReportMetric(q/r, "ratio")
	b.ReportMetric(p/r, "ratio_pipelined")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkCheckLatencyAtHalfPeak finds the peak decision rate of Check
// (two policies, 64 callers), then offers half of it, paced, and reports the
// latency percentiles of one Check in microseconds.
func BenchmarkCheckLatencyAtHalfPeak(b *testing.B) {
	client := benchClient(b)
	l := benchLimiter(b, client, benchPolicies(b))
	ctx := context.Background()
	check := func(i int) error { return storeCheck(l, i) }
	const peakOps = 30_000
	peakTime, _ := runParallel(b, peakOps, check)
	peak := float64(peakOps) / peakTime.Seconds()
	pace := rate.NewLimiter(rate.Limit(peak/2), 1)
	var all []time.Duration
	b.ResetTimer()
	for range b.N {
		const n = 20_000
		lat := make([]time.Duration, n)
		_, _ = runParallel(b, n, func(i int) error {
			if err := pace.Wait(ctx); err != nil {
				return err
			}
			// Only the Check is timed, not the wait for the pacer.
			t := time.Now()
			err := check(i)
			lat[i] = time.Since(t)
			return err
		})
		all = append(all, lat...)
	}
	b.StopTimer()
	slices.Sort(all)
	pct := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))].Microseconds()) }
	b.ReportMetric(peak, "peak_decisions/s")
	b.ReportMetric(pct(0.50), "p50_µs")
	b.ReportMetric(pct(0.99), "p99_µs")
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
		_, err := l.CheckSubjectAt(ctx, time.Now(), subj, l.Policies(), 1)
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
	_, err = l.CheckSubjectAt(ctx, time.Now(), subj, l.Policies(), 1)
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
