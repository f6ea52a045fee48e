package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/internal/redisconn"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/limiter/httplimit"
	"github.com/quotientlabs/quotient/region/policysync"
)

const gatewayUsage = `usage: quotient gateway --upstream URL --redis ADDR[,ADDR...] (--policies FILE | --policy-source redis) [flags]

Runs a reverse proxy that rate limits every request with the Quotient limiter
before forwarding it to the upstream. The API key comes from X-API-Key or
Authorization: Bearer; --keys maps known keys to {"tier","account"}; other
requests are anonymous (tier "anonymous") and limited per client address
(/64 for IPv6). The policies file is a JSON array of policy documents,
reloaded when it changes (the last good version stays on bad input). With
--policy-source redis the policies and per-subject overrides come from the
snapshot the region's coordinators materialise from the policy log (reloaded
on notification and every --policy-interval); --policies is then optional,
the set in force until the first snapshot.
/metrics serves Prometheus metrics. Every flag can also be set with
QUOTIENT_<FLAG> (--redis is QUOTIENT_REDIS).

flags:`

// gatewayConfig is the parsed command line of `quotient gateway`.
type gatewayConfig struct {
	listen, upstream, redis, policies, keys, trusted, region, metricsListen string
	regions                                                                 string // comma list; "" = the coordinator's record
	policySource                                                            string // "file" or "redis"
	timeout, reload, epoch, maxDelay, shutdown, policyInterval, usageFlush  time.Duration
	instances, usageShards, pipeline                                        int
	eventSample                                                             float64
	redisSec                                                                redisSecurity // TLS and AUTH to Redis (transport.go)
	redisCluster                                                            bool          // --redis is one cluster configuration endpoint
}

func parseGatewayFlags(env environment, args []string) (*gatewayConfig, error) {
	c := &gatewayConfig{}
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	fs.Usage = func() {
		fmt.Fprintln(env.stderr, gatewayUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.listen, "listen", ":8080", "address to serve on")
	fs.StringVar(&c.upstream, "upstream", "", "URL of the service to forward to (required)")
	fs.StringVar(&c.redis, "redis", "", "region Redis address; a comma list of several means a Redis Cluster (required)")
	fs.StringVar(&c.policies, "policies", "", "policy file, a JSON array of policy documents (required with --policy-source file; with redis, the set until the first snapshot)")
	fs.StringVar(&c.policySource, "policy-source", "file", "where policies come from: file (--policies, watched) or redis (the coordinators' snapshot of the policy log, with overrides)")
	fs.DurationVar(&c.policyInterval, "policy-interval", 30*time.Second, "with --policy-source redis: longest time between two reads of the snapshot (a lost notification delays a change by at most this)")
	fs.StringVar(&c.keys, "keys", "", `JSON object mapping each API key to {"tier": ..., "account": ...}`)
	fs.StringVar(&c.trusted, "trusted-proxies", "", "comma list of CIDR prefixes whose X-Forwarded-For / Forwarded is believed")
	fs.StringVar(&c.region, "region", "", "this region's name, one of --regions (global fixed windows are counted under it; a label on every metric); default: the coordinator's record, else \"local\"")
	fs.StringVar(&c.regions, "regions", "", "comma-separated names of every region sharing global policies, the coordinators' --regions (a key without a share record gets 1/n of a global limit); default: what the region's coordinator wrote to Redis. Required with scope:global policies when the coordinator has written nothing")
	fs.StringVar(&c.metricsListen, "metrics-listen", "", "serve /metrics on this address instead of on --listen")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Millisecond, "deadline of every Redis call; no request waits longer (plus scheduling)")
	fs.DurationVar(&c.reload, "reload-interval", 5*time.Second, "how often the policies file is checked for changes (mtime and size)")
	fs.DurationVar(&c.epoch, "epoch", 10*time.Second, "usage epoch of global policies, shared with the coordinator")
	fs.DurationVar(&c.usageFlush, "usage-flush", time.Second, "how often the usage of global policies is written to Redis for the coordinator; keep it well below the coordinator's --collect-delay, or an epoch's last usage is read an epoch late")
	fs.DurationVar(&c.maxDelay, "max-delay", 5*time.Second, "longest a shaped (leaky bucket) request is held")
	fs.DurationVar(&c.shutdown, "shutdown-timeout", 10*time.Second, "how long in-flight requests get on shutdown")
	fs.IntVar(&c.instances, "instances", 1, "gateway instances in the region (local fallbacks get rate / instances)")
	fs.IntVar(&c.usageShards, "usage-shards", limiter.DefaultUsageShards, "usage hashes per epoch (must match the coordinator)")
	fs.Float64Var(&c.eventSample, "event-sample", 0.01, "fraction of decisions logged as events (0 disables)")
	c.redisSec.register(fs)
	fs.BoolVar(&c.redisCluster, "redis-cluster", false, "--redis is a single Redis Cluster configuration endpoint (ElastiCache cluster mode, as deploy/terraform creates)")
	fs.IntVar(&c.pipeline, "redis-pipeline", 4, "pipelines in flight that carry the decisions of concurrent requests together (automatic pipelining); 0 sends each decision on its own")
	if err := parseFlags(fs, args, env.lookupEnv); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.upstream == "":
		return nil, errors.New("--upstream is required (or QUOTIENT_UPSTREAM)")
	case c.redis == "":
		return nil, errors.New("--redis is required (or QUOTIENT_REDIS)")
	case c.policySource != "file" && c.policySource != "redis":
		return nil, fmt.Errorf("--policy-source %q: want file or redis", c.policySource)
	case c.policies == "" && c.policySource == "file":
		return nil, errors.New("--policies is required (or QUOTIENT_POLICIES) unless --policy-source redis")
	case c.policyInterval <= 0:
		return nil, fmt.Errorf("--policy-interval must be > 0, got %v", c.policyInterval)
	case c.timeout <= 0:
		return nil, fmt.Errorf("--timeout must be > 0, got %v", c.timeout)
	case c.usageFlush <= 0:
		return nil, fmt.Errorf("--usage-flush must be > 0, got %v", c.usageFlush)
	case c.reload <= 0:
		return nil, fmt.Errorf("--reload-interval must be > 0, got %v", c.reload)
	case c.instances < 1:
		return nil, fmt.Errorf("--instances must be >= 1, got %d", c.instances)
	case c.pipeline < 0 || c.pipeline > 256:
		return nil, fmt.Errorf("--redis-pipeline must be between 0 and 256, got %d", c.pipeline)
	case c.eventSample < 0 || c.eventSample > 1:
		return nil, fmt.Errorf("--event-sample must be in [0, 1], got %v", c.eventSample)
	}
	if c.eventSample == 0 {
		c.eventSample = -1 // the limiter's "off"
	}
	return c, nil
}

