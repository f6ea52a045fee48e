package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// This file is the warm start of a RedisStore: what a server does before it
// reports ready, so that its first decisions cost one round trip like every
// other (no dial, no script load on the request path), and what keeps the
// store warm when Redis restarts or fails over and forgets its scripts.

// storeScripts are the Lua scripts a RedisStore runs: the decision script
// the replicated-window merge and the refund of a request split across
// cluster nodes.
var storeScripts = []*redis.Script{evalScript, mergeScript, refundScript}

// WarmConfig configures Warm and a Warmer. Start from DefaultWarmConfig;
// a zero field takes its default.
type WarmConfig struct {
	// Conns is the number of connections opened to every node (and left
	// idle in the client's pool), at most the client's PoolSize. Default:
	// the store's pipeline Workers for a pipelined store (each pipeline in
	// flight holds one connection per node), else 16: the concurrent
	// decisions that find a connection ready.
	Conns int
	// Interval is how often a Warmer checks that every node still holds
	// the scripts (SCRIPT EXISTS, one round trip per node). Default 1 s.
	Interval time.Duration
	// RetryInterval is how long a Warmer waits after a warm-up that
	// failed (Redis down or not up yet) before it tries again: the bound,
	// after Redis accepts connections again, on how long decisions keep
	// coming from the fallback. Default 50 ms; at most Interval.
	RetryInterval time.Duration
	// Timeout bounds one warm-up or one check. Default 2 s.
	Timeout time.Duration
	// Logger receives warm-ups, failures and recoveries. Default: discard.
	Logger *slog.Logger
	// Metrics, when set, receives the Warmer's metrics:
	//
	//	quotient_store_warm                 gauge: 1 when every node is warm, else 0
	//	quotient_store_warmups_total{result} counter: warm-ups by result (ok, error)
	Metrics prometheus.Registerer
}

// DefaultWarmConfig returns the defaults (Conns 0: chosen per store).
func DefaultWarmConfig() WarmConfig {
	return WarmConfig{Interval: time.Second, RetryInterval: 50 * time.Millisecond, Timeout: 2 * time.Second}
}

func (c *WarmConfig) validate() error {
	d := DefaultWarmConfig()
	if c.Interval == 0 {
		c.Interval = d.Interval
	}
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = min(d.RetryInterval, c.Interval)
	}
	switch {
	case c.Conns < 0 || c.Conns > 4096:
		return fmt.Errorf("limiter: warm config: Conns must be between 0 (default) and 4096, got %d", c.Conns)
	case c.Interval < 0:
		return fmt.Errorf("limiter: warm config: Interval must be > 0, got %v", c.Interval)
	case c.RetryInterval < 0 || c.RetryInterval > c.Interval:
		return fmt.Errorf("limiter: warm config: RetryInterval must be > 0 and at most Interval (%v), got %v", c.Interval, c.RetryInterval)
	case c.Timeout < 0:
		return fmt.Errorf("limiter: warm config: Timeout must be > 0, got %v", c.Timeout)
	}
	if c.Logger == nil {
		c.Logger = discardLogger()
	}
	return nil
}

// conns is the number of connections to open per node.
func (s *RedisStore) warmConns(cfg WarmConfig) int {
	if cfg.Conns > 0 {
		return cfg.Conns
	}
	if s.pipe != nil {
		return s.pipe.cfg.Workers
	}
	return 16
}

// ErrNotWarm wraps the errors of Warm: some node could not be reached, or
// refused a script. The store still works (a decision dials and loads
// what it needs), but its first decisions may miss their deadline.
var ErrNotWarm = errors.New("limiter: store not warm")

