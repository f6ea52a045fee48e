package rebalancer_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/protobuf/proto"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
	"github.com/quotientlabs/quotient/rebalancer/redisio"
	"github.com/quotientlabs/quotient/shares"
)

// BenchmarkEpoch100kKeys measures one epoch of one region end to end for
// 100,000 active keys of 3 regions, on this machine, with the real parts:
// collect the gateways' usage from redis-server (16 shard hashes), Collect,
// publish the report through kfake (kafka-go, lz4, acks=all), consume it
// and the two other regions' 100k-key reports, Receive, Decide, and write
// the changed shares to redis-server (pipelined script calls, many records
// each). The other regions' reports are published untimed; consuming them
// is timed. Per-phase costs are reported as ms/<phase> (wall) and
// cpu-ms/<phase> (this process's CPU time: the coordinator's work, the
// in-process broker's and the garbage collector's); redis-server's CPU time
// as redis-cpu-ms. Phases: read (usage from Redis), collect (Core.Collect),
// shrink (writing the shares given up at collection, Published.Updates),
// publish, consume (the three reports, Core.Receive), decide
// (Core.Decide) and write (the decision's updates). The sizes and memory
// figures of BenchmarkEpochScale are reported too.
//
// Sub-benchmarks: "all-change" alternates demand every epoch so that every
// key's share changes (worst case for the write); "steady" keeps demand
// constant, but in the few epochs measured after warm-up the shares are
// still converging, so it writes every key too (see updates/epoch).
// Run with -benchtime 2x: each iteration is one 100k-key epoch, and the
// setup (usage flushes, the other regions' reports) is not timed.
func BenchmarkEpoch100kKeys(b *testing.B) {
	b.Run("all-change", func(b *testing.B) { benchEpoch(b, 100_000, 2) })
	b.Run("steady", func(b *testing.B) { benchEpoch(b, 100_000, 1) })
}

// BenchmarkEpochScale is BenchmarkEpoch100kKeys's all-change epoch (every
// share changes) at 10,000, 100,000 and 1,000,000 active keys of 3
// regions, the curve issue 15 asks for. Besides wall and CPU per phase it
// reports, per epoch:
//
//   - core-B/key: the heap the Core retains per key between epochs (its
//     key states and the other regions' stored reports), measured as the
//     live heap that is freed when the Core is dropped;
//   - redis-usage-B/key: redis-server memory (INFO used_memory) that one
//     epoch's usage hashes take per key (the gateways keep 4 epochs);
//   - redis-shares-B/key: redis-server memory of the share records per key
//     (what is left once the usage hashes are deleted, over the empty
//     server);
//   - kafka-B/key: bytes this region produces per key for its report (the
//     record batches of its Produce requests, lz4 as sent; the synthetic
//     subjects and values compress far better than real ones), and
//     kafka-raw-B/key, the report's protobuf size before compression;
//   - redis-max-us and redis-over-1ms: the longest command redis-server ran
//     during the epoch and how many ran 1 ms or longer (SLOWLOG, threshold
//     100 µs; the longest is also logged with its name, and the commands of
//     1 ms or more per command name). The benchmark's own SLOWLOG RESET is
//     not counted (it frees up to 100,000 entries and can take 19 ms).
//     SLOWLOG times commands by the wall clock, so a command during which
//     the kernel preempted redis-server counts as long however little it
//     did: redis-preempted/epoch is how often that happened to its main
//     thread during the epoch. The probe's own commands (below) are not
//     counted there but in gw-redis-over-1ms/epoch;
//   - gw-p50-us/PHASE and gw-p99-us/PHASE: the latency of a gateway-like
//     probe (a limiter Allow on a RedisStore of its own client, every
//     2 ms, no deadline) by phase: "between" (a second before the epoch
//     with only the probe running), "read" (the coordinator reading
//     usage), "coordinator" (its CPU-only phases), "write" (its share
//     writes) and "flush" (the setup's usage flushes, 100,000 counts a
//     pipeline, heavier than gateways' flushes). The probe runs in a
//     process of its own (startProbe), as a gateway does, on redis-server's
//     CPUs when they are pinned, so that it does not wait for the
//     coordinator's CPU or its garbage collector.
//
// The million-key size takes minutes and several GB of memory, so it runs
// only with QUOTIENT_BENCH_1M=1 (make bench-scale); without it it is
// skipped and says so. QUOTIENT_BENCH_CPUPROFILE=FILE writes a CPU profile
// of the measured epochs only (not the untimed setup) of the last size run;
// QUOTIENT_BENCH_COREHEAP=FILE a heap profile taken after them, while the
// Core is still held (its inuse_space is what core-B/key measures, with
// whatever else the test process holds). With QUOTIENT_BENCH_REDIS_CPUS
// (redistest.PinCPUsEnv) set to "0" and the test under taskset -c 1,
// redis-server has a core of its own, so that SLOWLOG and the probe
// measure Redis rather than the coordinator taking its CPU (make
// bench-scale runs the quiet epoch that way too); the gateway probe's
// process then shares the coordinator's core unless
// QUOTIENT_BENCH_PROBE_CPUS (probeCPUsEnv) places it elsewhere.
// Run with -benchtime 2x and under the machine-wide benchmark lock.
func BenchmarkEpochScale(b *testing.B) {
	benchScale(b, 2)
}

