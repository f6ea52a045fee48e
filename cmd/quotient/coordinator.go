package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"

	"github.com/quotientlabs/quotient/internal/redisconn"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/region"
	"github.com/quotientlabs/quotient/region/admin"
	"github.com/quotientlabs/quotient/region/membership"
)

// runCoordinator implements `quotient coordinator`: it runs one region's
// epoch loop (package region) until the context ends (SIGINT or SIGTERM in
// main), then shuts down gracefully. Exit status: 0 after a clean shutdown,
// 1 when the coordinator fails (at start: a Redis or Kafka connection that
// the start-up check shows misconfigured, with the setting named), 2 on bad
// flags, environment or policy file.
func runCoordinator(ctx context.Context, env environment, args []string) int {
	var cfg coordinatorConfig
	fs := coordinatorFlagSet(&cfg)
	fs.SetOutput(env.stderr)
	fs.Usage = func() {
		fmt.Fprintln(env.stderr, "usage: quotient coordinator --region NAME --regions A,B,C --redis ADDR[,...] --kafka ADDR[,...] (--policies FILE | --policy-log) [flags]")
		fmt.Fprintln(env.stderr, "\nRuns one region's coordinator: every epoch it collects the gateways' usage from Redis,")
		fmt.Fprintln(env.stderr, "exchanges usage reports over Kafka and writes this region's shares of global limits to Redis;")
		fmt.Fprintln(env.stderr, "every second it replicates this region's counts of global fixed windows (daily quotas) over Kafka.")
		fmt.Fprintln(env.stderr, "With --admin-tokens-file it serves the admin API; with --policy-log it follows the policy log")
		fmt.Fprintln(env.stderr, "and materialises it for the gateways; with --gossip-bind several replicas of a region elect a leader.")
		fmt.Fprintln(env.stderr, "Every flag can be set by QUOTIENT_<FLAG> (e.g. QUOTIENT_REDIS_CLUSTER); the command line wins.")
		fmt.Fprintln(env.stderr, "\nflags:")
		fs.PrintDefaults()
	}
	if code, stop := flagsExit(env, "coordinator", parseFlags(fs, args, env.lookupEnv)); stop {
		return code
	}
	rc, err := coordinatorRegionConfig(cfg, env)
	if err != nil {
		fmt.Fprintln(env.stderr, "quotient coordinator:", err)
		return 2
	}
	if cfg.clockOffset != 0 {
		rc.Logger.Warn("quotient coordinator: --clock-offset is set: this process's clock is shifted (for tests only)", "clock_offset", cfg.clockOffset.String())
	}
	// A misconfigured connection (wrong CA, refused AUTH or SASL) is one
	// line and exit status 1 now, not a coordinator that never gets ready.
	if err := checkRedis(ctx, coordinatorRedis(rc), &cfg.redisSec, rc.Logger); err != nil {
		fmt.Fprintln(env.stderr, "quotient coordinator:", err)
		return 1
	}
	if err := checkKafka(ctx, rc.KafkaBrokers, rc.KafkaTLS, rc.KafkaSASL, &cfg.kafkaSec, rc.Logger); err != nil {
		fmt.Fprintln(env.stderr, "quotient coordinator:", err)
		return 1
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

// coordinatorRedis is the Redis client options of rc.
func coordinatorRedis(rc region.Config) redisconn.Options {
	return redisconn.Options{Addrs: rc.RedisAddrs, Cluster: rc.RedisCluster, TLS: rc.RedisTLS, Username: rc.RedisUsername, Password: rc.RedisPassword}
}

// loopbackListen reports whether a listen address binds loopback only.
func loopbackListen(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return host == "localhost" || (err == nil && ip.IsLoopback())
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
	rc.Topic, rc.Mirrored, rc.UsageShards, rc.UsageSplitShards = cfg.topic, cfg.mirrored, cfg.usageShards, cfg.usageSplitShards
	rc.Parts = cfg.parts
	rc.TransferTopic, rc.NoTransfers, rc.PressureInterval = cfg.transferTopic, !cfg.transfers, cfg.pressureInterval
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
	case cfg.pressureInterval <= 0:
		return rc, fmt.Errorf("--pressure-interval %v: want a positive duration", cfg.pressureInterval)
	case cfg.transferTopic != "" && (cfg.transferTopic == cfg.topic):
		return rc, fmt.Errorf("--transfer-topic %q is --topic: asks and gives need a topic of their own", cfg.transferTopic)
	case cfg.usageShards < 1:
		return rc, fmt.Errorf("--usage-shards %d: want at least 1", cfg.usageShards)
	case cfg.usageSplitShards < 0:
		return rc, fmt.Errorf("--usage-split-shards %d: want 0 (do not read the split layout) or more", cfg.usageSplitShards)
	case cfg.parts < 1:
		return rc, fmt.Errorf("--parts %d: want at least 1", cfg.parts)
	case cfg.usageShards%cfg.parts != 0:
		return rc, fmt.Errorf("--parts %d does not divide --usage-shards %d: a part is the usage shards whose number mod --parts is the part", cfg.parts, cfg.usageShards)
	case cfg.parts > 1 && cfg.usageSplitShards > 0:
		return rc, fmt.Errorf("--parts %d needs --usage-split-shards 0: the previous release's split layout hashes keys apart from the parts", cfg.parts)
	case cfg.policies == "" && !cfg.policyLog && cfg.adminTokens == "":
		return rc, errors.New("--policies is required without --policy-log: the JSON policy file whose scope:global policies are shared")
	case cfg.gossipBind == "" && cfg.gossipSeeds != "":
		return rc, errors.New("--gossip-seeds needs --gossip-bind: the address this replica gossips on")
	}
	if err := validClockOffset(cfg.clockOffset); err != nil {
		return rc, err
	}
	// Every clock reading of the protocol (region.Config.Clock) is shifted
	// by --clock-offset; zero in production.
	rc.Clock = offsetClock{offset: cfg.clockOffset}
	ro, err := cfg.redisSec.options(cfg.redis, cfg.redisCluster, env.lookupEnv)
	if err != nil {
		return rc, err
	}
	rc.RedisAddrs, rc.RedisTLS, rc.RedisUsername, rc.RedisPassword = ro.Addrs, ro.TLS, ro.Username, ro.Password
	if rc.KafkaTLS, rc.KafkaSASL, err = cfg.kafkaSec.config(env.lookupEnv); err != nil {
		return rc, err
	}
	reloader, err := cfg.listenSec.reloader(rc.Logger)
	if err != nil {
		return rc, err
	}
	if reloader != nil {
		rc.ListenTLS = reloader.TLSConfig()
	}
	rc.AdminClientCert, rc.AdminInsecure = cfg.listenSec.adminClientCert, cfg.listenSec.adminInsecure
	if cfg.adminTokens != "" && rc.ListenTLS == nil && !rc.AdminInsecure && !loopbackListen(cfg.listen) {
		return rc, fmt.Errorf("--listen %q is not a loopback address: the admin API (--admin-tokens-file) needs --listen-tls-cert and --listen-tls-key there, so its bearer tokens are not sent in the clear (or --admin-insecure)", cfg.listen)
	}
	rc.PolicyLog = cfg.policyLog || cfg.adminTokens != ""
	if cfg.policies != "" {
		data, err := os.ReadFile(cfg.policies)
		if err != nil {
			return rc, fmt.Errorf("--policies: %w", err)
		}
		pols, err := limiter.ParsePolicies(data)
		if err != nil {
			return rc, fmt.Errorf("--policies %s: %w", cfg.policies, err)
		}
		rc.Policies = pols
	}
	if cfg.adminTokens != "" {
		data, err := os.ReadFile(cfg.adminTokens)
		if err != nil {
			return rc, fmt.Errorf("--admin-tokens-file: %w", err)
		}
		if rc.AdminTokens, err = admin.ParseTokens(data); err != nil {
			return rc, fmt.Errorf("--admin-tokens-file %s: %w", cfg.adminTokens, err)
		}
	}
	if cfg.gossipBind != "" {
		name := cfg.nodeName
		if name == "" {
			h, err := os.Hostname()
			if err != nil || h == "" {
				return rc, fmt.Errorf("--node-name is empty and the host name is unknown (%v): set --node-name", err)
			}
			name = h
		}
		host, portText, err := net.SplitHostPort(cfg.gossipBind)
		if err != nil {
			return rc, fmt.Errorf("--gossip-bind %q: want host:port: %v", cfg.gossipBind, err)
		}
		port, err := strconv.Atoi(portText)
		if err != nil || port < 0 || port > 65535 {
			return rc, fmt.Errorf("--gossip-bind %q: port %q is not in 0..65535", cfg.gossipBind, portText)
		}
		g := membership.DefaultConfig(name)
		if host != "" {
			g.BindAddr = host
		}
		g.BindPort, g.Seeds, g.Logger = port, splitList(cfg.gossipSeeds), rc.Logger
		rc.Gossip = &g
	}
	return rc, nil
}
