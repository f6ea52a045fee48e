package region

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/dailyquota"
	"github.com/quotientlabs/quotient/dailyquota/kafkarepl"
	dqredis "github.com/quotientlabs/quotient/dailyquota/redisio"
	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/limiter"
)

// dailyQuota is the coordinator's replication of global fixed-window
// policies (daily quotas, issue 6): the production dailyquota.Driver over
// this region's Redis (dailyquota/redisio: the limiter's own window
// scripts, and the gateways' usage counts to find the active keys) and
// Kafka (dailyquota/kafkarepl on Config.DailyQuotaTopic). run runs it while
// this replica leads, for the windows among the policies in force, and
// restarts it (a new driver and bus) when they change; it idles while
// there is none. Its metrics add up the drivers' counters across restarts.
type dailyQuota struct {
	cfg    Config
	kc     *kafkautil.Cluster
	log    *slog.Logger
	store  *dqredis.Store
	active *dqredis.Active

	mu   sync.Mutex
	cur  *dailyquota.Driver
	base dailyquota.Stats // counters of the drivers that ended
}

// newDailyQuota returns the replication and registers its metrics. It does
// no I/O. rc and kc belong to the coordinator.
func newDailyQuota(cfg Config, rc redis.UniversalClient, kc *kafkautil.Cluster, log *slog.Logger, reg prometheus.Registerer) *dailyQuota {
	dq := &dailyQuota{
		cfg: cfg, kc: kc, log: log,
		store: dqredis.NewStore(limiter.NewRedisStore(rc)),
		// The gateways' usage epoch is the rebalance epoch: the rebalancer
		// collects their usage per epoch too.
		active: dqredis.NewActiveLayout(rc, cfg.Epoch, limiter.UsageLayout{Shards: cfg.UsageShards, SplitShards: cfg.UsageSplitShards}),
	}
	dq.register(reg)
	return dq
}

// build returns a driver of pols over a new bus; the caller closes the bus.
func (dq *dailyQuota) build(pols []dailyquota.Policy) (*dailyquota.Driver, *kafkarepl.Bus, error) {
	cfg := dq.cfg
	bcfg := kafkarepl.DefaultConfig()
	bcfg.Topic = cfg.DailyQuotaTopic
	bcfg.Now = cfg.Clock.Now
	if cfg.Mirrored {
		bcfg.ConsumeTopics = kafkarepl.MirroredTopics(cfg.DailyQuotaTopic, others(cfg)...)
	}
	bus, err := kafkarepl.New(dq.kc, bcfg)
	if err != nil {
		return nil, nil, err
	}
	dcfg := dailyquota.DefaultDriverConfig(cfg.Region, cfg.Regions, pols)
	dcfg.Logger = dq.log
	dcfg.Clock = cfg.Clock
	drv, err := dailyquota.NewDriver(dcfg, dq.store, dq.active, bus)
	if err != nil {
		_ = bus.Close()
		return nil, nil, fmt.Errorf("region: daily quota: %w", err)
	}
	return drv, bus, nil
}

// run replicates the windows among ps's policies until ctx ends, restarting
// on every change of them; it returns ctx.Err(), or a build error (a bad
// configuration: the caller logs it and calls run again later).
func (dq *dailyQuota) run(ctx context.Context, ps *policySet) error {
	select { // a change before now is seen by windowPolicies below
	case <-ps.changed:
	default:
	}
	for {
		pols := ps.windowPolicies()
		if len(pols) == 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-ps.changed:
				continue
			}
		}
		drv, bus, err := dq.build(pols)
		if err != nil {
			return err
		}
		dctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		dq.mu.Lock()
		dq.cur = drv
		dq.mu.Unlock()
		dq.log.Info("region: daily-quota replication running", "policies", len(pols))
		go func() {
			defer close(done)
			_ = drv.Run(dctx) // returns dctx.Err(); restarts its consumer itself
		}()
		select {
		case <-ctx.Done():
		case <-ps.changed:
			dq.log.Info("region: replicated fixed windows changed; restarting daily-quota replication", "policies", len(ps.windowPolicies()))
		}
		cancel()
		stopping := time.Now()
		<-done
		if err := bus.Close(); err != nil {
			dq.log.Warn("region: close daily-quota bus", "err", err)
		}
		if d := time.Since(stopping); d > time.Second {
			dq.log.Warn("region: daily-quota replication took long to stop", "took", d)
		}
		dq.mu.Lock()
		dq.base = addStats(dq.base, drv.Stats())
		dq.cur = nil
		dq.mu.Unlock()
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// stats are the counters of every driver run so far.
func (dq *dailyQuota) stats() dailyquota.Stats {
	dq.mu.Lock()
	defer dq.mu.Unlock()
	if dq.cur == nil {
		return dq.base
	}
	return addStats(dq.base, dq.cur.Stats())
}

