package region

import (
	"fmt"
	"log/slog"

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
// Kafka (dailyquota/kafkarepl on Config.DailyQuotaTopic). It is nil when
// the policies hold no global fixed window.
type dailyQuota struct {
	driver *dailyquota.Driver
	bus    *kafkarepl.Bus
}

// newDailyQuota builds the replication of policies' global fixed windows,
// or returns nil when there is none. It does no I/O. rc and kc belong to
// the coordinator; the returned bus must be closed (close) before kc.
func newDailyQuota(cfg Config, rc redis.UniversalClient, kc *kafkautil.Cluster, log *slog.Logger, reg prometheus.Registerer) (*dailyQuota, error) {
	pols := dqredis.Policies(cfg.Policies)
	if len(pols) == 0 {
		return nil, nil
	}
	bcfg := kafkarepl.DefaultConfig()
	bcfg.Topic = cfg.DailyQuotaTopic
	if cfg.Mirrored {
		bcfg.ConsumeTopics = kafkarepl.MirroredTopics(cfg.DailyQuotaTopic, others(cfg)...)
	}
	bus, err := kafkarepl.New(kc, bcfg)
	if err != nil {
		return nil, err
	}
	dcfg := dailyquota.DefaultDriverConfig(cfg.Region, cfg.Regions, pols)
	dcfg.Logger = log
	// The gateways' usage epoch is the rebalance epoch: the rebalancer
	// collects their usage per epoch too.
	active := dqredis.NewActive(rc, cfg.Epoch, cfg.UsageShards)
	drv, err := dailyquota.NewDriver(dcfg, dqredis.NewStore(limiter.NewRedisStore(rc)), active, bus)
	if err != nil {
		_ = bus.Close()
		return nil, fmt.Errorf("region: daily quota: %w", err)
	}
	dq := &dailyQuota{driver: drv, bus: bus}
	dq.register(reg)
	return dq, nil
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
			func() float64 { return float64(f(dq.driver.Stats())) })
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
			func() float64 { return float64(dq.driver.Stats().LagMaxMs) / 1000 }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "quotient_dailyquota_lag_mean_seconds", Help: "Mean replication lag of other regions' counts since start."},
			func() float64 {
				s := dq.driver.Stats()
				if s.LagN == 0 {
					return 0
				}
				return float64(s.LagSumMs) / float64(s.LagN) / 1000
			}),
	)
}

// close flushes and closes the bus's writer.
func (dq *dailyQuota) close() error { return dq.bus.Close() }
