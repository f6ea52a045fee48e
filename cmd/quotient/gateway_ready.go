package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/limiter/httplimit"
	"github.com/quotientlabs/quotient/region/policysync"
)

// This file is the gateway's warm start and readiness (issue #20): before
// it reports ready (/readyz 200) or forwards a request, the gateway opens
// its Redis connections and loads its scripts on every node
// (limiter.Warmer) and, with --policy-source redis, reads the policy
// snapshot once. A start-up that cannot do so within --warm-timeout
// reports ready anyway, in fallback, and says why, so that a Redis outage
// does not block a deploy.

// warmFlags are the gateway's warm-start flags.
type warmFlags struct {
	timeout, interval time.Duration
	conns             int
}

func addWarmFlags(fs *flag.FlagSet, c *warmFlags) {
	fs.DurationVar(&c.timeout, "warm-timeout", 5*time.Second, "longest start-up waits for Redis (connections and scripts on every node, and with --policy-source redis the policy snapshot) before it reports ready in fallback")
	fs.DurationVar(&c.interval, "warm-interval", time.Second, "how often every Redis node is checked for the scripts (a restarted or failed-over node is warmed again), and how often a failed warm-up is retried")
	fs.IntVar(&c.conns, "warm-conns", 0, "connections opened per Redis node before ready, at most the pool size (0: --redis-pipeline's pipelines, or 16 with --redis-pipeline 0)")
}

func (c *warmFlags) validate() error {
	switch {
	case c.timeout <= 0:
		return fmt.Errorf("--warm-timeout must be > 0, got %v", c.timeout)
	case c.interval <= 0:
		return fmt.Errorf("--warm-interval must be > 0, got %v", c.interval)
	case c.conns < 0 || c.conns > 4096:
		return fmt.Errorf("--warm-conns must be between 0 and 4096, got %d", c.conns)
	}
	return nil
}

// Readiness states (the quotient_gateway_ready gauge).
const (
	stateWarming       = 0 // /readyz 503; requests 503
	stateReady         = 1 // warmed up
	stateReadyFallback = 2 // serving while Redis is not warm (--warm-timeout passed first, or it went cold since): the fallback answers what the store cannot
)

// readiness is the warm start of the gateway and of rls: run warms the
// store and loads the policies, then marks the process ready (or, after
// the bound, ready in fallback). Its handlers are safe for concurrent use.
type readiness struct {
	warmer *limiter.Warmer
	// loadPolicies reads the policy snapshot once (nil with --policy-source
	// file, whose policies were read before start-up).
	loadPolicies func(context.Context) error
	cfg          warmFlags
	log          *slog.Logger
	addrs        string // the Redis addresses, for messages
	name         string // "gateway" or "rls", for messages and the gauge

	mu          sync.Mutex
	state       int
	policiesOK  bool
	policiesErr error
	readyAt     time.Time
	started     time.Time
}

// newGatewayReadiness is the readiness of a gateway on store; reloader is
// nil with --policy-source file.
func newGatewayReadiness(store *limiter.RedisStore, reloader *policysync.Reloader, cfg warmFlags, log *slog.Logger, reg prometheus.Registerer) (*readiness, error) {
	return newReadiness(store, reloaderLoad(reloader), cfg, log, reg, "gateway")
}

// reloaderLoad is the policy snapshot read of reloader (nil without one).
func reloaderLoad(reloader *policysync.Reloader) func(context.Context) error {
	if reloader == nil {
		return nil
	}
	return reloader.Load
}

// newReadiness is the warm start of the process name ("gateway", "rls"):
// its gauge is quotient_<name>_ready.
func newReadiness(store *limiter.RedisStore, loadPolicies func(context.Context) error, cfg warmFlags, log *slog.Logger, reg prometheus.Registerer, name string) (*readiness, error) {
	w, err := limiter.NewWarmer(store, limiter.WarmConfig{Conns: cfg.conns, Interval: cfg.interval, Logger: log, Metrics: reg})
	if err != nil {
		return nil, err
	}
	r := &readiness{warmer: w, loadPolicies: loadPolicies, cfg: cfg, log: log, policiesOK: loadPolicies == nil, started: time.Now(), addrs: redisAddrs(store.Client()), name: name}
	waiting := "/readyz 503"
	if name != "gateway" {
		waiting = "gRPC health NOT_SERVING"
	}
	if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "quotient_" + name + "_ready",
		Help: "Readiness: 0 warming up (" + waiting + "), 1 ready and warm, 2 ready in fallback (serving while Redis is not warm: not within --warm-timeout at start, or cold since).",
	}, r.gaugeValue)); err != nil {
		return nil, err
	}
	return r, nil
}

