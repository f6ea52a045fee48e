package region

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	dqredis "github.com/quotientlabs/quotient/dailyquota/redisio"
	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/internal/redisconn"
	"github.com/quotientlabs/quotient/internal/tlsconfig"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
	"github.com/quotientlabs/quotient/rebalancer/redisio"
	"github.com/quotientlabs/quotient/region/admin"
	"github.com/quotientlabs/quotient/region/membership"
	"github.com/quotientlabs/quotient/region/policysync"
)

// Coordinator runs one region's coordinator replica: its HTTP endpoint
// (/metrics, /healthz, /readyz and, with AdminTokens, the admin API under
// /v1/), the policy log's follower and materialiser (with PolicyLog), and,
// while it leads the region (always without Gossip), the epoch loop and
// the daily-quota replication. Construct with New, then call Run once.
// Addr, GossipAddr, Leading, Registry and Status are safe for concurrent
// use.
type Coordinator struct {
	cfg      Config
	log      *slog.Logger
	name     string // owner of the claimed epochs; the gossip name with Gossip
	redis    redis.UniversalClient
	kafka    *kafkautil.Cluster
	bus      *kafkabus.Bus
	transfer *kafkabus.TransferBus // nil with NoTransfers
	policies *policySet
	rcfg     rebalancer.Config
	observer *metrics
	dq       *dailyQuota
	fences   []*membership.Fence // by key part (one without parts)
	member   *membership.Member  // nil without Gossip
	parts    int                 // Config.Parts, >= 1

	// Policy log (nil without PolicyLog).
	catalog  *admin.Catalog
	plog     *policysync.KafkaLog
	follower *policysync.Follower
	mat      *policysync.Materializer

	registry *prometheus.Registry
	usage    []*loggedUsage // the region's usage by key part, read by every term's driver
	leading  atomic.Bool
	driver   atomic.Pointer[rebalancer.Driver] // the current term's; nil before the first (one part)

	// With Parts > 1: the driver of each part this replica runs now.
	partsMu      sync.Mutex
	partDrivers  map[int]*rebalancer.Driver
	mismatchOnce sync.Once
	observerMu   sync.Mutex // serialises the parts' observer calls
	listener     net.Listener
	server       *http.Server

	runOnce sync.Once
}

