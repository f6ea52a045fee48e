package rebalancer_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
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

// partsBenchParts is the part count of BenchmarkPartsEpoch.
const partsBenchParts = 4

// BenchmarkPartsEpoch measures issue 15's split: one all-change epoch of
// 100,000 active keys of 3 regions (QUOTIENT_BENCH_PARTS_KEYS overrides
// the count) split into 4 key parts, as run by one replica of region a's
// coordinator when the region runs 1, 2 or 4 replicas (so it runs 4, 2 or
// 1 parts: those p with p mod replicas == 0), and the same epoch without
// parts (parts=1, one replica: today's coordinator) as the baseline. For each of its parts, in
// turn, it reads the part's usage shards from redis-server (16,384 shard
// hashes, 1/4 of them per part), Collects, writes the shrinks, publishes
// the part's report through kfake, receives the part's three reports
// (its own and the other regions', published untimed), Decides and
// writes the updates, as the part's driver does. The replicas are
// symmetric, so one replica's cost is every replica's.
//
// It reports cpu-ms/replica (this process's CPU time over the replica's
// parts from the usage read to the decision's writes, its own report's
// consumption included: the coordinator's work plus the in-process
// broker's share and the GC), consume-cpu-ms/replica (the replica's part
// consumers, started for the epoch on a new bus, reading the other
// regions' reports of the epoch from their parts' partitions only: the
// topic has max(3, parts) partitions, as the coordinator creates it),
// redis-cpu-ms/replica, wall-ms/replica (the parts run one after the
// other here; a replica runs them concurrently), keys/replica, cpu-us/key
// (cpu-ms/replica over the keys the replica decides) and all-cpu-us/key
// (with the consumption). Not timed: the gateways' usage flushes and the
// other regions' publications. Run with -benchtime 2x under the
// machine-wide benchmark lock.
func BenchmarkPartsEpoch(b *testing.B) {
	nkeys := 100_000
	if s := os.Getenv("QUOTIENT_BENCH_PARTS_KEYS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(b, err)
		nkeys = n
	}
	// The baseline: one part (no split), one replica.
	b.Run("parts=1/replicas=1", func(b *testing.B) { benchParts(b, nkeys, 1, 1) })
	for _, replicas := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("parts=%d/replicas=%d", partsBenchParts, replicas), func(b *testing.B) {
			benchParts(b, nkeys, partsBenchParts, replicas)
		})
	}
}