// run warms up until ctx ends: it keeps the store warm for the gateway's
// life, and returns once the gateway is ready (warm, or in fallback after
// the bound) with the policies loading in the background if need be.
func (r *readiness) run(ctx context.Context) {
	go func() { _ = r.warmer.Run(ctx) }()
	policies := make(chan struct{})
	if r.loadPolicies == nil {
		close(policies)
	} else {
		go r.policyLoop(ctx, policies)
	}
	bound := time.NewTimer(r.cfg.timeout)
	defer bound.Stop()
	waitStore := r.warmer.Ready()
	waitPolicies := (<-chan struct{})(policies)
	for waitStore != nil || waitPolicies != nil {
		select {
		case <-ctx.Done():
			return
		case <-waitStore:
			waitStore = nil
		case <-waitPolicies:
			waitPolicies = nil
		case <-bound.C:
			r.mu.Lock()
			r.state, r.readyAt = stateReadyFallback, time.Now()
			r.mu.Unlock()
			r.log.Warn(r.name+" ready in fallback: "+r.waitingFor(), "warm_timeout", r.cfg.timeout)
			return
		}
	}
	r.mu.Lock()
	r.state, r.readyAt = stateReady, time.Now()
	r.mu.Unlock()
	st := r.warmer.Status()
	r.log.Info(r.name+" ready", "redis_nodes", st.Nodes, "took", time.Since(r.started).Round(time.Millisecond))
}

// gaugeValue is quotient_<name>_ready: the state, where ready means warm
// now (a gateway that started in fallback and has since warmed up is 1, and
// one whose Redis went cold is 2).
func (r *readiness) gaugeValue() float64 {
	r.mu.Lock()
	state := r.state
	r.mu.Unlock()
	if state == stateWarming {
		return stateWarming
	}
	if r.waitingFor() == "" {
		return stateReady
	}
	return stateReadyFallback
}

// policyLoop reads the policy snapshot until one read succeeds.
func (r *readiness) policyLoop(ctx context.Context, done chan<- struct{}) {
	for {
		cctx, cancel := context.WithTimeout(ctx, r.cfg.interval+time.Second)
		err := r.loadPolicies(cctx)
		cancel()
		r.mu.Lock()
		r.policiesOK, r.policiesErr = err == nil, err
		r.mu.Unlock()
		if err == nil {
			close(done)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.interval):
		}
	}
}

// redisAddrs lists the addresses a client was given.
func redisAddrs(c redis.UniversalClient) string {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().Addr
	case *redis.ClusterClient:
		return strings.Join(c.Options().Addrs, ",")
	}
	return "(client)"
}

// waitingFor says what the gateway lacks ("" when nothing).
func (r *readiness) waitingFor() string {
	var parts []string
	if st := r.warmer.Status(); !st.Warm {
		why := "no answer yet"
		if st.Err != nil {
			why = st.Err.Error()
		}
		parts = append(parts, "redis "+r.addrs+" not warm ("+why+")")
	}
	r.mu.Lock()
	if !r.policiesOK {
		why := "not read yet"
		if r.policiesErr != nil {
			why = r.policiesErr.Error()
		}
		parts = append(parts, "policy snapshot not read ("+why+")")
	}
	r.mu.Unlock()
	return strings.Join(parts, "; ")
}

// readyz serves /readyz: 503 while warming up, 200 once ready; the body
// (text) says which, and what the gateway still lacks.
func (r *readiness) readyz(w http.ResponseWriter, _ *http.Request) {
	r.mu.Lock()
	state := r.state
	r.mu.Unlock()
	lacks := r.waitingFor()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	switch {
	case state == stateWarming:
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "warming up: waiting for %s\n", lacks)
	case lacks == "":
		st := r.warmer.Status()
		fmt.Fprintf(w, "ready: redis warm (%d nodes, %d warm-ups), policies loaded\n", st.Nodes, st.Warmups)
	case r.warmer.Status().Bypassed:
		fmt.Fprintf(w, "ready in fallback: %s; Redis was lost: every decision comes from the in-process fallback, without a Redis call, until Redis is warm again (retried every %v)\n", lacks, r.warmer.RetryInterval())
	default:
		fmt.Fprintf(w, "ready in fallback: %s; decisions the store cannot make come from the in-process fallback\n", lacks)
	}
}

// healthz serves /healthz: 200 while the process serves.
func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = fmt.Fprintln(w, "ok")
}

// gate answers 503 (Retry-After 1) to every request until the gateway is
// ready, then hands them to next.
func (r *readiness) gate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		warming := r.state == stateWarming
		r.mu.Unlock()
		if warming {
			w.Header().Set("Retry-After", "1")
			httplimit.WriteProblem(w, &httplimit.Problem{Type: "about:blank", Title: "Service Unavailable", Status: http.StatusServiceUnavailable,
				Detail: "The gateway is warming up (waiting for " + r.waitingFor() + ").", ViolatedPolicies: []string{}})
			return
		}
		next.ServeHTTP(w, req)
	})
}
