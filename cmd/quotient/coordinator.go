package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/region"
)

// runCoordinator implements `quotient coordinator`: it runs one region's
// epoch loop (package region) until the context ends (SIGINT or SIGTERM in
// main), then shuts down gracefully. Exit status: 0 after a clean shutdown,
// 1 when the coordinator fails, 2 on bad flags, environment or policy file.
func runCoordinator(ctx context.Context, env environment, args []string) int {
	var cfg coordinatorConfig
	fs := coordinatorFlagSet(&cfg)
	fs.SetOutput(env.stderr)
	fs.Usage = func() {
		fmt.Fprintln(env.stderr, "usage: quotient coordinator --region NAME --regions A,B,C --redis ADDR[,...] --kafka ADDR[,...] --policies FILE [flags]")
		fmt.Fprintln(env.stderr, "\nRuns one region's coordinator: every epoch it collects the gateways' usage from Redis,")
		fmt.Fprintln(env.stderr, "exchanges usage reports over Kafka and writes this region's shares of global limits to Redis;")
		fmt.Fprintln(env.stderr, "every second it replicates this region's counts of global fixed windows (daily quotas) over Kafka.")
		fmt.Fprintln(env.stderr, "Every flag can be set by QUOTIENT_<FLAG> (e.g. QUOTIENT_REDIS_CLUSTER); the command line wins.")
		fmt.Fprintln(env.stderr, "\nflags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, env.lookupEnv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(env.stderr, "quotient coordinator:", err)
		return 2
	}
	rc, err := coordinatorRegionConfig(cfg, env)
	if err != nil {
		fmt.Fprintln(env.stderr, "quotient coordinator:", err)
		return 2
	}
	c, err := region.New(rc)
	if err != nil {
		fmt.Fprintln(env.stderr, "quotient coordinator:", err)
		return 2
	}
	if err := c.Run(ctx); err != nil {
		fmt.Fprintln(env.stderr, "quotient coordinator:", err)
		return 1
	}
	return 0
}

// coordinatorRegionConfig checks the flags and builds the coordinator's
// configuration; errors name the flag.
func coordinatorRegionConfig(cfg coordinatorConfig, env environment) (region.Config, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.logLevel)); err != nil {
		return region.Config{}, fmt.Errorf("--log-level %q: want debug, info, warn or error", cfg.logLevel)
	}
	rc := region.DefaultConfig()
	rc.Region, rc.Regions = cfg.region, splitList(cfg.regions)
	rc.RedisAddrs, rc.RedisCluster, rc.KafkaBrokers = splitList(cfg.redis), cfg.redisCluster, splitList(cfg.kafka)
	rc.Listen, rc.Epoch, rc.MaxWait, rc.CollectDelay = cfg.listen, cfg.epoch, cfg.maxWait, cfg.collectDelay
	rc.Topic, rc.Mirrored, rc.UsageShards = cfg.topic, cfg.mirrored, cfg.usageShards
	rc.Logger = slog.New(slog.NewJSONHandler(env.stderr, &slog.HandlerOptions{Level: level}))
	switch {
	case cfg.region == "":
		return rc, errors.New("--region is required")
	case len(rc.Regions) == 0:
		return rc, errors.New("--regions is required")
	case len(rc.RedisAddrs) == 0:
		return rc, errors.New("--redis is empty")
	case len(rc.KafkaBrokers) == 0:
		return rc, errors.New("--kafka is empty")
	case cfg.redisCluster && len(rc.RedisAddrs) != 1:
		return rc, fmt.Errorf("--redis-cluster wants one configuration endpoint in --redis, got %d addresses", len(rc.RedisAddrs))
	case cfg.usageShards < 1:
		return rc, fmt.Errorf("--usage-shards %d: want at least 1", cfg.usageShards)
	case cfg.policies == "":
		return rc, errors.New("--policies is required: the JSON policy file whose scope:global policies are shared")
	}
	data, err := os.ReadFile(cfg.policies)
	if err != nil {
		return rc, fmt.Errorf("--policies: %w", err)
	}
	pols, err := limiter.ParsePolicies(data)
	if err != nil {
		return rc, fmt.Errorf("--policies %s: %w", cfg.policies, err)
	}
	rc.Policies = pols
	return rc, nil
}
