package main

import (
	"flag"
	"time"
)

// coordinatorConfig is what `quotient coordinator` reads from its flags and
// environment. deploy/terraform passes these settings to every coordinator
// as environment variables; a test there checks that every setting it passes
// is a flag defined here.
type coordinatorConfig struct {
	region  string        // this region's name
	regions string        // comma list of every region, this one included
	redis   string        // comma list of Redis addresses; several mean a cluster
	kafka   string        // comma list of Kafka bootstrap brokers
	listen  string        // address of the HTTP server (/metrics, /healthz)
	epoch   time.Duration // rebalance interval
}

// coordinatorFlagSet defines the flags of `quotient coordinator` on cfg.
func coordinatorFlagSet(cfg *coordinatorConfig) *flag.FlagSet {
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	fs.StringVar(&cfg.region, "region", "", "this region's name (required)")
	fs.StringVar(&cfg.regions, "regions", "", "comma-separated names of every region, this one included (required)")
	fs.StringVar(&cfg.redis, "redis", "127.0.0.1:6379", "comma-separated Redis addresses of this region; several mean a Redis Cluster")
	fs.StringVar(&cfg.kafka, "kafka", "127.0.0.1:9092", "comma-separated Kafka bootstrap brokers")
	fs.StringVar(&cfg.listen, "listen", ":9090", "address of the HTTP server for /metrics and /healthz")
	fs.DurationVar(&cfg.epoch, "epoch", 10*time.Second, "rebalance interval; epochs are aligned to multiples of it since the Unix epoch")
	return fs
}
