package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/quotientlabs/quotient/region/policysync"
	"github.com/quotientlabs/quotient/rls"
	"github.com/quotientlabs/quotient/rls/quota"
)

const rlsUsage = `usage: quotient rls --redis ADDR[,ADDR...] --config-dir DIR [flags]

Serves Envoy's rate limit service (envoy.service.ratelimit.v3.RateLimitService,
ShouldRateLimit) over gRPC, with gRPC health checking and reflection, deciding
every request with the Quotient limiter on the region's Redis (deadline,
circuit breaker, fallback, deny cache, as quotient gateway).

The configuration is envoyproxy/ratelimit's: every *.yaml and *.yml file under
DIR/config/ (DIR is RUNTIME_ROOT/RUNTIME_SUBDIRECTORY, config is
RUNTIME_APPDIRECTORY, see --config-subdir), loaded unchanged; unknown fields
are errors naming the file and the path. The directory is checked every
--reload-interval; a change that does not parse keeps the last good
configuration (logged, counted in quotient_rls_config_reloads_total).
A rule may name a Quotient policy document instead of a unit and a
limit (rate_limit: {policy: ID}); the documents come from --policies (a
JSON array, watched) or, with --policy-source redis, from the snapshot the
region's coordinators materialise (with per-subject overrides). Global
policies (scope global) take the region set from the region's coordinator
(or --region/--regions), as quotient gateway does.
With --listen-tls-cert and --listen-tls-key, gRPC (and /metrics) is served
over TLS only, the files re-read when they change; --listen-tls-client-ca
makes every client present a certificate that chains to it (mutual TLS).
The gRPC health of the services (not of "", the process) is NOT_SERVING until
Redis is warm (connections open, scripts loaded on every node, the policy
snapshot read with --policy-source redis) or --warm-timeout has passed (then
SERVING, in fallback); calls made meanwhile are answered.
Every flag can also be set with QUOTIENT_<FLAG> (--config-dir is
QUOTIENT_CONFIG_DIR).

flags:`

// defaultStreamWorkers is --grpc-stream-workers's default: above the
// concurrent calls of a busy RLS (Envoys keep many streams in flight on
// few connections), so that nearly every call runs on a goroutine whose
// stack has already grown (a new goroutine per call spent 5 to 9 % of
// the process's CPU growing stacks under make bench-rls's load; the workers
// took 3 to 6 % of its CPU per decision off). An idle
// worker costs its stack (a few KiB). maxStreamWorkers bounds the flag.
const (
	defaultStreamWorkers = 256
	maxStreamWorkers     = 1 << 16
)

// defaultGCPercent is --gc-percent's default. The process's live heap is
// small (a few MB: the configuration, the deny cache, connection buffers)
// and every call allocates its request, its response and gRPC's stream
// state, so with Go's default of 100 it collects many times a second:
// under make bench-rls's load, 400 took 22 to 23 % of the process's CPU
// per decision off (41.4 to 32.1 µs and 48.0 to 37.0 µs, two runs) for a
// heap of up to five times the live one.
const defaultGCPercent = 400

// rlsConfig is the parsed command line of `quotient rls`.
type rlsConfig struct {
	limiterFlags                                   // Redis, deadline, region set, usage (limiterstack.go)
	policyFlags                                    // --policies, --policy-source (limiterstack.go)
	listen, metricsListen, configDir, configSubdir string
	reload, shutdown, maxDelay                     time.Duration
	mergeDomains, headers                          bool
	streamWorkers                                  int       // --grpc-stream-workers
	gcPercent                                      int       // --gc-percent
	gcExplicit                                     bool      // --gc-percent given (flag or QUOTIENT_GC_PERCENT)
	quota                                          rlqsFlags // rlqs.go
	warm                                           warmFlags // warm start (gateway_ready.go)
	// listenSec is the TLS of --listen and --metrics-listen (one
	// certificate, re-read when it changes; with a client CA, both
	// require a client certificate that chains to it).
	listenSec listenSecurity
	// grpcTLS and metricsTLS are built from listenSec by runRLS (nil:
	// plaintext).
	grpcTLS, metricsTLS *tls.Config
}