// runGateway implements `quotient gateway`.
func runGateway(ctx context.Context, env environment, args []string) int {
	cfg, err := parseGatewayFlags(env, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(env.stderr, "quotient gateway: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(env.stderr, nil))
	if err := serveGateway(ctx, env, cfg, log); err != nil {
		log.Error("quotient gateway: " + err.Error())
		return 1
	}
	return 0
}

func serveGateway(ctx context.Context, env environment, cfg *gatewayConfig, log *slog.Logger) error {
	upstream, err := url.Parse(cfg.upstream)
	if err != nil || upstream.Scheme == "" || upstream.Host == "" {
		return fmt.Errorf("--upstream %q: want an absolute URL like http://127.0.0.1:9000", cfg.upstream)
	}
	proxies, err := limiter.ParseTrustedProxies(splitList(cfg.trusted))
	if err != nil {
		return fmt.Errorf("--trusted-proxies: %w", err)
	}
	keys := map[string]httplimit.KeyInfo{}
	if cfg.keys != "" {
		if keys, err = loadKeys(cfg.keys); err != nil {
			return err
		}
	}
	var policies []*limiter.Policy
	if cfg.policies != "" {
		data, err := os.ReadFile(cfg.policies)
		if err != nil {
			return fmt.Errorf("--policies: %w", err)
		}
		if policies, err = limiter.ParsePolicies(data); err != nil {
			return fmt.Errorf("--policies %s: %w", cfg.policies, err)
		}
	}

	redisOpts, err := cfg.redisSec.options(cfg.redis, cfg.redisCluster, env.lookupEnv)
	if err != nil {
		return err
	}
	if err := checkRedis(ctx, redisOpts, &cfg.redisSec, log); err != nil {
		return err
	}
	client := newRedisClient(redisOpts)
	defer client.Close()
	flagSet, err := flagRegionSet(cfg)
	if err != nil {
		return err
	}
	regions := &gatewayRegions{flags: flagSet, client: client, log: log, mismatch: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quotient_gateway_region_set_mismatch",
		Help: "1 when the gateway's --region/--regions/--epoch/--usage-shards disagree with what the region's coordinator wrote to Redis (the coordinator's region set is enforced), else 0.",
	})}
	if err := regions.resolve(ctx, cfg, policies); err != nil {
		return err
	}
	cfg.region = regions.region(cmp.Or(cfg.region, "local"))
	log = log.With("region", cfg.region)
	regions.log = log

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	regionReg := prometheus.WrapRegistererWith(prometheus.Labels{"region": cfg.region}, reg)
	regionReg.MustRegister(regions.mismatch)
	lcfg := limiter.DefaultConfig()
	if cfg.pipeline > 0 {
		pcfg := limiter.DefaultPipelineConfig()
		pcfg.Workers = cfg.pipeline
		store, err := limiter.NewPipelinedRedisStore(client, pcfg)
		if err != nil {
			return err
		}
		defer store.Close()
		lcfg.Store = store
	} else {
		lcfg.Store = limiter.NewRedisStore(client)
	}
	lcfg.Region = cfg.region
	lcfg.Deadline = cfg.timeout
	lcfg.Instances = cfg.instances
	lcfg.UsageEpoch = cfg.epoch
	lcfg.EventSampleRate = cfg.eventSample
	lcfg.Logger = log
	lcfg.Metrics = regionReg
	// The limiter asks the reloader for overrides; the reloader needs the
	// limiter: the hook is set once both exist, before any request.
	hook := &overrideHook{}
	if cfg.policySource == "redis" {
		lcfg.Overrides = hook
	}
	l, err := limiter.New(lcfg, policies)
	if err != nil {
		return err
	}
	if err := regions.attach(l); err != nil {
		return err
	}

	var watcher *policyWatcher
	var reloader *policysync.Reloader
	if cfg.policySource == "file" {
		reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotient_gateway_policy_reloads_total",
			Help: "Policy file reloads by result (ok, error).",
		}, []string{"result"})
		regionReg.MustRegister(reloads)
		watcher = &policyWatcher{path: cfg.policies, l: regions.guard(l), log: log, reloads: reloads}
		if err := watcher.init(); err != nil {
			return err
		}
	} else {
		reloader, err = policysync.NewReloader(policysync.ReloaderConfig{Client: client, Target: regions.guard(l), Interval: cfg.policyInterval, Logger: log, Metrics: regionReg})
		if err != nil {
			return err
		}
		hook.r.Store(reloader)
	}

	flusher := limiter.NewUsageFlusher(l, limiter.NewRedisUsageSink(client, cfg.usageShards, cfg.epoch, 3), limiter.UsageFlusherConfig{Interval: cfg.usageFlush, Logger: log})
	flusher.Start()
	defer flusher.Stop()

	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Warn("upstream error", "err", err)
			httplimit.WriteProblem(w, &httplimit.Problem{Type: "about:blank", Title: "Bad Gateway", Status: http.StatusBadGateway, Detail: "The upstream service did not answer.", ViolatedPolicies: []string{}})
		},
	}
	mw := httplimit.Middleware(l,
		httplimit.WithIdentity(httplimit.APIKeyIdentity(func(k string) (httplimit.KeyInfo, bool) { i, ok := keys[k]; return i, ok }, proxies)),
		httplimit.WithMaxDelay(cfg.maxDelay),
	)
	metricsHandler := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	mux := http.NewServeMux()
	mux.Handle("/", mw(proxy))
	servers := []*http.Server{}
	var metricsLn net.Listener
	if cfg.metricsListen == "" {
		mux.Handle("/metrics", metricsHandler)
	} else {
		mm := http.NewServeMux()
		mm.Handle("/metrics", metricsHandler)
		if metricsLn, err = net.Listen("tcp", cfg.metricsListen); err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		servers = append(servers, &http.Server{Handler: mm, ReadHeaderTimeout: 10 * time.Second})
	}
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		if metricsLn != nil {
			_ = metricsLn.Close()
		}
		return fmt.Errorf("--listen: %w", err)
	}
	main := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10}
	servers = append([]*http.Server{main}, servers...)
	lns := []net.Listener{ln}
	if metricsLn != nil {
		lns = append(lns, metricsLn)
		fmt.Fprintf(env.stdout, "quotient gateway: metrics on %s\n", metricsLn.Addr())
	}
	fmt.Fprintf(env.stdout, "quotient gateway: listening on %s\n", ln.Addr())
	log.Info("gateway started", "listen", ln.Addr().String(), "upstream", upstream.String(), "policies", len(policies), "keys", len(keys))

	errc := make(chan error, len(servers))
	for i, s := range servers {
		go func() {
			if err := s.Serve(lns[i]); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go regions.run(watchCtx, regionSetInterval)
	if watcher != nil {
		go watcher.run(watchCtx, cfg.reload)
	} else {
		go func() { _ = reloader.Run(watchCtx) }()
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), cfg.shutdown)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.Shutdown(shutCtx) }()
	}
	wg.Wait()
	log.Info("gateway stopped")
	return serveErr
}