// Warm prepares s for its first decisions, on every node it can route to:
// on a Redis Cluster it reads the cluster's slots and then, on every
// primary and replica (a replica holds the scripts too, so a failover
// finds them), opens cfg.Conns connections (PING on each, then left idle
// in the client's pool) and loads every script (SCRIPT LOAD), and has the
// cluster client read the server's command table, so that no decision pays
// a dial, an EVAL of the script source or a COMMAND. On a standalone
// Redis it does the same on the one server. Share records need no warm-up:
// the script reads a subject's share in the same call as its bucket.
//
// It returns the number of nodes warmed, and an error wrapping ErrNotWarm
// that names the node and the step that failed when some node could not be
// warmed (it stops at ctx's end). It is safe for concurrent use, and
// idempotent: warming a warm store costs one PING per connection and one
// SCRIPT LOAD per script and node.
func (s *RedisStore) Warm(ctx context.Context, cfg WarmConfig) (nodes int, err error) {
	if err := cfg.validate(); err != nil {
		return 0, err
	}
	conns := s.warmConns(cfg)
	var n atomic.Int64
	each := func(ctx context.Context, node *redis.Client) error {
		if err := warmNode(ctx, node, conns); err != nil {
			return err
		}
		n.Add(1)
		return nil
	}
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachShard(ctx, each)
		if err != nil && n.Load() == 0 && !errors.Is(err, ErrNotWarm) {
			err = fmt.Errorf("%w: cluster slots: %w", ErrNotWarm, err)
		}
		if err == nil {
			// The cluster client reads the server's command table
			// (COMMAND, a large reply) on its first routed command;
			// let that be this one rather than a decision's.
			if e := c.Exists(ctx, "quotient:warm").Err(); e != nil {
				err = fmt.Errorf("%w: cluster command table: %v", ErrNotWarm, e)
			}
		}
	case *redis.Client:
		err = each(ctx, c)
	default:
		// Another UniversalClient (a failover client): load the scripts
		// through it; its connections are dialled on first use.
		for _, sc := range storeScripts {
			if err = sc.Load(ctx, s.client).Err(); err != nil {
				err = fmt.Errorf("%w: SCRIPT LOAD: %v", ErrNotWarm, err)
				break
			}
		}
		if err == nil {
			n.Add(1)
		}
	}
	return int(n.Load()), err
}

// warmNode opens conns connections to node and loads the scripts there.
func warmNode(ctx context.Context, node *redis.Client, conns int) error {
	addr := node.Options().Addr
	conns = min(conns, node.Options().PoolSize)
	// One PING through the client itself first: it fails fast when the
	// node is down, and its handshake settles what go-redis learns about
	// the server on a first connection (the maintenance notifications
	// mode, written under the client's own lock), so that the Conns below,
	// each with a lock of its own, only read it.
	if err := node.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("%w: node %s: connect: %w", ErrNotWarm, addr, err)
	}
	// Each Conn holds its own pool connection from its first command
	// until Close, so conns PINGs in flight at once open conns
	// connections; Close puts them back in the pool, idle.
	cs := make([]*redis.Conn, conns)
	errs := make([]error, conns)
	var wg sync.WaitGroup
	for i := range cs {
		cs[i] = node.Conn()
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = cs[i].Ping(ctx).Err()
		}()
	}
	wg.Wait()
	for _, c := range cs {
		_ = c.Close()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: node %s: connect: %w", ErrNotWarm, addr, firstErr(errs))
	}
	for _, sc := range storeScripts {
		if err := sc.Load(ctx, node).Err(); err != nil {
			return fmt.Errorf("%w: node %s: SCRIPT LOAD: %w", ErrNotWarm, addr, err)
		}
	}
	return nil
}

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// checkWarm reports whether every node still holds every script (one
// SCRIPT EXISTS per node); a node that restarted or was flushed does not.
func (s *RedisStore) checkWarm(ctx context.Context) error {
	hashes := make([]string, len(storeScripts))
	for i, sc := range storeScripts {
		hashes[i] = sc.Hash()
	}
	check := func(ctx context.Context, node redis.Cmdable, addr string) error {
		have, err := node.ScriptExists(ctx, hashes...).Result()
		if err != nil {
			return fmt.Errorf("%w: node %s: SCRIPT EXISTS: %w", ErrNotWarm, addr, err)
		}
		for i, ok := range have {
			if !ok {
				return fmt.Errorf("%w: node %s: script %s missing (restart, failover or SCRIPT FLUSH)", ErrNotWarm, addr, hashes[i][:8])
			}
		}
		return nil
	}
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
			return check(ctx, node, node.Options().Addr)
		})
	case *redis.Client:
		return check(ctx, c, c.Options().Addr)
	default:
		return check(ctx, s.client, "(failover)")
	}
}

// coldSignal is how the request path and a Warmer talk: a decision that
// meets NOSCRIPT calls notify, which wakes the Warmer to load the scripts
// at once, so that only the decisions already in flight pay for an EVAL;
// one that loses its connection calls lost (warmgate.go); and while down
// is set every decision is answered without a store call (bypassErr).
// The zero value (and a nil one) does nothing. Safe for concurrent use;
// no method blocks.
type coldSignal struct {
	fn atomic.Pointer[func()]
	// gate: the running Warmer bypasses the store while Redis is down
	// (a standalone Redis; see Warmer).
	gate atomic.Bool
	// down: Redis was lost and is not warm again yet; decisions bypass
	// the store. Only set while gate is.
	down atomic.Bool
}

