package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
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
	redis       string
	region      string
	regions     int
	timeout     time.Duration
	epoch       time.Duration
	instances   int
	usageShards int
	pipeline    int
	eventSample float64
}

// register adds the flags to fs with the defaults of `quotient gateway`.
func (f *limiterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.redis, "redis", "", "region Redis address; a comma list of several means a Redis Cluster (required)")
	fs.StringVar(&f.region, "region", "local", "region name, a constant label on every metric")
	fs.IntVar(&f.regions, "regions", 1, "number of regions sharing every global policy (a key without a share gets 1/regions)")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Millisecond, "deadline of every Redis call; no request waits longer (plus scheduling)")
	fs.DurationVar(&f.epoch, "epoch", 10*time.Second, "usage epoch of global policies, shared with the coordinator")
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
	case f.regions < 1:
		return fmt.Errorf("--regions must be >= 1, got %d", f.regions)
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

// newLimiterStack builds the limiter of f enforcing policies, registering
// its metrics on reg (may be nil) and asking overrides (may be nil), and
// starts the usage flusher of global policies.
func newLimiterStack(f *limiterFlags, policies []*limiter.Policy, overrides limiter.Overrides, log *slog.Logger, reg prometheus.Registerer) (*limiterStack, error) {
	s := &limiterStack{client: newRedisClient(splitList(f.redis))}
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
	lcfg.Regions = f.regions
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
	flusher := limiter.NewUsageFlusher(l, limiter.NewRedisUsageSink(s.client, f.usageShards, f.epoch, 3), limiter.UsageFlusherConfig{Logger: log})
	flusher.Start()
	s.closers = append(s.closers, flusher.Stop)
	return s, nil
}