// BenchmarkEpochScaleQuiet is BenchmarkEpochScale in the steady state
// issue 15's "reports that cost what changed" is for: every key active in
// every region, each region's demand the same every epoch and below its
// default share, so no share changes and no record is written; the other
// regions publish delta reports as Cores do (Config.Deltas): a full report
// every FullEvery epochs and, between them, deltas that list no key. What
// is left is what every epoch must do whatever changed: read the usage,
// Collect, publish this region's delta, receive the others' and Decide,
// which still visits every key. Same sizes, metrics and QUOTIENT_BENCH_1M
// gate as BenchmarkEpochScale.
func BenchmarkEpochScaleQuiet(b *testing.B) {
	benchScale(b, 0)
}

func benchScale(b *testing.B, period int) {
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%s", sizeName(n)), func(b *testing.B) {
			if n >= 1_000_000 && os.Getenv("QUOTIENT_BENCH_1M") != "1" {
				b.Skip("the million-key epoch takes minutes: set QUOTIENT_BENCH_1M=1 (make bench-scale)")
			}
			benchEpoch(b, n, period)
		})
	}
}

func sizeName(n int) string {
	switch {
	case n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

// benchEpoch runs the benchmark for nkeys keys; demand cycles with period
// (1: constant). Period 0 is the quiet steady state of
// BenchmarkEpochScaleQuiet: every region's demand constant and below its
// default share, the other regions' reports deltas between full ones.
func benchEpoch(b *testing.B, nkeys, period int) {
	quiet := period == 0
	if quiet {
		period = 1
	}
	epoch := 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(b, err)
	defer kc.Close()
	// Bytes this region's adapter produces, counted while measuring is
	// set (around its Publish only).
	var measuring atomic.Bool
	var produced atomic.Int64
	kc.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		if measuring.Load() {
			for _, t := range req.(*kmsg.ProduceRequest).Topics {
				for _, p := range t.Partitions {
					produced.Add(int64(len(p.Records)))
				}
			}
		}
		return nil, nil, false
	})
	newAdapter := func() *kafkabus.Adapter {
		cl, err := kafkautil.New(kafkautil.DefaultConfig(kc.ListenAddrs()...))
		require.NoError(b, err)
		cfg := kafkabus.DefaultConfig()
		cfg.TopicPollInterval = 100 * time.Millisecond
		bus, err := kafkabus.New(cl, cfg)
		require.NoError(b, err)
		b.Cleanup(func() { _ = bus.Close(); _ = cl.Close() })
		ad, err := kafkabus.NewAdapter(bus, epoch, nil)
		require.NoError(b, err)
		return ad
	}
	self, others := newAdapter(), []*kafkabus.Adapter{newAdapter(), newAdapter()}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = self.Run(runCtx) }()
	defer func() { stop(); <-done }()

	srv := redistest.StartServer(b)
	srv.PinFromEnv(b) // redistest.PinCPUsEnv: redis-server on its own core (run the test on the other)
	client := srv.Client()
	require.NoError(b, client.ConfigSet(ctx, "slowlog-log-slower-than", "100").Err())
	require.NoError(b, client.ConfigSet(ctx, "slowlog-max-len", "100000").Err())
	emptyMem := redisMemory(ctx, b, client)
	// The setup's usage flushes (100,000 counts a pipeline) take seconds
	// on a loaded machine: their own client, past go-redis's 3 s default.
	flushClient := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	defer flushClient.Close()
	gw := limiter.NewRedisUsageSink(flushClient, 0, epoch, 100)
	src, sink := redisio.NewSource(client, 0), benchSink(client)

	lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 3}
	cfg := rebalancer.DefaultConfig()
	cfg.Region, cfg.Regions, cfg.Epoch = "a", []string{"a", "b", "c"}, epoch

	subjects := make([]limiter.Subject, nkeys)
	for i := range subjects {
		subjects[i] = limiter.Subject{Kind: limiter.SubjectAPIKey, Value: fmt.Sprintf("key-%07d", i)}
	}
	core, err := rebalancer.New(cfg, rebalancer.PolicyMap{"g": lim})
	require.NoError(b, err)
	base := rebalancer.EpochOf(time.Now(), epoch) // usage keys expire relative to real time

	// A gateway of the region, checking one subject against the same
	// redis-server every 2 ms through the limiter (its token-bucket
	// script, as a gateway's Check runs it; no deadline or breaker, so the
	// latency is what Redis and the machine gave it). Each latency is
	// filed under the phase it ended in (probePhase).
	pr := startProbe(ctx, b, srv.Addr())
	defer pr.stop()

	// prepare writes epoch m's usage to Redis and publishes the other
	// regions' reports of m (untimed); it returns the Redis memory the
	// usage of m took. The usage of m-4 is deleted: the gateways' keys
	// live 3 epochs past their own.
	prepare := func(m int64) int64 {
		var old []string
		for s := range limiter.DefaultUsageShards {
			old = append(old, limiter.UsageKey(m-4, s))
		}
		require.NoError(b, client.Del(ctx, old...).Err())
		mem0 := redisMemory(ctx, b, client)
		const chunk = 100_000 // one flush per gateway-sized batch
		counts := make([]limiter.UsageCount, 0, chunk)
		for i, s := range subjects {
			d := int64(100 + 200*((int(m)+i)%period))
			if quiet {
				d = quietDemand // per epoch: 50/s, half the default share
			}
			counts = append(counts, limiter.UsageCount{Epoch: m, PolicyID: "g", Subject: s, Demand: d, Admitted: d / 2})
			if len(counts) == chunk || i == len(subjects)-1 {
				failed, err := gw.WriteUsage(ctx, counts)
				require.NoError(b, err)
				require.Empty(b, failed)
				counts = counts[:0]
			}
		}
		usageMem := redisMemory(ctx, b, client) - mem0
		for j, ad := range others {
			r := &rebalancer.Report{Region: []string{"b", "c"}[j], Epoch: m, Seq: m,
				Heard: []rebalancer.Heard{{Region: "a", Epoch: m - 1}, {Region: "b", Epoch: m}, {Region: "c", Epoch: m}}}
			if quiet {
				// As a Core with Deltas sends them: a full report every
				// FullEvery epochs, and between them deltas against it
				// that list no key (nothing changed).
				r.Started, r.AcceptsDelta = base, true
				if full := base + (m-base)/int64(cfg.FullEvery)*int64(cfg.FullEvery); full != m {
					r.Base = full
					require.NoError(b, ad.Publish(ctx, r))
					continue
				}
			}
			r.Keys = make([]rebalancer.KeyReport, nkeys)
			for i, s := range subjects {
				d := int64(100_000 + 200_000*((int(m)+i+j)%period))
				if quiet {
					d = quietDemand * 1000 * 1000 / epoch.Milliseconds() // the same rate as this region's, milli/s
				}
				r.Keys[i] = rebalancer.KeyReport{Key: rebalancer.Key{PolicyID: "g", Subject: s.Key()},
					Demand: d / 1000 * 10, SmoothedDemandMilli: d, Share: lim.Default(), Want: shares.Share{RateMilli: 1000, BurstMilli: 1000}}
				if quiet {
					r.Keys[i].Want = shares.Share{} // below its default share: it asks for nothing
				}
			}
			require.NoError(b, ad.Publish(ctx, r))
		}
		// Between collections: a second with only the gateway probe.
		pr.setPhase(probeBetween)
		time.Sleep(time.Second)
		return usageMem
	}

	// Per phase: wall time, this process's CPU time (the coordinator's
	// work, plus the in-process kfake broker and any GC it triggers) and
	// redis-server's CPU time (INFO cpu).
	phaseNames := []string{"read", "collect", "shrink", "publish", "consume", "decide", "write"}
	var wall, cpu, rcpu [7]time.Duration
	updates, shrinks := 0, 0
	var mark [8]struct{ wall, cpu, rcpu time.Duration }
	start := time.Now()
	tick := func(i int) {
		mark[i].wall, mark[i].cpu, mark[i].rcpu = time.Since(start), processCPU(b), redisCPU(ctx, b, client)
	}
	var rawBytes int64 // the reports' protobuf size, before compression
	var slowest slowEntry
	var slow []slowEntry // the commands of 1 ms or more, for the log
	over1ms := 0
	var preempted int64 // redis-server's main thread, during the measured epochs
	lastDelta := false  // the last report published was a delta listing no key
	probeOver1ms := 0   // SLOWLOG entries of the probe's commands of 1 ms or more
	step := func(m int64) {
		now := rebalancer.EpochStart(m+1, epoch).Add(time.Second)
		require.NoError(b, client.Do(ctx, "SLOWLOG", "RESET").Err())
		t0, err := srv.MainThreadTimes(ctx)
		require.NoError(b, err)
		tick(0)
		pr.setPhase(probeRead)
		usage, err := src.Usage(ctx, m)
		require.NoError(b, err)
		require.Equal(b, nkeys, len(usage))
		pr.setPhase(probeCoordinator)
		tick(1)
		pub, err := core.Collect(now, usage)
		require.NoError(b, err)
		require.Nil(b, pub.Late)
		usage = nil
		tick(2)
		// The driver writes the shares given up at collection before
		// publishing the report that claims them.
		pr.setPhase(probeWrite)
		require.NoError(b, sink.Write(ctx, pub.Updates))
		pr.setPhase(probeCoordinator)
		tick(3)
		want := 2 // the two other regions' reports
		lastDelta = pub.Report != nil && pub.Report.Base > 0 && len(pub.Report.Keys) == 0
		if pub.Report != nil {
			measuring.Store(true)
			require.NoError(b, self.Publish(ctx, pub.Report))
			measuring.Store(false)
			want = 3
		}
		tick(4)
		for got := 0; got < want; {
			r, err := self.Receive(ctx)
			require.NoError(b, err)
			if r.Epoch != m {
				continue // an earlier epoch's report (first iteration)
			}
			_, err = core.Receive(r)
			require.NoError(b, err)
			got++
		}
		tick(5)
		d, err := core.Decide(now)
		require.NoError(b, err)
		tick(6)
		pr.setPhase(probeWrite)
		require.NoError(b, sink.Write(ctx, d.Updates))
		pr.setPhase(probeFlush) // the next epoch's setup: the gateways' usage flushes
		tick(7)
		// Outside every phase: the measurement's own conversion (it
		// was inside publish until session 22, a third of it at 1M).
		if pub.Report != nil {
			rawBytes += int64(proto.Size(kafkabus.ToProto(pub.Report, epoch, now)))
		}
		t1, err := srv.MainThreadTimes(ctx)
		require.NoError(b, err)
		preempted += t1.Preempted - t0.Preempted
		for i := range phaseNames {
			wall[i] += mark[i+1].wall - mark[i].wall
			cpu[i] += mark[i+1].cpu - mark[i].cpu
			rcpu[i] += mark[i+1].rcpu - mark[i].rcpu
		}
		updates += len(d.Updates)
		shrinks += len(pub.Updates)
		for _, e := range slowLog(ctx, b, client) {
			if strings.HasPrefix(strings.ToUpper(e.cmd), "SLOWLOG") {
				continue // the benchmark's own SLOWLOG RESET, not the coordinator's
			}
			if e.client == probeClient {
				if e.dur >= time.Millisecond {
					probeOver1ms++ // the gateway probe's own commands
				}
				continue
			}
			if e.dur >= time.Millisecond {
				over1ms++
				slow = append(slow, e)
			}
			if e.dur > slowest.dur {
				slowest = e
			}
		}
	}

	// Warm-up: the Core publishes nothing and writes nothing for
	// WarmupEpochs, then grows into its steady state.
	m := base
	for range cfg.WarmupEpochs + 3 {
		prepare(m)
		step(m)
		m++
	}
	if quiet {
		// The shares settle by halves (the damped target): go on until an
		// epoch writes nothing and this region's report is a delta that
		// lists no key (its base settled too). Measure FullEvery epochs
		// (-benchtime 6x) to average over the full reports' cycle.
		for settled := false; !settled; m++ {
			require.Less(b, m-base, int64(80), "the quiet steady state did not settle")
			before := updates + shrinks
			prepare(m)
			step(m)
			settled = updates+shrinks == before && lastDelta
		}
	}
	wall, cpu, rcpu, updates, shrinks = [7]time.Duration{}, [7]time.Duration{}, [7]time.Duration{}, 0, 0
	slowest, over1ms, slow, rawBytes, preempted, probeOver1ms = slowEntry{}, 0, nil, 0, 0, 0
	produced.Store(0)
	pr.reset()
	var usageMem int64
	profile := os.Getenv("QUOTIENT_BENCH_CPUPROFILE")
	n := 0
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		usageMem += prepare(m)
		b.StartTimer()
		if profile != "" && n == 0 {
			// The first measured epoch only: the setup is not profiled.
			f, err := os.Create(profile)
			require.NoError(b, err)
			require.NoError(b, pprof.StartCPUProfile(f))
			step(m)
			pprof.StopCPUProfile()
			require.NoError(b, f.Close())
		} else {
			step(m)
		}
		m++
		n++
	}
	b.StopTimer()
	var total [3]time.Duration
	for i, name := range phaseNames {
		b.ReportMetric(float64(wall[i].Milliseconds())/float64(n), "ms/"+name)
		b.ReportMetric(float64(cpu[i].Milliseconds())/float64(n), "cpu-ms/"+name)
		total[0], total[1], total[2] = total[0]+wall[i], total[1]+cpu[i], total[2]+rcpu[i]
	}
	b.ReportMetric(float64(rcpu[0].Milliseconds())/float64(n), "redis-cpu-ms/read")
	b.ReportMetric(float64((rcpu[2]+rcpu[6]).Milliseconds())/float64(n), "redis-cpu-ms/writes")
	b.ReportMetric(float64(total[0].Milliseconds())/float64(n), "ms/epoch")
	b.ReportMetric(float64(total[1].Milliseconds())/float64(n), "cpu-ms/epoch")
	b.ReportMetric(float64(total[2].Milliseconds())/float64(n), "redis-cpu-ms/epoch")
	b.ReportMetric(float64(updates)/float64(n), "updates/epoch")
	b.ReportMetric(float64(shrinks)/float64(n), "shrinks/epoch")
	b.ReportMetric(float64(produced.Load())/float64(n)/float64(nkeys), "kafka-B/key")
	b.ReportMetric(float64(rawBytes)/float64(n)/float64(nkeys), "kafka-raw-B/key")
	b.ReportMetric(float64(usageMem)/float64(n)/float64(nkeys), "redis-usage-B/key")
	b.ReportMetric(float64(slowest.dur.Microseconds()), "redis-max-us")
	b.ReportMetric(float64(over1ms)/float64(n), "redis-over-1ms/epoch")
	b.ReportMetric(float64(preempted)/float64(n), "redis-preempted/epoch")
	b.ReportMetric(float64(probeOver1ms)/float64(n), "gw-redis-over-1ms/epoch")
	for ph, name := range probeNames {
		lat := pr.latencies(int32(ph))
		if len(lat) == 0 {
			continue
		}
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "gw-p50-us/"+name)
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "gw-p99-us/"+name)
		b.Logf("%d keys: gateway probe during %s: %d checks, p50 %v, p99 %v, max %v", nkeys, name, len(lat), lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1])
	}
	if slowest.dur > 0 {
		b.Logf("%d keys: longest redis command %v: %s", nkeys, slowest.dur, slowest.cmd)
	}
	// Per command name (the log of a benchmark keeps only ten lines).
	byName := map[string][]time.Duration{}
	for _, e := range slow {
		name, _, _ := strings.Cut(strings.ToUpper(e.cmd), " ")
		byName[name] = append(byName[name], e.dur)
	}
	for name, ds := range byName {
		slices.Sort(ds)
		b.Logf("%d keys: %d %s commands of 1 ms or more in the measured epochs: median %v, longest %v", nkeys, len(ds), name, ds[len(ds)/2], ds[len(ds)-1])
	}

	// Memory, after the measured epochs: the share records in Redis (the
	// usage hashes deleted), and the heap the Core retains.
	var keys []string
	for e := m - 5; e < m; e++ {
		for s := range limiter.DefaultUsageShards {
			keys = append(keys, limiter.UsageKey(e, s))
		}
	}
	require.NoError(b, client.Del(ctx, keys...).Err())
	b.ReportMetric(float64(redisMemory(ctx, b, client)-emptyMem)/float64(nkeys), "redis-shares-B/key")
	stop()
	<-done
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	withCore := ms.HeapAlloc
	if path := os.Getenv("QUOTIENT_BENCH_COREHEAP"); path != "" {
		// What the Core retains between epochs, by allocation site.
		f, err := os.Create(path)
		require.NoError(b, err)
		require.NoError(b, pprof.Lookup("heap").WriteTo(f, 0))
		require.NoError(b, f.Close())
	}
	runtime.KeepAlive(core)
	core = nil
	runtime.GC()
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(int64(withCore)-int64(ms.HeapAlloc))/float64(nkeys), "core-B/key")
}