func (c *coldSignal) notify() {
	if c == nil {
		return
	}
	if f := c.fn.Load(); f != nil {
		(*f)()
	}
}

// runScript runs the decision script with EVALSHA and, when Redis has
// forgotten it (NOSCRIPT: a restart, a failover, a flush), sends it with
// EVAL, which also caches it again, and wakes the Warmer.
func (s *RedisStore) runScript(ctx context.Context, keys []string, args []any) ([]int64, error) {
	v, err := scriptValues(evalScript.EvalSha(ctx, s.client, keys, args...))
	if err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")) {
		s.cold.notify()
		v, err = scriptValues(evalScript.Eval(ctx, s.client, keys, args...))
	}
	return v, err
}

// WarmStatus is a Warmer's view of its store.
type WarmStatus struct {
	// Warm is set while every node was warm at the last warm-up or check.
	Warm bool
	// Nodes is the number of nodes warmed by the last warm-up.
	Nodes int
	// Warmups counts the warm-ups that succeeded (the first, then one per
	// recovery: a restart, a failover, a flush).
	Warmups int64
	// Since is when Warm last changed (zero before the first attempt).
	Since time.Time
	// Err is why the store is not warm (nil when it is, and before the
	// first attempt).
	Err error
	// Bypassed is set while decisions skip the store and come from the
	// fallback at once, without a store call: a standalone Redis was lost
	// (refused, reset or closed connections, or LOADING) and is not warm
	// again yet.
	Bypassed bool
}

// Warmer keeps a RedisStore warm: Run warms it at once, retries every
// RetryInterval until that succeeds, then checks every Interval that each
// node still holds the scripts and warms again (reload, redial) whatever
// node forgot them. A decision that meets NOSCRIPT wakes it at once, so
// after a failover or SCRIPT FLUSH only the decisions in flight before
// that pay for a script load (one EVAL each), not those of a whole
// Interval.
//
// When Redis goes away the Warmer learns it at once: it holds one
// subscribed connection per node (one more connection per node, which
// Redis never times out) that ends when the node stops, and decisions
// that lose their connection tell it too. It then warms again every
// RetryInterval until Redis answers. On a standalone Redis, from the
// moment it learns Redis is gone until that warm-up has succeeded, the
// store is bypassed: every decision fails at once with
// ErrStoreUnavailable, without a call (the fallback answers, the breaker
// does not count it), so that no decision dials a connection or meets
// NOSCRIPT on a Redis that has just restarted, and once the store
// answers again its connections are open and its scripts loaded. (On a
// cluster the store is not bypassed: one node down leaves the others
// deciding; the Warmer still warms every node again at once.)
//
// Use one Warmer per store. Status and Ready are safe for concurrent use;
// Run must be called once.
type Warmer struct {
	store *RedisStore
	cfg   WarmConfig

	ready     chan struct{}
	readyOnce sync.Once
	kick      chan struct{} // a decision met NOSCRIPT: check now
	mu        sync.Mutex
	st        WarmStatus

	warm    prometheus.Gauge
	warmups *prometheus.CounterVec

	// onWarm (Run's goroutine only) runs after each successful warm-up,
	// before the status says so.
	onWarm func()
	// loggedErr and loggedAt (Run's goroutine only) rate-limit the log.
	loggedErr string
	loggedAt  time.Time
}

// NewWarmer returns a Warmer of store. It fails when cfg is invalid or
// its metrics cannot be registered.
func NewWarmer(store *RedisStore, cfg WarmConfig) (*Warmer, error) {
	if store == nil {
		return nil, errors.New("limiter: warmer: store is nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	w := &Warmer{store: store, cfg: cfg, ready: make(chan struct{}), kick: make(chan struct{}, 1)}
	w.warm = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quotient_store_warm",
		Help: "1 when every Redis node of the store has its connections open and its scripts loaded, else 0.",
	})
	w.warmups = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotient_store_warmups_total",
		Help: "Warm-ups of the store (connections opened, scripts loaded on every node), by result (ok, error).",
	}, []string{"result"})
	if cfg.Metrics != nil {
		for _, c := range []prometheus.Collector{w.warm, w.warmups} {
			if err := cfg.Metrics.Register(c); err != nil {
				return nil, fmt.Errorf("limiter: warm config: Metrics: %w", err)
			}
		}
	}
	return w, nil
}

// RetryInterval is the configured wait after a failed warm-up.
func (w *Warmer) RetryInterval() time.Duration { return w.cfg.RetryInterval }