// overrideHook gives the limiter the Reloader's overrides (none until it is
// set). Safe for concurrent use.
type overrideHook struct {
	r atomic.Pointer[policysync.Reloader]
}

var _ limiter.Overrides = (*overrideHook)(nil)

// Override implements limiter.Overrides.
func (h *overrideHook) Override(subject limiter.Subject, policyID string, now time.Time) (*limiter.Policy, bool) {
	r := h.r.Load()
	if r == nil {
		return nil, false
	}
	return r.Override(subject, policyID, now)
}

// newRedisClient is a standalone client for one address, a cluster client
// for several, with o's TLS and AUTH. Context deadlines bound every call
// (the limiter's deadline).
func newRedisClient(o redisconn.Options) redis.UniversalClient {
	o.ContextTimeout = true
	return o.New()
}

// loadKeys reads the --keys file strictly: a JSON object of API key ->
// {"tier", "account", "user"}.
func loadKeys(path string) (map[string]httplimit.KeyInfo, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--keys: %w", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("--keys %s: want a JSON object of API key -> {\"tier\", \"account\"}: %v", path, err)
	}
	keys := make(map[string]httplimit.KeyInfo, len(raw))
	for k, v := range raw {
		if k == "" || len(k) > httplimit.MaxAPIKeyLen {
			return nil, fmt.Errorf("--keys %s: key %.20q: must be 1 to %d bytes", path, k, httplimit.MaxAPIKeyLen)
		}
		dec := json.NewDecoder(bytes.NewReader(v))
		dec.DisallowUnknownFields()
		var info httplimit.KeyInfo
		if err := dec.Decode(&info); err != nil {
			return nil, fmt.Errorf("--keys %s: key %.20q: %v", path, k, err)
		}
		if info.Tier == "" {
			return nil, fmt.Errorf("--keys %s: key %.20q: tier is required", path, k)
		}
		keys[k] = info
	}
	return keys, nil
}

