package main

import (
	"flag"
	"time"

	"github.com/quotientlabs/quotient/limiter"
)

// coordinatorConfig is what `quotient coordinator` reads from its flags and
// environment. deploy/terraform passes these settings to every coordinator
// as environment variables; a test there checks that every setting it passes
// is a flag defined here.
type coordinatorConfig struct {
	region           string        // this region's name
	regions          string        // comma list of every region, this one included
	redis            string        // comma list of Redis addresses; several mean a cluster
	redisCluster     bool          // --redis is one cluster configuration endpoint
	kafka            string        // comma list of Kafka bootstrap brokers
	listen           string        // address of the HTTP server (/metrics, /healthz)
	epoch            time.Duration // rebalance interval
	maxWait          time.Duration // wait for laggards' reports after an epoch ends
	collectDelay     time.Duration // wait for the gateways' last flush after an epoch ends
	policies         string        // policy file (global policies are shared)
	topic            string        // usage-report topic
	transferTopic    string        // topic of asks and gives; empty: <topic>-transfers
	transfers        bool          // asks and gives between decisions
	pressureInterval time.Duration // how often the gateways' pressure marks are read
	mirrored         bool          // one Kafka cluster per region, mirrored with MirrorMaker 2
	usageShards      int           // the gateways' usage shard count (packed layout)
	usageSplitShards int           // the split layout's, still read (0: not)
	parts            int           // key parts (region.Config.Parts)
	logLevel         string        // debug, info, warn, error
	policyLog        bool          // follow the policy topic (the admin API's log)
	adminTokens      string        // token file of the admin API; implies policyLog
	nodeName         string        // this replica's name in the region
	gossipBind       string        // host:port of memberlist gossip; empty: single replica
	gossipSeeds      string        // comma list of other replicas' gossip addresses
	clockOffset      time.Duration // for tests only: this process's clock is off by this much (clock.go)

	redisSec  redisSecurity  // TLS and AUTH to Redis (transport.go)
	kafkaSec  kafkaSecurity  // TLS and SASL to Kafka
	listenSec listenSecurity // TLS of the HTTP listener, admin API client certificates
}

// coordinatorFlagSet defines the flags of `quotient coordinator` on cfg.
// A usage text containing "(required)" marks a setting every deployment
// must pass (terraform_env_test.go checks that deploy/terraform does).
func coordinatorFlagSet(cfg *coordinatorConfig) *flag.FlagSet {
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	fs.StringVar(&cfg.region, "region", "", "this region's name (required)")
	fs.StringVar(&cfg.regions, "regions", "", "comma-separated names of every region, this one included (required)")
	fs.StringVar(&cfg.redis, "redis", "127.0.0.1:6379", "comma-separated Redis addresses of this region; several mean a Redis Cluster")
	fs.BoolVar(&cfg.redisCluster, "redis-cluster", false, "--redis is a single Redis Cluster configuration endpoint (e.g. ElastiCache cluster mode)")
	fs.StringVar(&cfg.kafka, "kafka", "127.0.0.1:9092", "comma-separated Kafka bootstrap brokers")
	fs.StringVar(&cfg.listen, "listen", ":9090", "address of the HTTP server for /metrics and /healthz")
	fs.DurationVar(&cfg.epoch, "epoch", 10*time.Second, "rebalance interval; epochs are aligned to multiples of it since the Unix epoch")
	fs.DurationVar(&cfg.maxWait, "max-wait", 0, "how long after an epoch ends to wait for the other regions' reports (default min(2s, epoch/2))")
	fs.DurationVar(&cfg.collectDelay, "collect-delay", 0, "how long after an epoch ends to collect its usage, so the gateways' last flush lands (default min(1s, max-wait/2))")
	fs.StringVar(&cfg.policies, "policies", "", "JSON policy file, the gateways' own; its scope:global bucket policies are shared and its scope:global fixed windows replicated over Kafka. Required without --policy-log; with it, the bootstrap set until the policy log holds any record")
	fs.BoolVar(&cfg.policyLog, "policy-log", false, "follow the policy topic quotient.policies (the admin API's log): materialise it into this region's Redis for the gateways and take the global policies from it once it holds any record")
	fs.StringVar(&cfg.adminTokens, "admin-tokens-file", "", "serve the admin API under /v1/ on --listen with the bearer tokens of this file (lines: <name> <read|admin> <token>); implies --policy-log")
	fs.StringVar(&cfg.nodeName, "node-name", "", "this replica's unique name in the region (gossip name, owner of the epochs it claims; default: the host name)")
	fs.StringVar(&cfg.gossipBind, "gossip-bind", "", "host:port where this replica gossips with the region's other replicas (memberlist, TCP and UDP); empty: a single replica, always the leader")
	fs.StringVar(&cfg.gossipSeeds, "gossip-seeds", "", "comma-separated gossip addresses of other replicas of this region to join (empty: start a new cluster)")
	fs.StringVar(&cfg.topic, "topic", "quotient.usage", "Kafka topic of usage reports")
	fs.StringVar(&cfg.transferTopic, "transfer-topic", "", "Kafka topic of asks and gives of share between epoch decisions (default <topic>-transfers; mirrored like --topic with --mirrored)")
	fs.BoolVar(&cfg.transfers, "transfers", true, "move share between regions within seconds when a key's demand outruns its share (asks and gives on --transfer-topic); false: at epoch decisions only")
	fs.DurationVar(&cfg.pressureInterval, "pressure-interval", time.Second, "how often to read the gateways' pressure marks (keys whose global policy rejected cost) and ask the other regions for share")
	fs.BoolVar(&cfg.mirrored, "mirrored", false, "one Kafka cluster per region mirrored with MirrorMaker 2: also consume <region>.<topic> for every other region")
	fs.IntVar(&cfg.usageShards, "usage-shards", limiter.DefaultUsageShards, "usage hashes per epoch (packed layout; about the active keys per epoch over 64); the gateways follow it")
	fs.IntVar(&cfg.parts, "parts", 1, "key parts the region's coordinator replicas split the key space into (the same in every region; it must divide --usage-shards, and > 1 needs --usage-split-shards 0); 1: one replica leads every key")
	fs.IntVar(&cfg.usageSplitShards, "usage-split-shards", limiter.DefaultSplitUsageShards, "shards of the previous release's split usage layout, which its gateways write, also read (0: not; only once no such gateway runs)")
	fs.StringVar(&cfg.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	registerClockOffset(fs, &cfg.clockOffset)
	cfg.redisSec.register(fs)
	cfg.kafkaSec.register(fs)
	cfg.listenSec.register(fs)
	return fs
}