// Ready is closed when the first warm-up has succeeded.
func (w *Warmer) Ready() <-chan struct{} { return w.ready }

// Status is the store's warm state now.
func (w *Warmer) Status() WarmStatus {
	w.mu.Lock()
	st := w.st
	w.mu.Unlock()
	st.Bypassed = w.store.cold.down.Load()
	return st
}

func (w *Warmer) set(warm bool, nodes int, err error) {
	w.mu.Lock()
	changed := w.st.Warm != warm || w.st.Since.IsZero()
	if changed {
		w.st.Since = time.Now()
	}
	w.st.Warm, w.st.Err = warm, err
	if warm {
		w.st.Nodes = nodes
		w.st.Warmups++
	}
	w.mu.Unlock()
	if warm {
		w.store.cold.down.Store(false) // answer from the store again
		w.warm.Set(1)
		w.readyOnce.Do(func() { close(w.ready) })
	} else {
		if isConnErr(err) && w.store.cold.gate.Load() {
			w.store.cold.down.Store(true)
		}
		w.warm.Set(0)
	}
}

// warmOnce runs one warm-up and records its result.
func (w *Warmer) warmOnce(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	start := time.Now()
	var nodes int
	err := error(nil)
	if !w.Status().Warm {
		err = w.store.reachable(cctx)
	}
	if err == nil {
		nodes, err = w.store.Warm(cctx, w.cfg)
	}
	if ctx.Err() != nil {
		return false
	}
	if err != nil {
		w.warmups.WithLabelValues("error").Inc()
		// Once per distinct error, and every 30 s while it lasts: an outage
		// retried every Interval does not flood the log.
		if msg := err.Error(); msg != w.loggedErr || time.Since(w.loggedAt) >= 30*time.Second {
			w.loggedErr, w.loggedAt = msg, time.Now()
			w.cfg.Logger.Warn("limiter: store not warm; retrying", "err", err, "retry_every", w.cfg.Interval)
		}
		w.set(false, nodes, err)
		return false
	}
	w.loggedErr = ""
	w.warmups.WithLabelValues("ok").Inc()
	w.cfg.Logger.Info("limiter: store warm", "nodes", nodes, "conns_per_node", w.store.warmConns(w.cfg), "took", time.Since(start))
	if w.onWarm != nil {
		w.onWarm()
	}
	w.set(true, nodes, nil)
	return true
}

// Run warms the store and keeps it warm until ctx ends; it returns
// ctx.Err(). Failures are logged, counted and kept in Status, never fatal.
// Besides every Interval (every RetryInterval while not warm), it warms
// again at once when a decision of the store meets NOSCRIPT or loses its
// connection, or when a node's watch connection ends (see Warmer).
func (w *Warmer) Run(ctx context.Context) error {
	kick := func() {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
	cold := &w.store.cold
	_, standalone := w.store.client.(*redis.Client)
	cold.gate.Store(standalone)
	cold.fn.Store(&kick)
	var watch *nodeWatch
	defer func() {
		watch.stop()
		cold.fn.Store(nil)
		cold.gate.Store(false)
		cold.down.Store(false)
	}()
	// gone is called (once per watch) when a node's watch connection
	// ends: Redis stopped, restarted or closed it.
	gone := func(err error) {
		if cold.gate.Load() {
			cold.down.Store(true)
		}
		w.cfg.Logger.Warn("limiter: lost a Redis connection; warming again", "err", err)
		w.set(false, 0, fmt.Errorf("%w: watch connection lost: %w", ErrNotWarm, err))
		kick()
	}
	// Each warm-up watches its nodes again, before it reports warm (the
	// previous watch may have ended with the server it watched).
	w.onWarm = func() {
		watch.stop()
		watch = watchNodes(ctx, w.store.client, gone)
	}
	warmUp := func() bool { return w.warmOnce(ctx) }
	warm := warmUp()
	for {
		wait := w.cfg.Interval
		if !warm {
			wait = w.cfg.RetryInterval
		}
		t := time.NewTimer(wait)
		kicked := false
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		case <-w.kick:
			t.Stop()
			kicked = true
		}
		if warm && !kicked {
			cctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
			err := w.store.checkWarm(cctx)
			cancel()
			if err == nil || ctx.Err() != nil {
				continue
			}
			w.cfg.Logger.Warn("limiter: store went cold; warming again", "err", err)
			w.set(false, 0, err)
		}
		// Not warm, a decision met NOSCRIPT or lost its connection, or a
		// watch ended: warm every node again.
		warm = warmUp()
	}
}
