package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/limiter"
)

// limiterFlags are the flags of a process that decides requests against its
// region's Redis with the limiter (the store, its deadline, the fallback's
// instance count, usage epochs, pipelining, events), shared by the
// subcommands that serve decisions.
type limiterFlags struct {
	redis        string
	redisSec     redisSecurity // TLS and AUTH to Redis (transport.go)
	redisCluster bool          // --redis is one cluster configuration endpoint
	region       string
	regions      string // comma list of region names; "" = this one only
	timeout      time.Duration
	epoch        time.Duration
	usageFlush   time.Duration
	instances    int
	usageShards  int
	pipeline     int
	eventSample  float64
}

// register adds the flags to fs with the defaults of `quotient gateway`.
func (f *limiterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.redis, "redis", "", "region Redis address; a comma list of several means a Redis Cluster (required)")
	f.redisSec.register(fs)
	fs.BoolVar(&f.redisCluster, "redis-cluster", false, "--redis is a single Redis Cluster configuration endpoint (ElastiCache cluster mode, as deploy/terraform creates)")
	fs.StringVar(&f.region, "region", "local", "this region's name (1 to 64 of A-Z a-z 0-9 . _ -), a constant label on every metric")
	fs.StringVar(&f.regions, "regions", "", "comma-separated names of every region sharing global policies, --region among them (a key without a share record gets 1/n of a global limit); default: this region alone")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Millisecond, "deadline of every Redis call; no request waits longer (plus scheduling)")
	fs.DurationVar(&f.epoch, "epoch", 10*time.Second, "usage epoch of global policies, shared with the coordinator")
	fs.DurationVar(&f.usageFlush, "usage-flush", time.Second, "how often the usage of global policies is written to Redis for the coordinator")
	fs.IntVar(&f.instances, "instances", 1, "instances in the region (local fallbacks get rate / instances)")
	fs.IntVar(&f.usageShards, "usage-shards", limiter.DefaultUsageShards, "usage hashes per epoch (must match the coordinator)")
	fs.Float64Var(&f.eventSample, "event-sample", 0.01, "fraction of decisions logged as events (0 disables)")
	fs.IntVar(&f.pipeline, "redis-pipeline", 4, "pipelines in flight that carry the decisions of concurrent requests together (automatic pipelining); 0 sends each decision on its own")
}

// validate checks the parsed flags; errors name the flag.
func (f *limiterFlags) validate() error {
	switch {
	case f.redis == "":
		return errors.New("--redis is required (or QUOTIENT_REDIS)")
	case f.timeout <= 0:
		return fmt.Errorf("--timeout must be > 0, got %v", f.timeout)
	case f.instances < 1:
		return fmt.Errorf("--instances must be >= 1, got %d", f.instances)
	case !regionNamePattern.MatchString(f.region):
		return fmt.Errorf("--region %q: want 1 to 64 of A-Z a-z 0-9 . _ -", f.region)
	case f.regions != "" && !slices.Contains(splitList(f.regions), f.region):
		return fmt.Errorf("--regions %q does not list --region %q", f.regions, f.region)
	case f.usageFlush <= 0:
		return fmt.Errorf("--usage-flush must be > 0, got %v", f.usageFlush)
	case f.pipeline < 0 || f.pipeline > 256:
		return fmt.Errorf("--redis-pipeline must be between 0 and 256, got %d", f.pipeline)
	case f.eventSample < 0 || f.eventSample > 1:
		return fmt.Errorf("--event-sample must be in [0, 1], got %v", f.eventSample)
	case f.epoch <= 0:
		return fmt.Errorf("--epoch must be > 0, got %v", f.epoch)
	}
	return nil
}

// limiterStack is a limiter on the region's Redis with its usage flusher
// running. Close stops the flusher and closes the store and the client.
type limiterStack struct {
	client  redis.UniversalClient
	limiter *limiter.Limiter
	closers []func()
}

func (s *limiterStack) Close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

var regionNamePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// newLimiterStack connects to the Redis of f (TLS and AUTH as the flags
// say, checked once at start so that a wrong password or certificate is
// named before serving), builds the limiter of f enforcing policies,
// registering its metrics on reg (may be nil) and asking overrides (may be
// nil), and starts the usage flusher of global policies.
func newLimiterStack(ctx context.Context, f *limiterFlags, lookupEnv func(string) (string, bool), policies []*limiter.Policy, overrides limiter.Overrides, log *slog.Logger, reg prometheus.Registerer) (*limiterStack, error) {
	opts, err := f.redisSec.options(f.redis, f.redisCluster, lookupEnv)
	if err != nil {
		return nil, err
	}
	if err := checkRedis(ctx, opts, &f.redisSec, log); err != nil {
		return nil, err
	}
	s := &limiterStack{client: newRedisClient(opts)}
	s.closers = append(s.closers, func() { _ = s.client.Close() })
	lcfg := limiter.DefaultConfig()
	if f.pipeline > 0 {
		pcfg := limiter.DefaultPipelineConfig()
		pcfg.Workers = f.pipeline
		store, err := limiter.NewPipelinedRedisStore(s.client, pcfg)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.closers = append(s.closers, store.Close)
		lcfg.Store = store
	} else {
		lcfg.Store = limiter.NewRedisStore(s.client)
	}
	lcfg.Deadline = f.timeout
	lcfg.Instances = f.instances
	lcfg.Region = f.region
	lcfg.Regions = max(1, len(splitList(f.regions)))
	lcfg.UsageEpoch = f.epoch
	lcfg.EventSampleRate = f.eventSample
	if f.eventSample == 0 {
		lcfg.EventSampleRate = -1 // the limiter's "off"
	}
	lcfg.Logger = log
	lcfg.Metrics = reg
	if overrides != nil {
		lcfg.Overrides = overrides
	}
	l, err := limiter.New(lcfg, policies)
	if err != nil {
		s.Close()
		return nil, err
	}
	s.limiter = l
	flusher := limiter.NewUsageFlusher(l, limiter.NewRedisUsageSink(s.client, f.usageShards, f.epoch, 3), limiter.UsageFlusherConfig{Interval: f.usageFlush, Logger: log})
	flusher.Start()
	s.closers = append(s.closers, flusher.Stop)
	return s, nil
}
