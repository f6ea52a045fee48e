package region

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	dqredis "github.com/quotientlabs/quotient/dailyquota/redisio"
	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
	"github.com/quotientlabs/quotient/rebalancer/redisio"
)

// Coordinator runs one region's epoch loop and its HTTP endpoint.
// Construct with New, then call Run once. Addr, Registry and Status are
// safe for concurrent use.
type Coordinator struct {
	cfg      Config
	log      *slog.Logger
	redis    redis.UniversalClient
	kafka    *kafkautil.Cluster
	bus      *kafkabus.Bus
	adapter  *kafkabus.Adapter
	driver   *rebalancer.Driver
	dq       *dailyQuota // nil without global fixed-window policies
	registry *prometheus.Registry
	listener net.Listener
	server   *http.Server

	runOnce sync.Once
}

// New validates cfg, builds the clients (no I/O yet) and binds the HTTP
// listener, so that Addr is known before Run. Errors wrap ErrConfig (or
// the rebalancer's and kafkabus's config errors) and name the field; a
// listen failure names the address.
func New(cfg Config) (*Coordinator, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	limits, windows := GlobalLimits(cfg.Policies, len(cfg.Regions))
	if len(limits) == 0 && len(dqredis.Policies(cfg.Policies)) == 0 {
		return nil, fmt.Errorf("%w: Policies: no global token_bucket or leaky_bucket policy to share and no global fixed_window policy to replicate among %d policies", ErrConfig, len(cfg.Policies))
	}
	if n := len(dqredis.Policies(cfg.Policies)); windows > n {
		log.Warn("region: global sliding-window policies are neither shared nor replicated", "count", windows-n)
	}
	rcfg := rebalancer.DefaultConfig()
	rcfg.Region, rcfg.Regions, rcfg.Epoch, rcfg.MaxWait = cfg.Region, cfg.Regions, cfg.Epoch, cfg.MaxWait
	core, err := rebalancer.New(rcfg, limits)
	if err != nil {
		return nil, err
	}
	rcfg = core.Config()

	c := &Coordinator{cfg: cfg, log: log, registry: prometheus.NewRegistry()}
	c.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if cfg.RedisCluster || len(cfg.RedisAddrs) > 1 {
		c.redis = redis.NewClusterClient(&redis.ClusterOptions{Addrs: cfg.RedisAddrs})
	} else {
		c.redis = redis.NewClient(&redis.Options{Addr: cfg.RedisAddrs[0]})
	}
	fail := func(err error) (*Coordinator, error) {
		c.close()
		return nil, err
	}
	c.kafka, err = kafkautil.New(kafkautil.DefaultConfig(cfg.KafkaBrokers...))
	if err != nil {
		return fail(err)
	}
	if c.dq, err = newDailyQuota(cfg, c.redis, c.kafka, log, c.registry); err != nil {
		return fail(err)
	}
	bcfg := kafkabus.DefaultConfig()
	bcfg.Topic = cfg.Topic
	if cfg.Mirrored {
		bcfg.ConsumeTopics = kafkabus.MirroredTopics(cfg.Topic, others(cfg)...)
	}
	// Look back far enough for the reports of the current decision window
	// and the silence rule, whatever the epoch length.
	bcfg.Lookback = max(bcfg.Lookback, time.Duration(rcfg.SilenceEpochs+3)*rcfg.Epoch)
	if c.bus, err = kafkabus.New(c.kafka, bcfg); err != nil {
		return fail(err)
	}
	if c.adapter, err = kafkabus.NewAdapter(c.bus, rcfg.Epoch, nil); err != nil {
		return fail(err)
	}
	c.adapter.OnReject = func(err error) { log.Warn("region: report rejected", "err", err) }
	c.driver, err = rebalancer.NewDriver(core, rebalancer.DriverConfig{
		Usage:        redisio.NewSource(c.redis, cfg.UsageShards),
		Shares:       redisio.NewSink(c.redis, 0),
		Bus:          c.adapter,
		Clock:        cfg.Clock,
		CollectDelay: cfg.CollectDelay,
		Logger:       log,
		Observer:     newMetrics(c.registry, cfg.Regions),
	})
	if err != nil {
		return fail(err)
	}
	c.listener, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fail(fmt.Errorf("region: listen on %q: %w", cfg.Listen, err))
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(c.registry, promhttp.HandlerOpts{Registry: c.registry}))
	mux.HandleFunc("GET /healthz", c.healthz)
	c.server = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return c, nil
}

// Addr returns the HTTP listener's address (useful with Listen ":0").
func (c *Coordinator) Addr() string { return c.listener.Addr().String() }