// New validates cfg, builds the clients (no I/O yet), joins the gossip
// cluster (with Gossip) and binds the HTTP listener, so that Addr and
// GossipAddr are known before Run. Errors wrap ErrConfig (or the
// rebalancer's and kafkabus's config errors) and name the field; a listen
// or join failure names the address.
func New(cfg Config) (*Coordinator, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	limits, windows := GlobalLimits(cfg.Policies, len(cfg.Regions))
	if err := checkLimits(limits); err != nil {
		return nil, err
	}
	if !cfg.PolicyLog && len(limits) == 0 && len(dqredis.Policies(cfg.Policies)) == 0 {
		return nil, fmt.Errorf("%w: Policies: no global token_bucket or leaky_bucket policy to share and no global fixed_window policy to replicate among %d policies", ErrConfig, len(cfg.Policies))
	}
	if n := len(dqredis.Policies(cfg.Policies)); windows > n {
		log.Warn("region: global sliding-window policies are neither shared nor replicated", "count", windows-n)
	}
	rcfg := rebalancer.DefaultConfig()
	rcfg.Region, rcfg.Regions, rcfg.Epoch, rcfg.MaxWait = cfg.Region, cfg.Regions, cfg.Epoch, cfg.MaxWait
	rcfg.Transfers = !cfg.NoTransfers
	// A key is asked for at most once per pressure read: the reads are
	// what shows the need again (scaled with the epoch in the simulator's
	// live and deployed modes, which shorten both).
	rcfg.AskInterval = min(cfg.PressureInterval, cfg.Epoch)
	if err := rcfg.Validate(); err != nil {
		return nil, err
	}

	c := &Coordinator{cfg: cfg, log: log, name: cfg.Region, rcfg: rcfg, registry: prometheus.NewRegistry(), parts: cfg.Parts, partDrivers: map[int]*rebalancer.Driver{}}
	if cfg.Gossip != nil {
		c.name = cfg.Gossip.Name
	}
	c.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	c.redis = redisconn.Options{
		Addrs: cfg.RedisAddrs, Cluster: cfg.RedisCluster, TLS: cfg.RedisTLS, Username: cfg.RedisUsername, Password: cfg.RedisPassword,
	}.New()
	c.fences = make([]*membership.Fence, c.parts)
	for p := range c.parts {
		c.fences[p] = membership.NewPartFence(c.redis, cfg.Region, p, c.parts)
	}
	fail := func(err error) (*Coordinator, error) {
		c.close()
		return nil, err
	}
	var err error
	kcfg := kafkautil.DefaultConfig(cfg.KafkaBrokers...)
	kcfg.TLS, kcfg.SASL = cfg.KafkaTLS, cfg.KafkaSASL
	c.kafka, err = kafkautil.New(kcfg)
	if err != nil {
		return fail(err)
	}
	if cfg.PolicyLog {
		c.catalog = admin.NewCatalog()
		if c.plog, err = policysync.NewKafkaLog(c.kafka, cfg.PolicyTopic); err != nil {
			return fail(err)
		}
		c.mat = policysync.NewMaterializer(c.catalog, c.redis, log)
		c.follower = policysync.NewFollower(c.kafka, cfg.PolicyTopic, c.catalog, c.policyChanged, log)
	}
	c.policies = newPolicySet(cfg.Policies, c.catalog, len(cfg.Regions))
	c.dq = newDailyQuota(cfg, c.redis, c.kafka, log, c.registry)
	bcfg := kafkabus.DefaultConfig()
	bcfg.Topic = cfg.Topic
	if cfg.Mirrored {
		bcfg.ConsumeTopics = kafkabus.MirroredTopics(cfg.Topic, others(cfg)...)
	}
	// Look back far enough for the reports of the current decision window
	// and the silence rule, whatever the epoch length.
	bcfg.Lookback = max(bcfg.Lookback, time.Duration(rcfg.SilenceEpochs+3)*rcfg.Epoch)
	bcfg.Now = cfg.Clock.Now
	// A partition per part: each part's consumer reads only its own
	// (kafkabus.PartitionOf). An existing topic keeps its count.
	bcfg.Partitions = max(bcfg.Partitions, c.parts)
	if c.bus, err = kafkabus.New(c.kafka, bcfg); err != nil {
		return fail(err)
	}
	c.observer = newMetrics(c.registry, cfg.Regions)
	if !cfg.NoTransfers {
		tcfg := kafkabus.DefaultTransferConfig()
		tcfg.Topic = cfg.TransferTopic
		if cfg.Mirrored {
			tcfg.ConsumeTopics = kafkabus.MirroredTopics(cfg.TransferTopic, others(cfg)...)
		}
		tcfg.Now = cfg.Clock.Now
		tcfg.OnMalformed = func(err error) {
			c.observer.transferMalformed.Inc()
			log.Warn("region: malformed transfer message skipped", "err", err)
		}
		if c.transfer, err = kafkabus.NewTransferBus(c.kafka, tcfg); err != nil {
			return fail(err)
		}
	}
	srcs := make([]*redisio.Source, c.parts)
	for p := range c.parts {
		layout := limiter.UsageLayout{Shards: cfg.UsageShards, SplitShards: cfg.UsageSplitShards}
		if c.parts > 1 {
			layout.Parts, layout.Part = c.parts, p
		}
		srcs[p] = redisio.NewLayoutSource(c.redis, layout)
	}
	c.usage = newLoggedUsages(srcs, log, c.registry)
	c.registerRole()
	// Check the driver's configuration now (CollectDelay against MaxWait),
	// so a bad one fails New and not the first term.
	if _, _, _, err := c.newDriver(0); err != nil {
		return fail(err)
	}

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(c.registry, promhttp.HandlerOpts{Registry: c.registry}))
	mux.HandleFunc("GET /healthz", c.healthz)
	mux.HandleFunc("GET /readyz", c.readyz)
	if cfg.AdminTokens != nil {
		usage, err := admin.NewRedisUsage(cfg.Region, map[string]redis.UniversalClient{cfg.Region: c.redis}, len(cfg.Regions), 0)
		if err != nil {
			return fail(err)
		}
		srv, err := admin.NewServer(admin.Config{Catalog: c.catalog, Log: c.plog, Tokens: cfg.AdminTokens, Usage: usage, Logger: log, Changed: c.policyChanged, Clock: cfg.Clock})
		if err != nil {
			return fail(err)
		}
		var h http.Handler = srv
		if cfg.AdminClientCert {
			h = requireClientCert(srv)
		}
		mux.Handle("/v1/", h)
	}
	if cfg.Gossip != nil {
		gc := *cfg.Gossip
		if gc.Logger == nil {
			gc.Logger = log
		}
		if c.member, err = membership.Join(gc); err != nil {
			return fail(err)
		}
	}
	c.listener, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fail(fmt.Errorf("region: listen on %q: %w", cfg.Listen, err))
	}
	if cfg.ListenTLS != nil {
		c.listener = tls.NewListener(c.listener, cfg.ListenTLS)
	}
	c.server = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return c, nil
}