// quietDemand is each key's demand per 10 s epoch in every region in
// BenchmarkEpochScaleQuiet: 50/s, half the default share of benchEpoch's
// limit (300/s over 3 regions).
const quietDemand = 500

// redisMemory returns redis-server's used_memory (INFO memory), bytes.
func redisMemory(ctx context.Context, b *testing.B, c *redis.Client) int64 {
	info, err := c.Info(ctx, "memory").Result()
	require.NoError(b, err)
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(b, err, line)
			return n
		}
	}
	b.Fatalf("no used_memory in INFO memory")
	return 0
}

// slowEntry is one SLOWLOG entry: how long the command ran on
// redis-server and the command with its first argument.
type slowEntry struct {
	dur    time.Duration
	cmd    string
	client string // the client's name (CLIENT SETNAME), if any
}

// slowLog returns every SLOWLOG entry.
func slowLog(ctx context.Context, b *testing.B, c *redis.Client) []slowEntry {
	logs, err := c.SlowLogGet(ctx, -1).Result()
	require.NoError(b, err)
	out := make([]slowEntry, 0, len(logs))
	for _, l := range logs {
		args := l.Args
		if len(args) > 2 {
			args = args[:2]
		}
		out = append(out, slowEntry{dur: l.Duration, cmd: strings.Join(args, " "), client: l.ClientName})
	}
	return out
}

