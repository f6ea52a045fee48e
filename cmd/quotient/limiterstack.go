package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/region/policysync"
)

// limiterFlags are the flags of a process that decides requests against its
// region's Redis with the limiter (the store, its deadline, the fallback's
// instance count, the region set, usage epochs, pipelining, events), shared
// by the subcommands that serve decisions (quotient gateway, quotient rls).
type limiterFlags struct {
	redis        string
	redisSec     redisSecurity // TLS and AUTH to Redis (transport.go)
	redisCluster bool          // --redis is one cluster configuration endpoint
	region       string        // "" = the coordinator's record, else "local"
	regions      string        // comma list of region names; "" = the coordinator's record
	timeout      time.Duration
	epoch        time.Duration
	usageFlush   time.Duration
	instances    int
	usageShards  int // packed layout's hashes; 0 = the split layout with usageSplit (a previous release's coordinator)
	usageSplit   int // the split layout's shards, when usageShards is 0
	usageMaxKeys int // limiter.Config.UsageMaxKeys
	pipeline     int
	eventSample  float64
	clockOffset  time.Duration // for tests only: this process's clock is off by this much (clock.go)
}

// register adds the flags to fs.
func (f *limiterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.redis, "redis", "", "region Redis address; a comma list of several means a Redis Cluster (required)")
	f.redisSec.register(fs)
	fs.BoolVar(&f.redisCluster, "redis-cluster", false, "--redis is a single Redis Cluster configuration endpoint (ElastiCache cluster mode, as deploy/terraform creates)")
	fs.StringVar(&f.region, "region", "", "this region's name, one of --regions (global fixed windows are counted under it; a label on every metric); default: the coordinator's record, else \"local\"")
	fs.StringVar(&f.regions, "regions", "", "comma-separated names of every region sharing global policies, the coordinators' --regions (a key without a share record gets 1/n of a global limit); default: what the region's coordinator wrote to Redis. Required with scope:global policies when the coordinator has written nothing")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Millisecond, "deadline of every Redis call; no request waits longer (plus scheduling)")
	fs.DurationVar(&f.epoch, "epoch", 10*time.Second, "usage epoch of global policies, shared with the coordinator")
	fs.DurationVar(&f.usageFlush, "usage-flush", time.Second, "how often the usage of global policies is written to Redis for the coordinator; keep it well below the coordinator's --collect-delay, or an epoch's last usage is read an epoch late")
	fs.IntVar(&f.instances, "instances", 1, "instances of this process in the region (local fallbacks get rate / instances)")
	fs.IntVar(&f.usageShards, "usage-shards", limiter.DefaultUsageShards, "usage hashes per epoch (packed layout, about the active keys per epoch over 64; must match the coordinator, whose record in Redis overrides it)")
	fs.IntVar(&f.usageMaxKeys, "usage-max-keys", limiter.DefaultConfig().UsageMaxKeys, "usage counts of global policies held in memory, one per (epoch, policy, subject), about 180 B of heap each (250 B while a flush runs); beyond it new keys' usage is dropped, counted (quotient_limiter_usage_overflow_keys_total) and its epoch marked incomplete, so the coordinator holds those shares instead of shrinking them. Size it above the distinct global keys this process sees in two epochs")
	fs.Float64Var(&f.eventSample, "event-sample", 0.01, "fraction of decisions logged as events (0 disables)")
	fs.IntVar(&f.pipeline, "redis-pipeline", 4, "pipelines in flight that carry the decisions of concurrent requests together (automatic pipelining); 0 sends each decision on its own")
	registerClockOffset(fs, &f.clockOffset)
}

// validate checks the parsed flags; errors name the flag. The region set
// (--region against --regions) is checked at start by flagRegionSet.
func (f *limiterFlags) validate() error {
	switch {
	case f.redis == "":
		return errors.New("--redis is required (or QUOTIENT_REDIS)")
	case f.timeout <= 0:
		return fmt.Errorf("--timeout must be > 0, got %v", f.timeout)
	case f.instances < 1:
		return fmt.Errorf("--instances must be >= 1, got %d", f.instances)
	case f.region != "" && !regionNamePattern.MatchString(f.region):
		return fmt.Errorf("--region %q: want 1 to 64 of A-Z a-z 0-9 . _ -", f.region)
	case f.usageFlush <= 0:
		return fmt.Errorf("--usage-flush must be > 0, got %v", f.usageFlush)
	case f.pipeline < 0 || f.pipeline > 256:
		return fmt.Errorf("--redis-pipeline must be between 0 and 256, got %d", f.pipeline)
	case f.eventSample < 0 || f.eventSample > 1:
		return fmt.Errorf("--event-sample must be in [0, 1], got %v", f.eventSample)
	case f.epoch <= 0:
		return fmt.Errorf("--epoch must be > 0, got %v", f.epoch)
	case f.usageMaxKeys < 1:
		return fmt.Errorf("--usage-max-keys must be >= 1, got %d", f.usageMaxKeys)
	}
	return validClockOffset(f.clockOffset)
}

var regionNamePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// policyFlags say where a serving process's Quotient policy documents come
// from: a watched JSON file, or the snapshot the region's coordinators
// materialise from the policy log (with per-subject overrides).
type policyFlags struct {
	policies string        // the file; "" = none
	source   string        // "file" or "redis"
	interval time.Duration // longest time between two reads of the snapshot
}

// register adds --policies, --policy-source and --policy-interval to fs;
// fileUse describes what the file is for.
func (f *policyFlags) register(fs *flag.FlagSet, fileUse string) {
	fs.StringVar(&f.policies, "policies", "", fileUse)
	fs.StringVar(&f.source, "policy-source", "file", "where policies come from: file (--policies, watched) or redis (the coordinators' snapshot of the policy log, with overrides)")
	fs.DurationVar(&f.interval, "policy-interval", 30*time.Second, "with --policy-source redis: longest time between two reads of the snapshot (a lost notification delays a change by at most this)")
}

// validate checks the flags; fileRequired says whether --policies is
// required with --policy-source file.
func (f *policyFlags) validate(fileRequired bool) error {
	switch {
	case f.source != "file" && f.source != "redis":
		return fmt.Errorf("--policy-source %q: want file or redis", f.source)
	case fileRequired && f.policies == "" && f.source == "file":
		return errors.New("--policies is required (or QUOTIENT_POLICIES) unless --policy-source redis")
	case f.interval <= 0:
		return fmt.Errorf("--policy-interval must be > 0, got %v", f.interval)
	}
	return nil
}

// initial reads the policy file, the set in force at start (none without
// a file).
func (f *policyFlags) initial(read func(string) ([]byte, error)) ([]*limiter.Policy, error) {
	if f.policies == "" {
		return nil, nil
	}
	data, err := read(f.policies)
	if err != nil {
		return nil, fmt.Errorf("--policies: %w", err)
	}
	ps, err := limiter.ParsePolicies(data)
	if err != nil {
		return nil, fmt.Errorf("--policies %s: %w", f.policies, err)
	}
	return ps, nil
}

// limiterStack is a limiter on the region's Redis that enforces the
// region set of the coordinator (or the flags), with its usage flusher and
// region-set refresh running. Close stops them and closes the store and
// the client. Built by newLimiterStack; not safe for concurrent Close.
type limiterStack struct {
	client  redis.UniversalClient
	store   *limiter.RedisStore
	limiter *limiter.Limiter
	regions *gatewayRegions
	// region is the region name in force at start: a label on every
	// metric of reg and an attribute of every line of log.
	region string
	log    *slog.Logger
	reg    prometheus.Registerer
	// clock is the process's clock (--clock-offset): the limiter's, and
	// the RLQS server's.
	clock offsetClock
	// hook gives the limiter the overrides of the Redis policy source,
	// once startPolicies has built it.
	hook    *overrideHook
	closers []func()
}

// Close stops the stack's goroutines and closes its store and client.
func (s *limiterStack) Close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// stackOptions are what differs between the subcommands that build a
// limiterStack.
type stackOptions struct {
	// name is the subcommand ("gateway", "rls"): metric names are
	// quotient_<name>_..., and error messages name it.
	name string
	// policies is the set in force at start (checked against the region
	// set: a global policy needs one).
	policies []*limiter.Policy
	// overrides makes the limiter ask the stack's hook for per-subject
	// overrides (--policy-source redis).
	overrides bool
}