// Registry returns the coordinator's metric registry.
func (c *Coordinator) Registry() *prometheus.Registry { return c.registry }

// Status returns the epoch loop's status.
func (c *Coordinator) Status() rebalancer.Status { return c.driver.Status() }

// Run serves HTTP and runs the consumer and the epoch loop until ctx ends
// or the HTTP server fails, then shuts everything down (the HTTP server
// within ShutdownTimeout), closes the clients and returns nil after a
// cancellation, or the failure. A consumer failure is logged and the
// consumer restarted after a second (it re-reads the lookback window;
// reports are deduplicated). Run may be called once; it closes the
// clients even when it fails.
func (c *Coordinator) Run(ctx context.Context) error {
	err := errors.New("region: Run called twice")
	c.runOnce.Do(func() { err = c.run(ctx) })
	return err
}

func (c *Coordinator) run(ctx context.Context) error {
	defer c.close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	serveErr := make(chan error, 1)
	wg.Add(3)
	go func() {
		defer wg.Done()
		if err := c.server.Serve(c.listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			serveErr <- fmt.Errorf("region: http server: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if err := c.adapter.Run(ctx); err != nil && ctx.Err() == nil {
				c.log.Error("region: kafka consumer failed; restarting", "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}
	}()
	go func() {
		defer wg.Done()
		_ = c.driver.Run(ctx) // returns ctx.Err()
	}()
	if c.dq != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.dq.driver.Run(ctx) // returns ctx.Err(); restarts its consumer itself
		}()
	}
	c.log.Info("region: coordinator running", "region", c.cfg.Region, "regions", c.cfg.Regions, "epoch", c.cfg.Epoch, "listen", c.Addr())

	var err error
	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), c.cfg.ShutdownTimeout)
	if serr := c.server.Shutdown(sctx); serr != nil && err == nil {
		err = fmt.Errorf("region: http shutdown: %w", serr)
	}
	scancel()
	wg.Wait()
	c.log.Info("region: coordinator stopped", "region", c.cfg.Region)
	return err
}

// close releases the clients built by New.
func (c *Coordinator) close() {
	if c.dq != nil {
		if err := c.dq.close(); err != nil {
			c.log.Warn("region: close daily-quota bus", "err", err)
		}
	}
	if c.bus != nil {
		if err := c.bus.Close(); err != nil {
			c.log.Warn("region: close kafka bus", "err", err)
		}
	}
	if c.kafka != nil {
		_ = c.kafka.Close()
	}
	if c.redis != nil {
		_ = c.redis.Close()
	}
	if c.listener != nil && c.server == nil {
		_ = c.listener.Close()
	}
}

// health is the /healthz body.
type health struct {
	Status      string    `json:"status"` // "ok" or "unhealthy"
	Reason      string    `json:"reason,omitempty"`
	Region      string    `json:"region"`
	LastEpoch   int64     `json:"last_epoch"`
	LastCollect time.Time `json:"last_collect,omitzero"`
	LastMode    string    `json:"last_mode,omitempty"`
	Unwritten   int       `json:"unwritten_updates"`
}

// healthz answers 200 when the epoch loop runs and has collected within
// the last two epochs (or started less than two epochs ago) and its share
// writes succeed; 503 otherwise, with the reason.
func (c *Coordinator) healthz(w http.ResponseWriter, _ *http.Request) {
	st := c.driver.Status()
	now := time.Now()
	if c.cfg.Clock != nil {
		now = c.cfg.Clock.Now()
	}
	h := health{Status: "ok", Region: c.cfg.Region, LastEpoch: st.LastEpoch, LastCollect: st.LastCollect, Unwritten: st.Unwritten}
	if !st.LastDecision.IsZero() {
		h.LastMode = st.LastMode.String()
	}
	stale := 2*c.cfg.Epoch + c.cfg.Epoch/2
	switch {
	case !st.Running:
		h.Reason = "epoch loop not running"
	case st.LastCollect.IsZero() && now.Sub(st.Started) > stale:
		h.Reason = "no epoch collected since start"
	case !st.LastCollect.IsZero() && now.Sub(st.LastCollect) > stale:
		h.Reason = fmt.Sprintf("last collection %v ago", now.Sub(st.LastCollect).Round(time.Millisecond))
	case st.LastWriteError != nil:
		h.Reason = "share writes failing: " + st.LastWriteError.Error()
	}
	code := http.StatusOK
	if h.Reason != "" {
		h.Status, code = "unhealthy", http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(h)
}