// newDriver builds a term's epoch loop: a new Core (which adopts the
// region's share records when the term takes over from another replica,
// and warms up otherwise; see the rebalancer package doc), a new adapter on the shared bus (the caller
// runs its consumer), with transfers a new adapter on the transfer bus
// (the caller runs its consumer too; nil without transfers), and the fence.
// With Parts > 1 it is the loop of key part part only: its usage shards,
// its reports, its fence and the share records of its keys.
func (c *Coordinator) newDriver(part int) (*rebalancer.Driver, *kafkabus.Adapter, *kafkabus.TransferAdapter, error) {
	core, err := rebalancer.New(c.rcfg, c.policies)
	if err != nil {
		return nil, nil, nil, err
	}
	adapter, err := kafkabus.NewPartAdapter(c.bus, c.rcfg.Epoch, c.cfg.Clock.Now, part, c.parts)
	if err != nil {
		return nil, nil, nil, err
	}
	adapter.OnReject = func(err error) {
		if errors.Is(err, kafkabus.ErrPartsMismatch) {
			c.observer.partsMismatch.Inc()
			c.mismatchOnce.Do(func() {
				c.log.Error("region: reports of another part count refused (every region must run the same --parts); logged once, counted in quotient_coordinator_reports_parts_mismatch_total", "parts", c.parts, "err", err)
			})
			return
		}
		c.log.Warn("region: report rejected", "err", err)
	}
	var records rebalancer.RecordSource = redisio.NewRecords(c.redis)
	if c.parts > 1 {
		records = partRecords{records, part, c.parts}
	}
	var (
		tadapter *kafkabus.TransferAdapter
		tbus     rebalancer.TransferBus
		pressure rebalancer.PressureSource
	)
	if c.transfer != nil {
		if tadapter, err = kafkabus.NewTransferAdapter(c.transfer, c.rcfg.Epoch, c.cfg.Clock.Now); err != nil {
			return nil, nil, nil, err
		}
		tadapter.OnReject = func(err error) {
			c.observer.transferMalformed.Inc()
			c.log.Warn("region: transfer message rejected", "err", err)
		}
		ps := redisio.NewPressureSource(c.redis, c.cfg.UsageShards, c.rcfg.Epoch, 0)
		// Rates over at least a pressure interval (the gateways' flush
		// interval by default), however often the wake-ups come.
		ps.SetWindow(c.cfg.PressureInterval)
		tbus, pressure = tadapter, ps
		if c.parts > 1 {
			tbus, pressure = partTransfers{tadapter, part, c.parts}, partPressure{ps, part, c.parts}
		}
	}
	d, err := rebalancer.NewDriver(core, rebalancer.DriverConfig{
		Usage:        c.usage[part],
		Shares:       redisio.NewSink(c.redis, 0),
		Bus:          adapter,
		Clock:        c.cfg.Clock,
		CollectDelay: c.cfg.CollectDelay,
		Logger:       c.log,
		Observer:     c.loopObserver(),
		Fence:        fenceOf{c.fences[part], c.name},
		Records:      records,
		// A first start (no report of this region on the bus in the span a
		// restart needs) skips the warm-up (rebalancer package doc).
		History: adapter,

		Pressure:         pressure,
		Transfers:        tbus,
		PressureInterval: c.cfg.PressureInterval,
	})
	return d, adapter, tadapter, err
}

// partRecords are the share records of one key part's keys: a part's
// driver that takes over adopts only its own keys.
type partRecords struct {
	src         rebalancer.RecordSource
	part, parts int
}

func (r partRecords) Records(ctx context.Context) ([]rebalancer.ShareRecord, error) {
	recs, err := r.src.Records(ctx)
	if err != nil {
		return nil, err
	}
	out := recs[:0]
	for _, rec := range recs {
		if limiter.UsagePart(rec.PolicyID, rec.Subject, r.parts) == r.part {
			out = append(out, rec)
		}
	}
	return out, nil
}

// partTransfers is the transfer bus of one key part: it hands the part's
// driver only the keys of its part of each ask and give, and drops a
// message with none (another part's: every part's driver reads every
// message, and each takes its own keys; a give's giver lowered and wrote
// every key before sending it, so a part that raises only its own keys
// raises nothing another part would not).
type partTransfers struct {
	rebalancer.TransferBus
	part, parts int
}

