package main

import (
	"bytes"
	"context"
	"crypto/tls"
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
With --listen-tls-cert and --listen-tls-key, --listen (and --metrics-listen)
is served over TLS only, the files re-read when they change;
--listen-tls-client-ca makes every client present a certificate that chains
to it (mutual TLS). An https:// upstream is verified against --upstream-tls-ca
(default: the system's roots); --upstream-tls-cert presents a client
certificate to it.
/metrics serves Prometheus metrics; /readyz answers 503 until the Redis
connections and scripts are warm on every node (or --warm-timeout passes:
ready in fallback), /healthz 200 while the process runs. Every flag can also be set with
QUOTIENT_<FLAG> (--redis is QUOTIENT_REDIS).

flags:`

// gatewayConfig is the parsed command line of `quotient gateway`.
type gatewayConfig struct {
	limiterFlags                                   // Redis, deadline, region set, usage (limiterstack.go)
	policyFlags                                    // --policies, --policy-source (limiterstack.go)
	listen, upstream, keys, trusted, metricsListen string
	reload, maxDelay, shutdown                     time.Duration
	warm                                           warmFlags        // warm start and readiness (gateway_ready.go)
	listenSec                                      listenSecurity   // TLS of --listen and --metrics-listen (transport.go)
	upstreamSec                                    upstreamSecurity // TLS to an https:// --upstream (transport.go)

	// Built from the flags by runGateway (transport), before serving.
	upstreamURL *url.URL
	listenTLS   *tls.Config       // nil: plaintext listeners
	upstreamRT  http.RoundTripper // nil: http.DefaultTransport
}

func parseGatewayFlags(env environment, args []string) (*gatewayConfig, error) {
	c := &gatewayConfig{}
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	fs.Usage = func() {
		fmt.Fprintln(env.stderr, gatewayUsage)
		fs.PrintDefaults()
	}
	c.limiterFlags.register(fs)
	c.policyFlags.register(fs, "policy file, a JSON array of policy documents (required with --policy-source file; with redis, the set until the first snapshot)")
	fs.StringVar(&c.listen, "listen", ":8080", "address to serve on")
	fs.StringVar(&c.upstream, "upstream", "", "URL of the service to forward to (required)")
	fs.StringVar(&c.keys, "keys", "", `JSON object mapping each API key to {"tier": ..., "account": ...}`)
	fs.StringVar(&c.trusted, "trusted-proxies", "", "comma list of CIDR prefixes whose X-Forwarded-For / Forwarded is believed")
	fs.StringVar(&c.metricsListen, "metrics-listen", "", "serve /metrics on this address instead of on --listen")
	fs.DurationVar(&c.reload, "reload-interval", 5*time.Second, "how often the policies file is checked for changes (mtime and size)")
	fs.DurationVar(&c.maxDelay, "max-delay", 5*time.Second, "longest a shaped (leaky bucket) request is held")
	fs.DurationVar(&c.shutdown, "shutdown-timeout", 10*time.Second, "how long in-flight requests get on shutdown")
	addWarmFlags(fs, &c.warm)
	c.listenSec.registerRequired(fs, "--listen (and /metrics on --metrics-listen)")
	c.upstreamSec.register(fs)
	if err := parseFlags(fs, args, env.lookupEnv); err != nil {
		return nil, err
	}
	if err := c.warm.validate(); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.upstream == "":
		return nil, errors.New("--upstream is required (or QUOTIENT_UPSTREAM)")
	case c.reload <= 0:
		return nil, fmt.Errorf("--reload-interval must be > 0, got %v", c.reload)
	}
	if err := c.limiterFlags.validate(); err != nil {
		return nil, err
	}
	if err := c.policyFlags.validate(true); err != nil {
		return nil, err
	}
	return c, nil
}

// runGateway implements `quotient gateway`.
func runGateway(ctx context.Context, env environment, args []string) int {
	cfg, err := parseGatewayFlags(env, args)
	if code, stop := flagsExit(env, "gateway", err); stop {
		return code
	}
	log := slog.New(slog.NewTextHandler(env.stderr, nil))
	if code, stop := flagsExit(env, "gateway", cfg.transport(log)); stop {
		return code
	}
	if err := serveGateway(ctx, env, cfg, log); err != nil {
		log.Error("quotient gateway: " + err.Error())
		return 1
	}
	return 0
}

// transport checks --upstream and builds the TLS of the listeners and of
// the upstream from the flags; errors name the flag. Reload failures of
// the listeners' files after start are logged on log.
func (c *gatewayConfig) transport(log *slog.Logger) error {
	u, err := url.Parse(c.upstream)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return fmt.Errorf("--upstream %q: want an absolute URL like http://127.0.0.1:9000", c.upstream)
	}
	c.upstreamURL = u
	if c.upstreamRT, err = c.upstreamSec.transport(u); err != nil {
		return err
	}
	// One reloader serves both listeners: the same files, HTTP/1.1.
	r, err := c.listenSec.reloader(log)
	if err != nil || r == nil {
		return err
	}
	c.listenTLS = r.TLSConfig()
	return nil
}

func serveGateway(ctx context.Context, env environment, cfg *gatewayConfig, log *slog.Logger) error {
	upstream := cfg.upstreamURL
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
	policies, err := cfg.policyFlags.initial(os.ReadFile)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	stack, err := newLimiterStack(ctx, &cfg.limiterFlags, env.lookupEnv, stackOptions{name: "gateway", policies: policies, overrides: cfg.source == "redis"}, log, reg)
	if err != nil {
		return err
	}
	defer stack.Close()
	l, log := stack.limiter, stack.log
	source, err := stack.startPolicies(&cfg.policyFlags, cfg.reload, l, "gateway")
	if err != nil {
		return err
	}
	ready, err := newGatewayReadiness(stack.store, source.reloader, cfg.warm, log, stack.reg)
	if err != nil {
		return err
	}

	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
		},
		Transport: cfg.upstreamRT,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// A TLS failure names the flag to fix (a plain upstream has none).
			if name, why := cfg.upstreamSec.blame(err, true, "the https:// of --upstream"); name != "" && upstream.Scheme == "https" {
				log.Warn("upstream error: "+name+": "+why, "err", err)
			} else {
				log.Warn("upstream error", "err", err)
			}
			httplimit.WriteProblem(w, &httplimit.Problem{Type: "about:blank", Title: "Bad Gateway", Status: http.StatusBadGateway, Detail: "The upstream service did not answer.", ViolatedPolicies: []string{}})
		},
	}
	mw := httplimit.Middleware(l,
		httplimit.WithIdentity(httplimit.APIKeyIdentity(func(k string) (httplimit.KeyInfo, bool) { i, ok := keys[k]; return i, ok }, proxies)),
		httplimit.WithMaxDelay(cfg.maxDelay),
	)
	metricsHandler := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	mux := http.NewServeMux()
	mux.Handle("/", ready.gate(mw(proxy)))
	mux.HandleFunc("/readyz", ready.readyz)
	mux.HandleFunc("/healthz", healthz)
	servers := []*http.Server{}
	// The servers' own errors (refused TLS handshakes among them) go to
	// the process's log.
	errLog := slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	ln, metricsLn, err := openListeners(env.stdout, "gateway", cfg.listen, cfg.metricsListen)
	if err != nil {
		return err
	}
	if metricsLn == nil {
		mux.Handle("/metrics", metricsHandler)
	} else {
		mm := http.NewServeMux()
		mm.Handle("/metrics", metricsHandler)
		servers = append(servers, &http.Server{Handler: mm, ReadHeaderTimeout: 10 * time.Second, ErrorLog: errLog})
	}
	main := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10, ErrorLog: errLog}
	servers = append([]*http.Server{main}, servers...)
	lns := []net.Listener{ln}
	if metricsLn != nil {
		lns = append(lns, metricsLn)
	}
	if cfg.listenTLS != nil {
		for i := range lns {
			lns[i] = tls.NewListener(lns[i], cfg.listenTLS)
		}
	}
	log.Info("gateway started", "listen", ln.Addr().String(), "tls", cfg.listenTLS != nil, "client_certs", cfg.listenSec.clientCA != "", "upstream", upstream.String(), "policies", len(policies), "keys", len(keys))

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
	go ready.run(watchCtx)
	go source.run(watchCtx)

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
	every   time.Duration // how often run checks

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
