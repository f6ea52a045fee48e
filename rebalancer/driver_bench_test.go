package rebalancer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

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
// the changed shares to redis-server (pipelined script calls). Demand
// alternates every epoch so every key's share changes (the worst case for
// the write in the all-change case). The other regions' reports are published untimed; consuming
// them is timed. Per-phase costs are reported as ms/<phase>.
//
// Sub-benchmarks: "all-change" alternates demand every epoch so that every
// key's share changes (worst case for the write); "steady" keeps demand
// constant, so after convergence few shares change.
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

	var phases [6]time.Duration // read, collect, publish, consume, decide, write
	updates := 0
	step := func(m int64) {
		now := rebalancer.EpochStart(m+1, epoch).Add(time.Second)
		t0 := time.Now()
		usage, err := src.Usage(ctx, m)
		require.NoError(b, err)
		require.Equal(b, nkeys, len(usage))
		t1 := time.Now()
		pub, err := core.Collect(now, usage)
		require.NoError(b, err)
		t2 := time.Now()
		want := 2 // the two other regions' reports
		if pub.Report != nil {
			require.NoError(b, self.Publish(ctx, pub.Report))
			want = 3
		}
		t3 := time.Now()
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
		t4 := time.Now()
		d, err := core.Decide(now)
		require.NoError(b, err)
		t5 := time.Now()
		require.NoError(b, sink.Write(ctx, d.Updates))
		t6 := time.Now()
		for i, x := range []time.Duration{t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), t4.Sub(t3), t5.Sub(t4), t6.Sub(t5)} {
			phases[i] += x
		}
		updates += len(d.Updates)
	}

	// Warm-up: the Core publishes nothing and writes nothing for
	// WarmupEpochs, then grows into its steady state.
	m := base
	for range cfg.WarmupEpochs + 3 {
		prepare(m)
		step(m)
		m++
	}
	phases, updates = [6]time.Duration{}, 0
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
	for i, name := range []string{"read", "collect", "publish", "consume", "decide", "write"} {
		b.ReportMetric(float64(phases[i].Milliseconds())/float64(n), "ms/"+name)
	}
	b.ReportMetric(float64(updates)/float64(n), "updates/epoch")
}