func addStats(a, b dailyquota.Stats) dailyquota.Stats {
	return dailyquota.Stats{
		Passes: a.Passes + b.Passes, Published: a.Published + b.Published, PublishFailures: a.PublishFailures + b.PublishFailures,
		Received: a.Received + b.Received, Merged: a.Merged + b.Merged, Expired: a.Expired + b.Expired,
		Invalid: a.Invalid + b.Invalid, MergeFailures: a.MergeFailures + b.MergeFailures, CapsSet: a.CapsSet + b.CapsSet,
		LagMaxMs: max(a.LagMaxMs, b.LagMaxMs), LagSumMs: a.LagSumMs + b.LagSumMs, LagN: a.LagN + b.LagN,
	}
}

// others returns every region but this one.
func others(cfg Config) []string {
	var out []string
	for _, r := range cfg.Regions {
		if r != cfg.Region {
			out = append(out, r)
		}
	}
	return out
}

// register exposes the driver's and the bus's counters:
// quotient_dailyquota_*_total, and the replication lag of other regions'
// counts (receive time minus the sender's read time, by this region's
// clock) as its maximum and mean in seconds.
func (dq *dailyQuota) register(reg prometheus.Registerer) {
	counter := func(name, help string, f func(dailyquota.Stats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "quotient_dailyquota_" + name + "_total", Help: help},
			func() float64 { return float64(f(dq.stats())) })
	}
	reg.MustRegister(
		counter("passes", "Publish passes run.", func(s dailyquota.Stats) int64 { return s.Passes }),
		counter("published", "Window counts of this region acknowledged by Kafka.", func(s dailyquota.Stats) int64 { return s.Published }),
		counter("publish_failures", "Failed publish calls (the counts are offered again next pass).", func(s dailyquota.Stats) int64 { return s.PublishFailures }),
		counter("received", "Window counts read from Kafka, every region's.", func(s dailyquota.Stats) int64 { return s.Received }),
		counter("merged", "Window counts max-merged into this region's Redis.", func(s dailyquota.Stats) int64 { return s.Merged }),
		counter("expired", "Received counts of ended windows, dropped.", func(s dailyquota.Stats) int64 { return s.Expired }),
		counter("invalid", "Received counts rejected (malformed, unknown policy, misaligned window).", func(s dailyquota.Stats) int64 { return s.Invalid }),
		counter("merge_failures", "Failed merges into Redis (retried next pass).", func(s dailyquota.Stats) int64 { return s.MergeFailures }),
		counter("caps_set", "Remainder-split caps set or removed in this region's Redis.", func(s dailyquota.Stats) int64 { return s.CapsSet }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "quotient_dailyquota_lag_max_seconds", Help: "Largest replication lag seen of another region's count (receive time - sender's read time)."},
			func() float64 { return float64(dq.stats().LagMaxMs) / 1000 }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "quotient_dailyquota_lag_mean_seconds", Help: "Mean replication lag of other regions' counts since start."},
			func() float64 {
				s := dq.stats()
				if s.LagN == 0 {
					return 0
				}
				return float64(s.LagSumMs) / float64(s.LagN) / 1000
			}),
	)
}