func (t partTransfers) mine(k rebalancer.Key) bool {
	return limiter.UsagePart(k.PolicyID, k.Subject, t.parts) == t.part
}

func (t partTransfers) ReceiveTransfer(ctx context.Context) (*rebalancer.Ask, *rebalancer.Give, error) {
	for {
		ask, give, err := t.TransferBus.ReceiveTransfer(ctx)
		if err != nil {
			return nil, nil, err
		}
		if ask != nil {
			ask.Keys = slices.DeleteFunc(ask.Keys, func(k rebalancer.AskKey) bool { return !t.mine(k.Key) })
			if len(ask.Keys) > 0 {
				return ask, nil, nil
			}
		}
		if give != nil {
			give.Keys = slices.DeleteFunc(give.Keys, func(k rebalancer.GiveKey) bool { return !t.mine(k.Key) })
			if len(give.Keys) > 0 {
				return nil, give, nil
			}
		}
	}
}

// partPressure is the pressure source of one key part: the marks of its
// keys only (each part's driver reads every mark; a replica running k
// parts reads them k times). WaitPressure is the source's.
type partPressure struct {
	*redisio.PressureSource
	part, parts int
}

func (p partPressure) Pressure(ctx context.Context, now time.Time) ([]rebalancer.Pressure, error) {
	out, err := p.PressureSource.Pressure(ctx, now)
	return slices.DeleteFunc(out, func(x rebalancer.Pressure) bool {
		return limiter.UsagePart(x.PolicyID, x.Subject, p.parts) != p.part
	}), err
}

// fenceOf is the region's fence (of one part) as this replica claims it.
type fenceOf struct {
	f     *membership.Fence
	owner string
}

func (f fenceOf) Last(ctx context.Context) (int64, bool, error) { return f.f.Last(ctx) }
func (f fenceOf) Claim(ctx context.Context, epoch int64) (bool, error) {
	return f.f.Claim(ctx, epoch, f.owner)
}

// loopObserver is the metrics, and Config.Observer after them. With
// Parts > 1 the drivers of several parts call it at once, so their calls
// are serialised (an Observer is called one call at a time).
func (c *Coordinator) loopObserver() rebalancer.Observer {
	var o rebalancer.Observer = c.observer
	if c.cfg.Observer != nil {
		o = observers{c.observer, c.cfg.Observer}
	}
	if c.parts > 1 {
		o = lockedObserver{&c.observerMu, o}
	}
	return o
}

// lockedObserver calls o under mu.
type lockedObserver struct {
	mu *sync.Mutex
	o  rebalancer.Observer
}

func (l lockedObserver) Collected(i rebalancer.CollectInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.o.Collected(i)
}

func (l lockedObserver) Decided(i rebalancer.DecideInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.o.Decided(i)
}

func (l lockedObserver) Received(i rebalancer.ReceiveInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.o.Received(i)
}

func (l lockedObserver) Transferred(i rebalancer.TransferInfo) {
	if t, ok := l.o.(rebalancer.TransferObserver); ok {
		l.mu.Lock()
		defer l.mu.Unlock()
		t.Transferred(i)
	}
}

// observers calls each observer in turn.
type observers []rebalancer.Observer

func (o observers) Collected(i rebalancer.CollectInfo) {
	for _, x := range o {
		x.Collected(i)
	}
}

func (o observers) Decided(i rebalancer.DecideInfo) {
	for _, x := range o {
		x.Decided(i)
	}
}

func (o observers) Received(i rebalancer.ReceiveInfo) {
	for _, x := range o {
		x.Received(i)
	}
}

func (o observers) Transferred(i rebalancer.TransferInfo) {
	for _, x := range o {
		if t, ok := x.(rebalancer.TransferObserver); ok {
			t.Transferred(i)
		}
	}
}

// policyChanged is the follower's callback: the catalog changed.
func (c *Coordinator) policyChanged() {
	c.policies.refresh()
	c.mat.Notify()
}

// Addr returns the HTTP listener's address (useful with Listen ":0").
func (c *Coordinator) Addr() string { return c.listener.Addr().String() }

// GossipAddr returns the gossip address other replicas join (host:port),
// or "" without Gossip.
func (c *Coordinator) GossipAddr() string {
	if c.member == nil {
		return ""
	}
	return c.member.Addr()
}

// Leading reports whether this replica runs the epoch loop now (with
// Parts > 1: the epoch loop of at least one part; see Parts).
func (c *Coordinator) Leading() bool { return c.leading.Load() }

// Registry returns the coordinator's metric registry.
func (c *Coordinator) Registry() *prometheus.Registry { return c.registry }