// processCPU returns this process's user and system CPU time so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU returns redis-server's user and system CPU time so far (INFO
// cpu, microsecond resolution).
func redisCPU(ctx context.Context, b *testing.B, c *redis.Client) time.Duration {
	info, err := c.Info(ctx, "cpu").Result()
	require.NoError(b, err)
	var sum time.Duration
	for line := range strings.Lines(info) {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "used_cpu_user" && name != "used_cpu_sys") {
			continue
		}
		sec, err := strconv.ParseFloat(val, 64)
		require.NoError(b, err, line)
		sum += time.Duration(sec * float64(time.Second))
	}
	return sum
}

// benchSink is benchEpoch's share sink: redisio.NewSink's defaults, or
// QUOTIENT_BENCH_SINK_BATCH updates a pipeline and QUOTIENT_BENCH_SINK_WRITERS
// pipelines in flight when set (to compare them).
func benchSink(client redis.UniversalClient) *redisio.Sink {
	batch, _ := strconv.Atoi(os.Getenv("QUOTIENT_BENCH_SINK_BATCH"))
	s := redisio.NewSink(client, batch)
	if w, err := strconv.Atoi(os.Getenv("QUOTIENT_BENCH_SINK_WRITERS")); err == nil {
		s.SetWriters(w)
	}
	return s
}