// policyWatcher reloads the policy file when its mtime or size changes,
// keeping the last good version when the new one does not parse.
type policyWatcher struct {
	path    string
	l       policySetter
	log     *slog.Logger
	reloads *prometheus.CounterVec

	seenMod  time.Time
	seenSize int64
}

func (w *policyWatcher) init() error {
	st, err := os.Stat(w.path)
	if err != nil {
		return fmt.Errorf("--policies: %w", err)
	}
	w.seenMod, w.seenSize = st.ModTime(), st.Size()
	return nil
}

// check reloads once if the file changed.
func (w *policyWatcher) check() {
	st, err := os.Stat(w.path)
	if err != nil {
		w.log.Error("policy reload: cannot stat; keeping the current policies", "file", w.path, "err", err)
		return
	}
	if st.ModTime().Equal(w.seenMod) && st.Size() == w.seenSize {
		return
	}
	w.seenMod, w.seenSize = st.ModTime(), st.Size()
	data, err := os.ReadFile(w.path)
	if err == nil {
		var ps []*limiter.Policy
		if ps, err = limiter.ParsePolicies(data); err == nil {
			err = w.l.SetPolicies(ps)
			if err == nil {
				w.reloads.WithLabelValues("ok").Inc()
				w.log.Info("policies reloaded", "file", w.path, "policies", len(ps))
				return
			}
		}
	}
	w.reloads.WithLabelValues("error").Inc()
	w.log.Error("policy reload failed; keeping the last good policies", "file", w.path, "err", err)
}

func (w *policyWatcher) run(ctx context.Context, every time.Duration) { tickEvery(ctx, every, w.check) }

// tickEvery calls fn every interval until ctx ends.
func tickEvery(ctx context.Context, every time.Duration, fn func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}