// Status returns the epoch loop's status: the current (or last) term's;
// the zero Status before this replica first led.
// With Parts > 1 it is always the zero Status: see Parts.
func (c *Coordinator) Status() rebalancer.Status {
	if d := c.driver.Load(); d != nil {
		return d.Status()
	}
	return rebalancer.Status{}
}

// Run serves HTTP, follows the policy log and, while this replica leads,
// runs the epoch loop and the daily-quota replication, until ctx ends or
// the HTTP server fails. Then it shuts down: it stops the epoch loop (a
// write in progress finishes or times out), leaves the gossip cluster
// (announced, so another replica takes over at once), lets in-flight
// admin writes finish and stops the HTTP server within ShutdownTimeout,
// flushes and closes the Kafka writers and the clients. It returns nil
// after a cancellation, or the failure. A consumer or follower failure is
// logged and retried after a second (the consumer re-reads the lookback
// window: reports are deduplicated; the follower replays the log: records
// are idempotent). Run may be called once; it closes the clients even when
// it fails.
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
	wg.Go(func() {
		if err := c.server.Serve(c.listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			serveErr <- fmt.Errorf("region: http server: %w", err)
		}
	})
	// The leader loop and the policy log stop first, the HTTP server (and
	// admin writes in flight) last.
	lctx, lcancel := context.WithCancel(ctx)
	var lwg sync.WaitGroup
	lwg.Go(func() { c.publishRegionSet(lctx) })
	if c.cfg.PolicyLog {
		lwg.Go(func() { c.retry(lctx, "policy log follower", c.followPolicies) })
		lwg.Go(func() { _ = c.mat.Run(lctx) })
		lwg.Go(func() { c.keepPolicyLogWarm(lctx) })
	}
	lwg.Go(func() {
		if c.parts > 1 {
			c.runParts(lctx)
			return
		}
		if c.member == nil {
			c.retry(lctx, "epoch loop", c.lead)
			return
		}
		_ = c.member.RunWhileLeader(lctx, 100*time.Millisecond, c.lead, func(err error) {
			c.log.Warn("region: leader term ended", "err", err)
		})
	})
	c.log.Info("region: coordinator running", "region", c.cfg.Region, "name", c.name, "regions", c.cfg.Regions, "epoch", c.cfg.Epoch,
		"listen", c.Addr(), "gossip", c.GossipAddr(), "policy_log", c.cfg.PolicyLog, "admin_api", c.cfg.AdminTokens != nil)

	var err error
	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	lcancel()
	lwg.Wait()
	if c.member != nil {
		var lerr error
		if c.cfg.LeaveTimeout > 0 {
			lerr = c.member.Leave(c.cfg.LeaveTimeout)
		} else {
			lerr = c.member.Shutdown()
		}
		if lerr != nil {
			c.log.Warn("region: leave the gossip cluster", "err", lerr)
		}
	}
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), c.cfg.ShutdownTimeout)
	if serr := c.server.Shutdown(sctx); serr != nil && err == nil {
		err = fmt.Errorf("region: http shutdown: %w", serr)
	}
	scancel()
	wg.Wait()
	c.log.Info("region: coordinator stopped", "region", c.cfg.Region, "name", c.name)
	return err
}