// newLimiterStack connects to the Redis of f (TLS and AUTH as the flags
// say, checked once at start so that a wrong password or certificate is
// named before serving), resolves the region set (gateway_regions.go:
// the coordinator's record wins over the flags; a global policy without
// either is refused), builds the limiter of f enforcing o.policies with
// its metrics on reg labelled with the region, starts the usage flusher
// of global policies and the refresh of the region set every
// regionSetInterval. f's region, epoch and usage shards are set to the
// ones in force.
func newLimiterStack(ctx context.Context, f *limiterFlags, lookupEnv func(string) (string, bool), o stackOptions, log *slog.Logger, reg *prometheus.Registry) (*limiterStack, error) {
	opts, err := f.redisSec.options(f.redis, f.redisCluster, lookupEnv)
	if err != nil {
		return nil, err
	}
	if err := checkRedis(ctx, opts, &f.redisSec, log); err != nil {
		return nil, err
	}
	s := &limiterStack{client: newRedisClient(opts), hook: &overrideHook{}}
	s.closers = append(s.closers, func() { _ = s.client.Close() })
	fail := func(err error) (*limiterStack, error) {
		s.Close()
		return nil, err
	}

	flagSet, err := flagRegionSet(f)
	if err != nil {
		return fail(err)
	}
	// Each server's gauge by its literal name (quotient_gateway_… for the
	// gateway, quotient_rls_… for rls), which the alert rules name.
	mismatch := prometheus.GaugeOpts{Name: "quotient_gateway_region_set_mismatch"}
	if o.name == "rls" {
		mismatch = prometheus.GaugeOpts{Name: "quotient_rls_region_set_mismatch"}
	}
	mismatch.Help = "1 when the process's --region/--regions/--epoch/--usage-shards disagree with what the region's coordinator wrote to Redis (the coordinator's region set is enforced), else 0."
	s.regions = &gatewayRegions{flags: flagSet, client: s.client, log: log, name: o.name, mismatch: prometheus.NewGauge(mismatch)}
	if err := s.regions.resolve(ctx, f, o.policies); err != nil {
		return fail(err)
	}
	f.region = s.regions.region(cmp.Or(f.region, "local"))
	s.region = f.region
	s.log = log.With("region", f.region)
	s.regions.log = s.log
	s.reg = prometheus.WrapRegistererWith(prometheus.Labels{"region": f.region}, reg)
	s.reg.MustRegister(s.regions.mismatch)

	lcfg := limiter.DefaultConfig()
	if f.pipeline > 0 {
		pcfg := limiter.DefaultPipelineConfig()
		pcfg.Workers = f.pipeline
		store, err := limiter.NewPipelinedRedisStore(s.client, pcfg)
		if err != nil {
			return fail(err)
		}
		s.closers = append(s.closers, store.Close)
		s.store = store
	} else {
		s.store = limiter.NewRedisStore(s.client)
	}
	lcfg.Store = s.store
	lcfg.Deadline = f.timeout
	lcfg.Instances = f.instances
	lcfg.Region = f.region
	lcfg.UsageEpoch = f.epoch
	lcfg.UsageMaxKeys = f.usageMaxKeys
	lcfg.EventSampleRate = f.eventSample
	if f.eventSample == 0 {
		lcfg.EventSampleRate = -1 // the limiter's "off"
	}
	lcfg.Logger = s.log
	lcfg.Metrics = s.reg
	// The limiter's clock numbers the usage epochs of global policies (and
	// runs the breaker, deny cache and fallback); decisions on Redis use
	// server time whatever it says. --clock-offset shifts it, for tests.
	s.clock = offsetClock{offset: f.clockOffset}
	lcfg.Clock = s.clock
	if f.clockOffset != 0 {
		s.log.Warn("quotient "+o.name+": --clock-offset is set: this process's clock is shifted (for tests only)", "clock_offset", f.clockOffset.String())
	}
	// The limiter asks the reloader for overrides; the reloader needs the
	// limiter: the hook is set once both exist, before any request.
	if o.overrides {
		lcfg.Overrides = s.hook
	}
	l, err := limiter.New(lcfg, o.policies)
	if err != nil {
		return fail(err)
	}
	if err := s.regions.attach(l); err != nil {
		return fail(err)
	}
	s.limiter = l

	flusher := limiter.NewUsageFlusher(l, f.usageSink(s.client), limiter.UsageFlusherConfig{Interval: f.usageFlush, Logger: s.log})
	flusher.Start()
	s.closers = append(s.closers, flusher.Stop)

	rctx, stopRegions := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.regions.run(rctx, regionSetInterval) }()
	s.closers = append(s.closers, func() { stopRegions(); <-done })
	return s, nil
}

// policySource is the running source of a stack's Quotient policies: the
// watcher of --policies, or the Reloader of the coordinators' snapshot.
type policySource struct {
	watcher  *policyWatcher
	reloader *policysync.Reloader // nil with --policy-source file
}

// startPolicies builds the policy source of f delivering every new set to
// target through the region-set guard (a global policy needs a known
// region set; see gatewayRegions.guard). With --policy-source file and no
// --policies there is no source (nil). Run the source with run.
func (s *limiterStack) startPolicies(f *policyFlags, reload time.Duration, target policySetter, name string) (*policySource, error) {
	guarded := s.regions.guard(target)
	if f.source == "file" {
		if f.policies == "" {
			return nil, nil
		}
		reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotient_" + name + "_policy_reloads_total",
			Help: "Policy file reloads by result (ok, error).",
		}, []string{"result"})
		s.reg.MustRegister(reloads)
		w := &policyWatcher{path: f.policies, l: guarded, log: s.log, reloads: reloads, every: reload}
		if err := w.init(); err != nil {
			return nil, err
		}
		return &policySource{watcher: w}, nil
	}
	r, err := policysync.NewReloader(policysync.ReloaderConfig{Client: s.client, Target: guarded, Interval: f.interval, Logger: s.log, Metrics: s.reg})
	if err != nil {
		return nil, err
	}
	s.hook.r.Store(r)
	return &policySource{reloader: r}, nil
}

// run follows the source until ctx ends. A nil source does nothing.
func (p *policySource) run(ctx context.Context) {
	switch {
	case p == nil:
	case p.watcher != nil:
		p.watcher.run(ctx, p.watcher.every)
	default:
		_ = p.reloader.Run(ctx)
	}
}

// usageSink is the gateway's usage sink: the packed layout, or the split
// layout when the region's coordinator is of the previous release (its
// record has no packed shard count; see limiter.RegionSet).
func (f *limiterFlags) usageSink(client redis.UniversalClient) *limiter.RedisUsageSink {
	if f.usageShards == 0 {
		return limiter.NewSplitUsageSink(client, f.usageSplit, f.epoch, 3)
	}
	return limiter.NewRedisUsageSink(client, f.usageShards, f.epoch, 3)
}
