package main

import (
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rls"
	"github.com/quotientlabs/quotient/rls/quota"
)

// rlqsFlags are the flags of the rate limit quota service that
// `quotient rls` serves next to ShouldRateLimit.
type rlqsFlags struct {
	enabled      bool
	ttl          time.Duration
	inFlight     time.Duration
	threshold    float64
	idle         time.Duration
	shareRefresh time.Duration
	replicas     int
	warmUp       bool
}

func (f *rlqsFlags) register(fs *flag.FlagSet) {
	d := quota.DefaultConfig()
	fs.BoolVar(&f.enabled, "rlqs", true, "also serve the rate limit quota service (envoy.service.rate_limit_quota.v3, StreamRateLimitQuotas)")
	fs.DurationVar(&f.ttl, "rlqs-ttl", d.TTL, "assignment_time_to_live of every RLQS assignment; longer than the Envoys' reporting_interval (2x or more)")
	fs.DurationVar(&f.inFlight, "rlqs-in-flight", d.InFlight, "bound on an assignment's time from decision to Envoy; assignments stay reserved for TTL plus this")
	fs.Float64Var(&f.threshold, "rlqs-threshold", float64(d.ThresholdPermille)/1000, "re-send an assignment when its target moves by more than this fraction; extend it otherwise")
	fs.DurationVar(&f.idle, "rlqs-idle-timeout", d.IdleTimeout, "abandon an Envoy's bucket after it reported no request for this long")
	fs.DurationVar(&f.shareRefresh, "rlqs-share-refresh", time.Second, "how often the share records of active buckets are read")
	fs.IntVar(&f.replicas, "rlqs-replicas", 1, "RLQS replicas of the region; above 1, they split each share by their Envoys' demand through claims in the region's Redis")
	fs.BoolVar(&f.warmUp, "rlqs-warm-up", true, "grant nothing for --rlqs-ttl plus --rlqs-in-flight after start, so assignments of a crashed predecessor run out first")
}

func (f *rlqsFlags) validate() error {
	switch {
	case f.threshold < 0 || f.threshold > 1:
		return fmt.Errorf("--rlqs-threshold must be in [0, 1], got %v", f.threshold)
	case f.replicas < 1:
		return fmt.Errorf("--rlqs-replicas must be >= 1, got %d", f.replicas)
	case f.shareRefresh <= 0:
		return fmt.Errorf("--rlqs-share-refresh must be > 0, got %v", f.shareRefresh)
	case f.ttl <= f.inFlight:
		// Not an error of Validate, but an assignment that lives less than
		// its delivery bound is a configuration mistake.
		return fmt.Errorf("--rlqs-ttl (%v) must be longer than --rlqs-in-flight (%v)", f.ttl, f.inFlight)
	}
	if err := f.config().Validate(); err != nil {
		return fmt.Errorf("--rlqs-*: %w", err)
	}
	return nil
}

func (f *rlqsFlags) config() quota.Config {
	c := quota.DefaultConfig()
	c.TTL, c.InFlight, c.IdleTimeout = f.ttl, f.inFlight, f.idle
	c.ThresholdPermille = int64(f.threshold*1000 + 0.5)
	return c
}

// newQuotaServer builds the RLQS server of `quotient rls` on the same
// configuration, Redis and region set as its RLS server.
func newQuotaServer(cfg *rlsConfig, stack *limiterStack, srv *rls.Server, log *slog.Logger, reg prometheus.Registerer) (*quota.Server, error) {
	var claims quota.ReplicaStore
	if cfg.quota.replicas > 1 {
		id := quota.NewReplicaID()
		log.Info("rlqs: replicas split shares by demand through the region's Redis", "replica", id, "replicas", cfg.quota.replicas)
		claims = &quota.RedisClaims{Client: stack.client, Replica: id}
	}
	return quota.NewServer(quota.ServerConfig{
		Claims: claims,
		Config: srv.Config,
		Policy: func(id string) *limiter.Policy {
			for _, p := range stack.limiter.Policies() { // the rls.Server's set
				if p.ID == id {
					return p
				}
			}
			return nil
		},
		Shares: &quota.RedisShares{Client: stack.client},
		Usage:  cfg.usageSink(stack.client),
		Regions: func() int {
			_, n := stack.limiter.RegionSetting()
			return n
		},
		Replicas:     cfg.quota.replicas,
		SkipWarmUp:   !cfg.quota.warmUp,
		Quota:        cfg.quota.config(),
		UsageEpoch:   cfg.epoch,
		ShareRefresh: cfg.quota.shareRefresh,
		UsageFlush:   cfg.usageFlush,
		UsageMaxKeys: cfg.usageMaxKeys,
		Metrics:      reg,
		Logger:       log,
		Clock:        stack.clock,
	})
}
