package rebalancer_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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
// (Core.Decide) and write (the decision's updates).
//
// Sub-benchmarks: "all-change" alternates demand every epoch so that every
// key's share changes (worst case for the write); "steady" keeps demand
// constant, but in the few epochs measured after warm-up the shares are
// still converging, so it writes every key too (see updates/epoch).
// Run with -benchtime 2x: each iteration is one 100k-key epoch, and the
// setup (usage flushes, the other regions' reports) is not timed.
func BenchmarkEpoch100kKeys(b *testing.B) {
	b.Run("all-change", func(b *testing.B) { benchEpoch(b, 2) })
	b.Run("steady", func(b *testing.B) { benchEpoch(b, 1) })
}

// benchEpoch runs the benchmark; demand cycles with period (1: constant).
func benchEpoch(b *testing.B, period int) {
	const nkeys = 100_000
	epoch := 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(b, err)
	defer kc.Close()
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
	client := srv.Client()
	gw := limiter.NewRedisUsageSink(client, 0, epoch, 100)
	src, sink := redisio.NewSource(client, 0), redisio.NewSink(client, 0)

	lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 3}
	cfg := rebalancer.DefaultConfig()
	cfg.Region, cfg.Regions, cfg.Epoch = "a", []string{"a", "b", "c"}, epoch
	core, err := rebalancer.New(cfg, rebalancer.PolicyMap{"g": lim})
	require.NoError(b, err)

	subjects := make([]limiter.Subject, nkeys)
	for i := range subjects {
		subjects[i] = limiter.Subject{Kind: limiter.SubjectAPIKey, Value: fmt.Sprintf("key-%07d", i)}
	}
	base := rebalancer.EpochOf(time.Now(), epoch) // usage keys expire relative to real time

	// prepare writes epoch m's usage to Redis and publishes the other
	// regions' reports of m (untimed).
	prepare := func(m int64) {
		counts := make([]limiter.UsageCount, nkeys)
		for i, s := range subjects {
			d := int64(100 + 200*((int(m)+i)%period))
			counts[i] = limiter.UsageCount{Epoch: m, PolicyID: "g", Subject: s, Demand: d, Admitted: d / 2}
		}
		failed, err := gw.WriteUsage(ctx, counts)
		require.NoError(b, err)
		require.Empty(b, failed)
		for j, ad := range others {
			r := &rebalancer.Report{Region: []string{"b", "c"}[j], Epoch: m, Seq: m,
				Heard: []rebalancer.Heard{{Region: "a", Epoch: m - 1}, {Region: "b", Epoch: m}, {Region: "c", Epoch: m}}}
			r.Keys = make([]rebalancer.KeyReport, nkeys)
			for i, s := range subjects {
				d := int64(100_000 + 200_000*((int(m)+i+j)%period))
				r.Keys[i] = rebalancer.KeyReport{Key: rebalancer.Key{PolicyID: "g", Subject: s.Key()},
					Demand: d / 1000 * 10, SmoothedDemandMilli: d, Share: lim.Default(), Want: shares.Share{RateMilli: 1000, BurstMilli: 1000}}
			}
			require.NoError(b, ad.Publish(ctx, r))
		}
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
	step := func(m int64) {
		now := rebalancer.EpochStart(m+1, epoch).Add(time.Second)
		tick(0)
		usage, err := src.Usage(ctx, m)
		require.NoError(b, err)
		require.Equal(b, nkeys, len(usage))
		tick(1)
		pub, err := core.Collect(now, usage)
		require.NoError(b, err)
		require.Nil(b, pub.Late)
		tick(2)
		// The driver writes the shares given up at collection before
		// publishing the report that claims them.
		require.NoError(b, sink.Write(ctx, pub.Updates))
		tick(3)
		want := 2 // the two other regions' reports
		if pub.Report != nil {
			require.NoError(b, self.Publish(ctx, pub.Report))
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
		require.NoError(b, sink.Write(ctx, d.Updates))
		tick(7)
		for i := range phaseNames {
			wall[i] += mark[i+1].wall - mark[i].wall
			cpu[i] += mark[i+1].cpu - mark[i].cpu
			rcpu[i] += mark[i+1].rcpu - mark[i].rcpu
		}
		updates += len(d.Updates)
		shrinks += len(pub.Updates)
	}

	// Warm-up: the Core publishes nothing and writes nothing for
	// WarmupEpochs, then grows into its steady state.
	m := base
	for range cfg.WarmupEpochs + 3 {
		prepare(m)
		step(m)
		m++
	}
	wall, cpu, rcpu, updates, shrinks = [7]time.Duration{}, [7]time.Duration{}, [7]time.Duration{}, 0, 0
	n := 0
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		prepare(m)
		b.StartTimer()
		step(m)
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
	b.ReportMetric(float64(total[1].Milliseconds())/float64(n), "cpu-ms/epoch")
	b.ReportMetric(float64(total[2].Milliseconds())/float64(n), "redis-cpu-ms/epoch")
	b.ReportMetric(float64(updates)/float64(n), "updates/epoch")
	b.ReportMetric(float64(shrinks)/float64(n), "shrinks/epoch")
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