// retry calls fn until ctx ends, a second after each failure.
func (c *Coordinator) retry(ctx context.Context, what string, fn func(context.Context) error) {
	for ctx.Err() == nil {
		if err := fn(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("region: "+what+" stopped; restarting in 1s", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// followPolicies makes sure the policy topic exists and replays it.
func (c *Coordinator) followPolicies(ctx context.Context) error {
	if err := c.kafka.EnsureTopics(ctx, kafkautil.CompactedTopic(c.cfg.PolicyTopic, 1, -1)); err != nil {
		return err
	}
	return c.follower.Run(ctx)
}

// lead runs one leader term: a new epoch loop (resuming after the region's
// last claimed epoch) and the daily-quota replication, until ctx ends (the
// term is over) or the loop is fenced out (another replica claimed an
// epoch: rebalancer.ErrFenced) or cannot read the fence.
func (c *Coordinator) lead(ctx context.Context) error {
	d, adapter, tadapter, err := c.newDriver(0)
	if err != nil {
		return err
	}
	c.driver.Store(d)
	c.leading.Store(true)
	defer c.leading.Store(false)
	c.log.Info("region: leading the region's epoch loop", "name", c.name)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { c.retry(ctx, "kafka consumer", adapter.Run) })
	if tadapter != nil {
		wg.Go(func() { c.retry(ctx, "transfer consumer", tadapter.Run) })
	}
	wg.Go(func() {
		c.retry(ctx, "daily-quota replication", func(ctx context.Context) error { return c.dq.run(ctx, c.policies) })
	})
	err = d.Run(ctx)
	cancel()
	wg.Wait()
	if ctx.Err() != nil && !errors.Is(err, rebalancer.ErrFenced) {
		return nil
	}
	return err
}

// ownershipRecheck is how often a replica with Parts > 1 recomputes the
// parts it owns from the membership.
const ownershipRecheck = 100 * time.Millisecond

// runParts runs, with Parts > 1, the epoch loop of each part this replica
// owns (StaticParts without Gossip; with Gossip, the parts membership.OwnerOf
// gives it over the live members, rechecked every ownershipRecheck) and the
// daily-quota replication (on the leader with Gossip; without, on the
// replica that runs part 0), until ctx ends. A part that moves away is
// stopped (its write in progress finishes or times out) before the next
// recheck; one that moves here starts through its fence: it resumes after
// the part's last claimed epoch and adopts the part's share records
// (rebalancer.DriverConfig.Fence and Records), as a new leader does.
func (c *Coordinator) runParts(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	dq := func(ctx context.Context) error { return c.dq.run(ctx, c.policies) }
	owned := func() []int { return c.cfg.StaticParts }
	switch {
	case c.member != nil:
		wg.Go(func() {
			_ = c.member.RunWhileLeader(ctx, ownershipRecheck, dq, func(err error) {
				c.log.Warn("region: daily-quota replication stopped", "err", err)
			})
		})
		owned = func() []int { return membership.OwnedParts(c.member.Alive(), c.name, c.parts) }
	case c.cfg.StaticParts == nil:
		all := make([]int, c.parts)
		for p := range all {
			all[p] = p
		}
		owned = func() []int { return all }
		fallthrough
	case slices.Contains(c.cfg.StaticParts, 0):
		wg.Go(func() { c.retry(ctx, "daily-quota replication", dq) })
	}
	type running struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	runs := map[int]running{}
	stop := func(p int) {
		r := runs[p]
		r.cancel()
		<-r.done
		delete(runs, p)
	}
	defer func() {
		for p := range runs {
			stop(p)
		}
	}()
	t := time.NewTicker(ownershipRecheck)
	defer t.Stop()
	for {
		want := owned()
		for p := range runs {
			if !slices.Contains(want, p) {
				c.log.Info("region: part moved to another replica; stopping its epoch loop", "part", p, "parts", c.parts)
				stop(p)
			}
		}
		for _, p := range want {
			if _, ok := runs[p]; ok {
				continue
			}
			pctx, cancel := context.WithCancel(ctx)
			r := running{cancel: cancel, done: make(chan struct{})}
			runs[p] = r
			go func() {
				defer close(r.done)
				c.retry(pctx, "epoch loop of part "+strconv.Itoa(p), func(ctx context.Context) error { return c.runPart(ctx, p) })
			}()
		}
		c.leading.Store(len(runs) > 0)
		select {
		case <-ctx.Done():
			c.leading.Store(false)
			return
		case <-t.C:
		}
	}
}

// runPart runs one term of part p's epoch loop, until ctx ends (the part
// moved away) or the loop is fenced out (another replica claimed an epoch
// of the part: rebalancer.ErrFenced, retried by the caller while this
// replica still owns the part) or cannot read the fence.
func (c *Coordinator) runPart(ctx context.Context, p int) error {
	d, adapter, tadapter, err := c.newDriver(p)
	if err != nil {
		return err
	}
	c.partsMu.Lock()
	c.partDrivers[p] = d
	c.partsMu.Unlock()
	defer func() {
		c.partsMu.Lock()
		if c.partDrivers[p] == d {
			delete(c.partDrivers, p)
		}
		c.partsMu.Unlock()
	}()
	c.log.Info("region: running the epoch loop of a part", "name", c.name, "part", p, "parts", c.parts)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { c.retry(ctx, "kafka consumer of part "+strconv.Itoa(p), adapter.Run) })
	if tadapter != nil {
		wg.Go(func() { c.retry(ctx, "transfer consumer of part "+strconv.Itoa(p), tadapter.Run) })
	}
	err = d.Run(ctx)
	cancel()
	wg.Wait()
	if ctx.Err() != nil && !errors.Is(err, rebalancer.ErrFenced) {
		return nil
	}
	return err
}

// Parts returns the status of the epoch loop of each key part this
// replica runs now (Config.Parts > 1), by part; nil with one part (see
// Status).
func (c *Coordinator) Parts() map[int]rebalancer.Status {
	if c.parts == 1 {
		return nil
	}
	c.partsMu.Lock()
	defer c.partsMu.Unlock()
	out := make(map[int]rebalancer.Status, len(c.partDrivers))
	for p, d := range c.partDrivers {
		out[p] = d.Status()
	}
	return out
}

// close releases the clients built by New.
func (c *Coordinator) close() {
	if c.member != nil {
		_ = c.member.Shutdown()
	}
	if c.plog != nil {
		if err := c.plog.Close(); err != nil {
			c.log.Warn("region: close policy log", "err", err)
		}
	}
	if c.bus != nil {
		if err := c.bus.Close(); err != nil {
			c.log.Warn("region: close kafka bus", "err", err)
		}
	}
	if c.transfer != nil {
		if err := c.transfer.Close(); err != nil {
			c.log.Warn("region: close transfer bus", "err", err)
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
	Name        string    `json:"name"`
	Role        string    `json:"role"` // "leader" or "follower"
	Leader      string    `json:"leader,omitempty"`
	LastEpoch   int64     `json:"last_epoch"`
	LastCollect time.Time `json:"last_collect,omitzero"`
	LastMode    string    `json:"last_mode,omitempty"`
	Unwritten   int       `json:"unwritten_updates"`
	// Transfers between decisions (absent when off or while following).
	Transfers *transferHealth `json:"transfers,omitempty"`
	// With Config.Parts > 1: the part count and the parts this replica
	// runs (role "parts" when it runs any, "follower" otherwise).
	KeyParts  int          `json:"parts,omitempty"`
	PartsHere []partHealth `json:"parts_here,omitempty"`
}

// partHealth is one part's line in /healthz.
type partHealth struct {
	Part        int       `json:"part"`
	LastEpoch   int64     `json:"last_epoch"`
	LastCollect time.Time `json:"last_collect,omitzero"`
	Unwritten   int       `json:"unwritten_updates"`
	Reason      string    `json:"reason,omitempty"`
}

// loopReason is why an epoch loop in status st is unhealthy at now, or "".
func (c *Coordinator) loopReason(st rebalancer.Status, now time.Time) string {
	stale := 2*c.cfg.Epoch + c.cfg.Epoch/2
	switch {
	case !st.Running:
		return "epoch loop not running"
	case st.LastCollect.IsZero() && now.Sub(st.Started) > stale:
		return "no epoch collected since start"
	case !st.LastCollect.IsZero() && now.Sub(st.LastCollect) > stale:
		return fmt.Sprintf("last collection %v ago", now.Sub(st.LastCollect).Round(time.Millisecond))
	case st.LastWriteError != nil:
		return "share writes failing: " + st.LastWriteError.Error()
	}
	return ""
}

// transferHealth is the transfer part of /healthz: what this leader's
// term asked and gave (counts since the term started).
type transferHealth struct {
	LastPressure  time.Time `json:"last_pressure,omitzero"`
	PressureKeys  int       `json:"pressure_keys"`
	AsksSent      int64     `json:"asks_sent"`
	AsksReceived  int64     `json:"asks_received"`
	GivesSent     int64     `json:"gives_sent"`
	GivesDropped  int64     `json:"gives_dropped"`
	GivesAccepted int64     `json:"gives_accepted"`
	GivesRefused  int64     `json:"gives_refused"`
	Wakes         int64     `json:"pressure_wakes"` // pressure reads the gateways' wake token brought forward
	LastError     string    `json:"last_error,omitempty"`
}

// healthz answers 200 when this replica follows (another leads), or leads
// and its epoch loop runs, has collected within the last two epochs (or
// started less than two epochs ago) and its share writes succeed; 503
// otherwise, with the reason.
// With Parts > 1 the same checks apply to the epoch loop of each part this
// replica runs (role "parts"; "follower" when it runs none).
func (c *Coordinator) healthz(w http.ResponseWriter, _ *http.Request) {
	now := c.cfg.Clock.Now()
	h := health{Status: "ok", Region: c.cfg.Region, Name: c.name, Role: "follower"}
	if c.member != nil {
		h.Leader = c.member.Leader()
	}
	if c.parts > 1 {
		h.KeyParts = c.parts
		ps := c.Parts()
		for _, p := range slices.Sorted(maps.Keys(ps)) {
			st := ps[p]
			ph := partHealth{Part: p, LastEpoch: st.LastEpoch, LastCollect: st.LastCollect, Unwritten: st.Unwritten, Reason: c.loopReason(st, now)}
			if ph.Reason != "" && h.Reason == "" {
				h.Reason = fmt.Sprintf("part %d: %s", p, ph.Reason)
			}
			h.PartsHere = append(h.PartsHere, ph)
		}
		if len(ps) > 0 {
			h.Role = "parts"
		}
	} else if c.Leading() || c.member == nil {
		h.Role = "leader"
		st := c.Status()
		h.LastEpoch, h.LastCollect, h.Unwritten = st.LastEpoch, st.LastCollect, st.Unwritten
		if t := st.Transfers; t.Enabled {
			h.Transfers = &transferHealth{LastPressure: t.LastPressure, PressureKeys: t.PressureKeys, AsksSent: t.AsksSent, AsksReceived: t.AsksReceived,
				GivesSent: t.GivesSent, GivesDropped: t.GivesDropped, GivesAccepted: t.GivesAccepted, GivesRefused: t.GivesRefused, Wakes: t.Wakes}
			if t.LastError != nil {
				h.Transfers.LastError = t.LastError.Error()
			}
		}
		if !st.LastDecision.IsZero() {
			h.LastMode = st.LastMode.String()
		}
		h.Reason = c.loopReason(st, now)
	}
	code := http.StatusOK
	if h.Reason != "" {
		h.Status, code = "unhealthy", http.StatusServiceUnavailable
	}
	writeJSON(w, code, h)
}

// readiness is the /readyz body.
type readiness struct {
	Status   string   `json:"status"` // "ready" or "not ready"
	Problems []string `json:"problems,omitempty"`
	// PolicySource is "log" (the policy log holds records), "file" (the
	// bootstrap policies) or "log (empty): file".
	PolicySource string `json:"policy_source"`
	Generation   int64  `json:"policy_generation,omitempty"`
}

// readyTimeout bounds each probe of /readyz.
const readyTimeout = 2 * time.Second

// readyz answers 200 when this region's Redis answers PING, a Kafka broker
// answers a metadata request, and the policies are loaded (with the policy
// log: replayed up to the end it had at start); 503 with every problem
// otherwise.
func (c *Coordinator) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	var rd readiness
	if err := c.redis.Ping(ctx).Err(); err != nil {
		rd.Problems = append(rd.Problems, "redis: "+err.Error())
	}
	if _, err := c.kafka.Client().Metadata(ctx, &kafka.MetadataRequest{Topics: []string{c.cfg.Topic}}); err != nil {
		rd.Problems = append(rd.Problems, "kafka: "+err.Error())
	}
	rd.PolicySource = "file"
	if c.cfg.PolicyLog {
		rd.Generation = c.catalog.Generation()
		switch {
		case !c.follower.Ready():
			rd.Problems = append(rd.Problems, "policies: the policy log is not replayed yet")
		case c.policies.fromLog():
			rd.PolicySource = "log"
		default:
			rd.PolicySource = "log (empty): file"
		}
	}
	code := http.StatusOK
	rd.Status = "ready"
	if len(rd.Problems) > 0 {
		rd.Status, code = "not ready", http.StatusServiceUnavailable
	}
	writeJSON(w, code, rd)
}

// requireClientCert answers 403 (an RFC 9457 problem) to a request whose
// connection presented no verified client certificate, and passes the
// others to h.
func requireClientCert(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !tlsconfig.HasVerifiedClientCert(r.TLS) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(map[string]any{
				"type": "about:blank", "title": "Forbidden", "status": http.StatusForbidden,
				"detail": "the admin API requires a client certificate signed by the listener's client CA",
			})
			return
		}
		h.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// policyLogWarmEvery is how often keepPolicyLogWarm prepares the policy
// log's producer: below kafka-go's 30 s idle close, as kafkabus's
// WarmInterval.
const policyLogWarmEvery = 10 * time.Second

// keepPolicyLogWarm prepares the policy log's producer (topic, metadata,
// leader connection) at start and every policyLogWarmEvery until ctx
// ends, so that an admin write costs one produce round trip to the broker
// inside its deadline instead of four (policysync.KafkaLog.Prepare). A
// failure is logged at debug level and changes nothing: Append prepares
// what it lacks itself.
func (c *Coordinator) keepPolicyLogWarm(ctx context.Context) {
	for {
		pctx, cancel := context.WithTimeout(ctx, policyLogWarmEvery)
		if err := c.plog.Prepare(pctx); err != nil && ctx.Err() == nil {
			c.log.Debug("region: prepare the policy log's producer", "err", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-time.After(policyLogWarmEvery):
		}
	}
}