// registerListenTLS registers quotient rls's listener TLS flags: the
// coordinator's --listen-tls-* (transport.go), without its admin-API flags.
func (c *rlsConfig) registerListenTLS(fs *flag.FlagSet) {
	fs.StringVar(&c.listenSec.cert, "listen-tls-cert", "", "serve gRPC on --listen (and /metrics on --metrics-listen) over TLS only, with this PEM certificate (chain); re-read when it changes, so certificates rotate without a restart (GRPC_SERVER_USE_TLS, GRPC_SERVER_TLS_CERT)")
	fs.StringVar(&c.listenSec.key, "listen-tls-key", "", "PEM key of --listen-tls-cert, re-read with it (GRPC_SERVER_TLS_KEY)")
	fs.StringVar(&c.listenSec.clientCA, "listen-tls-client-ca", "", "PEM bundle of CAs: every client of --listen and --metrics-listen must present a certificate that chains to one (mutual TLS; re-read when it changes) (GRPC_CLIENT_TLS_CACERT)")
	c.listenSec.requireClientCert = true
}

// listenerTLS returns the TLS configurations of the gRPC and the metrics
// listener, both nil without --listen-tls-cert. Each handshake re-reads the
// files (tlsconfig.Reloader); a later reload that fails is logged and the
// last good certificate stays in use. Errors name the flag.
func (c *rlsConfig) listenerTLS(log *slog.Logger) (grpcTLS, metricsTLS *tls.Config, err error) {
	l := &c.listenSec
	if l.cert == "" && l.key == "" {
		return nil, nil, nil
	}
	grpcReloader, err := l.reloader(log, "h2") // gRPC is HTTP/2 only
	if err != nil {
		return nil, nil, err
	}
	if c.metricsListen == "" {
		return grpcReloader.TLSConfig(), nil, nil
	}
	metricsReloader, err := l.reloader(log) // HTTP/1.1, as the coordinator's /metrics
	if err != nil {
		return nil, nil, err
	}
	return grpcReloader.TLSConfig(), metricsReloader.TLSConfig(), nil
}