func benchParts(b *testing.B, nkeys, parts, replicas int) {
	const epoch = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(b, err)
	defer kc.Close()
	// newBus returns a bus whose consumers start lookback ago, and its
	// closer.
	newBus := func(lookback time.Duration) (*kafkabus.Bus, func()) {
		cl, err := kafkautil.New(kafkautil.DefaultConfig(kc.ListenAddrs()...))
		require.NoError(b, err)
		cfg := kafkabus.DefaultConfig()
		cfg.TopicPollInterval = 100 * time.Millisecond
		cfg.Lookback = lookback
		// As region.Coordinator creates it: a partition per part, so each
		// part's consumer reads only its own (kafkabus.Bus.RunPart).
		cfg.Partitions = max(cfg.Partitions, parts)
		bus, err := kafkabus.New(cl, cfg)
		require.NoError(b, err)
		return bus, func() { _ = bus.Close(); _ = cl.Close() }
	}
	var owned []int
	for p := range parts {
		if p%replicas == 0 {
			owned = append(owned, p)
		}
	}
	// Every part of the other regions publishes on otherBus. This
	// replica's parts share one bus (as in region.Coordinator), a new one
	// each epoch whose consumers start at the epoch's first report, so
	// that consuming an epoch's reports is measured (consume-cpu-ms).
	otherBus, closeOther := newBus(time.Minute)
	defer closeOther()
	others := make([]*kafkabus.Adapter, parts)
	for p := range others {
		others[p], err = kafkabus.NewPartAdapter(otherBus, epoch, nil, p, parts)
		require.NoError(b, err)
	}

	srv := redistest.StartServer(b)
	client := srv.Client()
	flushClient := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	defer flushClient.Close()
	gw := limiter.NewRedisUsageSink(flushClient, 0, epoch, 100)
	sink := redisio.NewSink(client, 0)
	lim := shares.Limit{RateMilli: 300_000, BurstMilli: 300_000, Regions: 3}
	cfg := rebalancer.DefaultConfig()
	cfg.Region, cfg.Regions, cfg.Epoch = "a", []string{"a", "b", "c"}, epoch

	subjects := make([]limiter.Subject, nkeys)
	byPart := make([][]int, parts) // subject indexes by part
	for i := range subjects {
		subjects[i] = limiter.Subject{Kind: limiter.SubjectAPIKey, Value: fmt.Sprintf("key-%07d", i)}
		p := limiter.UsagePart("g", subjects[i].Key(), parts)
		byPart[p] = append(byPart[p], i)
	}
	cores, srcs := map[int]*rebalancer.Core{}, map[int]*redisio.Source{}
	keysHere := 0
	for _, p := range owned {
		cores[p], err = rebalancer.New(cfg, rebalancer.PolicyMap{"g": lim})
		require.NoError(b, err)
		srcs[p] = redisio.NewLayoutSource(client, limiter.UsageLayout{Shards: limiter.DefaultUsageShards, Parts: parts, Part: p})
		keysHere += len(byPart[p])
	}
	base := rebalancer.EpochOf(time.Now(), epoch)
	const period = 2 // demand alternates: every share changes

	var published time.Time // when prepare started publishing the others' reports
	prepare := func(m int64) {
		var old []string
		for s := range limiter.DefaultUsageShards {
			old = append(old, limiter.UsageKey(m-4, s))
		}
		require.NoError(b, client.Del(ctx, old...).Err())
		const chunk = 100_000
		counts := make([]limiter.UsageCount, 0, chunk)
		for i, s := range subjects {
			d := int64(100 + 200*((int(m)+i)%period))
			counts = append(counts, limiter.UsageCount{Epoch: m, PolicyID: "g", Subject: s, Demand: d, Admitted: d / 2})
			if len(counts) == chunk || i == len(subjects)-1 {
				failed, err := gw.WriteUsage(ctx, counts)
				require.NoError(b, err)
				require.Empty(b, failed)
				counts = counts[:0]
			}
		}
		published = time.Now()
		for j, region := range []string{"b", "c"} {
			for p, ad := range others {
				r := &rebalancer.Report{Region: region, Epoch: m, Seq: m,
					Heard: []rebalancer.Heard{{Region: "a", Epoch: m - 1}, {Region: "b", Epoch: m}, {Region: "c", Epoch: m}}}
				r.Keys = make([]rebalancer.KeyReport, 0, len(byPart[p]))
				for _, i := range byPart[p] {
					d := int64(100_000 + 200_000*((int(m)+i+j)%period))
					r.Keys = append(r.Keys, rebalancer.KeyReport{Key: rebalancer.Key{PolicyID: "g", Subject: subjects[i].Key()},
						Demand: d / 1000 * 10, SmoothedDemandMilli: d, Share: lim.Default(), Want: shares.Share{RateMilli: 1000, BurstMilli: 1000}})
				}
				require.NoError(b, ad.Publish(ctx, r))
			}
		}
		time.Sleep(time.Second) // the broker settles
	}

	var cpu, rcpu, wall, ccpu time.Duration
	epochs := 0
	step := func(m int64, timed bool) {
		now := rebalancer.EpochStart(m+1, epoch).Add(time.Second)
		// Consume: this replica's part consumers read the others' reports
		// of epoch m (and skip the other parts' messages).
		k0 := processCPU(b)
		selfBus, closeSelf := newBus(time.Since(published) + 100*time.Millisecond)
		defer closeSelf()
		runCtx, stop := context.WithCancel(ctx)
		defer stop()
		self := map[int]*kafkabus.Adapter{}
		pending := map[int][]*rebalancer.Report{}
		for _, p := range owned {
			ad, err := kafkabus.NewPartAdapter(selfBus, epoch, nil, p, parts)
			require.NoError(b, err)
			self[p] = ad
			go func() { _ = ad.Run(runCtx) }()
		}
		for _, p := range owned {
			for len(pending[p]) < 2 {
				r, err := self[p].Receive(ctx)
				require.NoError(b, err)
				if r.Epoch == m && r.Region != "a" {
					pending[p] = append(pending[p], r)
				}
			}
		}
		if timed {
			ccpu += processCPU(b) - k0
		}
		c0, r0, w0 := processCPU(b), redisCPU(ctx, b, client), time.Now()
		for _, p := range owned {
			usage, err := srcs[p].Usage(ctx, m)
			require.NoError(b, err)
			require.Equal(b, len(byPart[p]), len(usage), "part %d's usage", p)
			pub, err := cores[p].Collect(now, usage)
			require.NoError(b, err)
			require.NoError(b, sink.Write(ctx, pub.Updates))
			for _, r := range pending[p] {
				_, err := cores[p].Receive(r)
				require.NoError(b, err)
			}
			if pub.Report != nil {
				require.NoError(b, self[p].Publish(ctx, pub.Report))
				for {
					r, err := self[p].Receive(ctx)
					require.NoError(b, err)
					if r.Epoch == m && r.Region == "a" {
						_, err = cores[p].Receive(r)
						require.NoError(b, err)
						break
					}
				}
			}
			d, err := cores[p].Decide(now)
			require.NoError(b, err)
			require.NoError(b, sink.Write(ctx, d.Updates))
		}
		if timed {
			cpu += processCPU(b) - c0
			rcpu += redisCPU(ctx, b, client) - r0
			wall += time.Since(w0)
			epochs++
		}
	}
	// Warm-up epochs (untimed): the Cores start fresh and converge.
	m := base
	for range cfg.WarmupEpochs + 1 {
		prepare(m)
		step(m, false)
		m++
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		prepare(m)
		b.StartTimer()
		step(m, true)
		m++
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(epochs) }
	b.ReportMetric(ms(cpu), "cpu-ms/replica")
	b.ReportMetric(ms(ccpu), "consume-cpu-ms/replica")
	b.ReportMetric((ms(cpu)+ms(ccpu))*1000/float64(keysHere), "all-cpu-us/key")
	b.ReportMetric(ms(rcpu), "redis-cpu-ms/replica")
	b.ReportMetric(ms(wall), "wall-ms/replica")
	b.ReportMetric(float64(keysHere), "keys/replica")
	b.ReportMetric(ms(cpu)*1000/float64(keysHere), "cpu-us/key")
}