func parseRLSFlags(env environment, args []string) (*rlsConfig, error) {
	c := &rlsConfig{}
	fs := flag.NewFlagSet("rls", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	fs.Usage = func() {
		fmt.Fprintln(env.stderr, rlsUsage)
		fs.PrintDefaults()
	}
	c.limiterFlags.register(fs)
	c.policyFlags.register(fs, "Quotient policy file, a JSON array of policy documents that rules name with rate_limit.policy (optional; with --policy-source redis, the set until the first snapshot)")
	fs.DurationVar(&c.maxDelay, "max-delay", 0, "longest an answer is held for a shaping (leaky_bucket) policy that admits with a delay (0: answer at once); keep Envoy's timeout above it")
	fs.StringVar(&c.listen, "listen", ":8081", "gRPC address to serve on (envoyproxy/ratelimit's GRPC_HOST:GRPC_PORT)")
	fs.StringVar(&c.metricsListen, "metrics-listen", "", "serve Prometheus /metrics over HTTP on this address (none when empty)")
	fs.StringVar(&c.configDir, "config-dir", "", "runtime directory, RUNTIME_ROOT/RUNTIME_SUBDIRECTORY (required)")
	fs.StringVar(&c.configSubdir, "config-subdir", rls.DefaultAppDirectory, "subdirectory of --config-dir holding the YAML files (RUNTIME_APPDIRECTORY)")
	fs.BoolVar(&c.mergeDomains, "merge-domains", false, "let several files configure one domain (MERGE_DOMAIN_CONFIG)")
	fs.BoolVar(&c.headers, "response-headers", false, "add RateLimit-Policy and RateLimit (draft-10) to every response, Retry-After when over limit (LIMIT_RESPONSE_HEADERS_ENABLED)")
	fs.DurationVar(&c.reload, "reload-interval", 5*time.Second, "how often the configuration directory and the --policies file are checked for changes")
	fs.DurationVar(&c.shutdown, "shutdown-timeout", 10*time.Second, "how long in-flight calls get on shutdown")
	fs.IntVar(&c.gcPercent, "gc-percent", defaultGCPercent, "the Go garbage collector's target (GOGC) for this process: the heap may grow to (1 + N/100) x the live heap between collections; -1 turns the collector off. When the flag is not given and GOGC is set in the environment, GOGC applies")
	fs.IntVar(&c.streamWorkers, "grpc-stream-workers", defaultStreamWorkers, "goroutines kept to run gRPC calls, so a call does not start a goroutine and grow its stack again (calls beyond them get their own goroutine); 0: a new goroutine per call")
	c.registerListenTLS(fs)
	c.quota.register(fs) // RLQS flags (rlqs.go)
	addWarmFlags(fs, &c.warm)
	if err := parseFlags(fs, args, env.lookupEnv); err != nil {
		return nil, err
	}
	fs.Visit(func(f *flag.Flag) { c.gcExplicit = c.gcExplicit || f.Name == "gc-percent" })
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.gcPercent < -1:
		return nil, fmt.Errorf("--gc-percent must be -1 (off) or >= 0, got %d", c.gcPercent)
	case c.configDir == "":
		return nil, errors.New("--config-dir is required (or QUOTIENT_CONFIG_DIR)")
	case c.reload <= 0:
		return nil, fmt.Errorf("--reload-interval must be > 0, got %v", c.reload)
	case c.maxDelay < 0:
		return nil, fmt.Errorf("--max-delay must be >= 0, got %v", c.maxDelay)
	case c.streamWorkers < 0 || c.streamWorkers > maxStreamWorkers:
		return nil, fmt.Errorf("--grpc-stream-workers must be between 0 and %d, got %d", maxStreamWorkers, c.streamWorkers)
	}
	if err := c.listenSec.check(); err != nil {
		return nil, err
	}
	if err := c.limiterFlags.validate(); err != nil {
		return nil, err
	}
	if err := c.policyFlags.validate(false); err != nil {
		return nil, err
	}
	if err := c.quota.validate(); err != nil { // RLQS (rlqs.go)
		return nil, err
	}
	if err := c.warm.validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// runRLS implements `quotient rls`.
func runRLS(ctx context.Context, env environment, args []string) int {
	cfg, err := parseRLSFlags(env, args)
	if code, stop := flagsExit(env, "rls", err); stop {
		return code
	}
	log := slog.New(slog.NewTextHandler(env.stderr, nil))
	gogc := false
	if env.lookupEnv != nil {
		_, gogc = env.lookupEnv("GOGC")
	}
	if cfg.gcExplicit || !gogc {
		debug.SetGCPercent(cfg.gcPercent)
	}
	cfg.grpcTLS, cfg.metricsTLS, err = cfg.listenerTLS(log)
	if code, stop := flagsExit(env, "rls", err); stop {
		return code
	}
	if err := serveRLS(ctx, env, cfg, log); err != nil {
		log.Error("quotient rls: " + err.Error())
		return 1
	}
	return 0
}

func serveRLS(ctx context.Context, env environment, cfg *rlsConfig, log *slog.Logger) error {
	policies, err := cfg.policyFlags.initial(os.ReadFile)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	stack, err := newLimiterStack(ctx, &cfg.limiterFlags, env.lookupEnv, stackOptions{name: "rls", policies: policies, overrides: cfg.source == "redis"}, log, reg)
	if err != nil {
		return err
	}
	defer stack.Close()
	log = stack.log
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotient_rls_config_reloads_total",
		Help: "Reloads of the RLS configuration directory by result (ok, error).",
	}, []string{"result"})
	stack.reg.MustRegister(reloads)

	var srv *rls.Server
	dir := filepath.Join(cfg.configDir, cfg.configSubdir)
	watcher, err := rls.NewWatcher(dir, rls.ParseOptions{MergeDomains: cfg.mergeDomains}, func(c *rls.Config) error {
		if srv == nil {
			return nil // the first configuration: NewServer checks it
		}
		return srv.SetConfig(c)
	}, log)
	if err != nil {
		return fmt.Errorf("--config-dir: %w", err)
	}
	watcher.OnCheck(func(ok bool) {
		if ok {
			reloads.WithLabelValues("ok").Inc()
		} else {
			reloads.WithLabelValues("error").Inc()
		}
	})
	srv, err = rls.NewServer(rls.ServerConfig{Limiter: stack.limiter, Config: watcher.Current(), ResponseHeaders: cfg.headers, MaxDelay: cfg.maxDelay})
	if err != nil {
		return fmt.Errorf("--config-dir %s: %w", dir, err)
	}
	// New policy sets reach the limiter through the server, which refuses
	// one that lacks a policy the configuration names.
	source, err := stack.startPolicies(&cfg.policyFlags, cfg.reload, srv, "rls")
	if err != nil {
		return err
	}
	// Warm start, as the gateway's (gateway_ready.go): health says
	// NOT_SERVING until the Redis connections are open, the scripts loaded
	// on every node and (--policy-source redis) the policy snapshot read,
	// or until --warm-timeout passes (then SERVING, in fallback).
	var reloader *policysync.Reloader
	if source != nil {
		reloader = source.reloader
	}
	ready, err := newReadiness(stack.store, reloaderLoad(reloader), cfg.warm, log, stack.reg, "rls")
	if err != nil {
		return err
	}

	// The gRPC services, one Register line each (and a health status
	// line below for each that health checkers may name).
	var opts []grpc.ServerOption
	if cfg.grpcTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.grpcTLS)))
	}
	if cfg.streamWorkers > 0 {
		opts = append(opts, grpc.NumStreamWorkers(uint32(cfg.streamWorkers)))
	}
	gs := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	// "" is the process (liveness): SERVING while it runs. The services
	// (readiness) are NOT_SERVING until the warm start ends (below).
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	services := []string{rlsv3.RateLimitService_ServiceDesc.ServiceName}
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	// RLQS (rlqs.go): same configuration, Redis and region set.
	var qs *quota.Server
	if cfg.quota.enabled {
		if qs, err = newQuotaServer(cfg, stack, srv, log, stack.reg); err != nil {
			return err
		}
		rlqsv3.RegisterRateLimitQuotaServiceServer(gs, qs)
		services = append(services, rlqsv3.RateLimitQuotaService_ServiceDesc.ServiceName)
		qctx, stopQuota := context.WithCancel(ctx)
		defer stopQuota()
		go qs.Run(qctx)
	}

	// Health checkers see NOT_SERVING while warming up, from the first
	// check (set before the listener serves: a check in between got
	// NotFound). Calls that come anyway are answered (the store, or the
	// fallback where it cannot).
	for _, name := range services {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	ln, metricsLn, err := openListeners(env.stdout, "rls", cfg.listen, cfg.metricsListen)
	if err != nil {
		return err
	}
	var metricsSrv *http.Server
	if metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		if cfg.metricsTLS != nil {
			metricsLn = tls.NewListener(metricsLn, cfg.metricsTLS)
		}
	}
	c := watcher.Current()
	log.Info("rls started", "listen", ln.Addr().String(), "tls", cfg.grpcTLS != nil, "client_certs", cfg.listenSec.clientCA != "", "config", dir, "files", len(c.Files()), "domains", len(c.Domains()), "rules", c.Rules())

	errc := make(chan error, 2)
	go func() {
		if err := gs.Serve(ln); err != nil {
			errc <- err
		}
	}()
	if metricsSrv != nil {
		go func() {
			if err := metricsSrv.Serve(metricsLn); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go watcher.Run(watchCtx, cfg.reload)
	go source.run(watchCtx)
	go func() {
		ready.run(watchCtx)
		if watchCtx.Err() != nil {
			return
		}
		for _, name := range services {
			hs.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
		}
	}()

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	// Tell health checkers first, then drain in-flight calls.
	hs.Shutdown()
	if qs != nil { // RLQS: TTL 0 to every Envoy, end the streams
		shutCtx, cancel := context.WithTimeout(context.Background(), cfg.shutdown)
		_ = qs.Shutdown(shutCtx)
		cancel()
	}
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(cfg.shutdown):
		gs.Stop()
	}
	if metricsSrv != nil {
		shutCtx, cancel := context.WithTimeout(context.Background(), cfg.shutdown)
		_ = metricsSrv.Shutdown(shutCtx)
		cancel()
	}
	log.Info("rls stopped")
	return serveErr
}
