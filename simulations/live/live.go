package live

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
	"github.com/quotientlabs/quotient/region"
	"github.com/quotientlabs/quotient/simulations"
)

// Errors callers branch on.
var (
	// ErrConfig wraps every configuration error; the message names the
	// field.
	ErrConfig = errors.New("live: invalid config")
	// ErrRun wraps failures of the run itself: a Redis or Kafka that
	// cannot be reached, a coordinator that stops, a cancelled context.
	ErrRun = errors.New("live: run failed")
)

// Config configures a live run. Start from DefaultConfig and set
// KafkaBrokers and RedisAddrs.
type Config struct {
	// TimeScale is how many scenario seconds pass in one real second.
	// Every duration (the run, epochs, evaluation windows, the gateways'
	// flush interval, the coordinators' waits) is divided by it and every
	// policy rate (rate_per_sec) multiplied by it, while bursts stay: each
	// epoch and window sees the same requests and tokens as the scenario.
	// epoch_s x 1000 / TimeScale must be a whole number of milliseconds.
	// Default 20 (a 10 s epoch lasts 500 ms; 600 s run in 30 s).
	TimeScale int
	// KafkaBrokers are the broker addresses (host:port). Required.
	KafkaBrokers []string
	// RedisAddrs maps every region of the scenario to its own standalone
	// Redis (host:port). Required. The run writes under fresh subject
	// names (see RunID) and deletes nothing, but one run at a time per
	// server: coordinators collect whatever usage the server holds.
	RedisAddrs map[string]string
	// RunID names the run: subjects are "<RunID>/<key>" and the default
	// topic is "quotient.usage.<RunID>", so runs never see each other's
	// state. Default "live-" and the start time in base 36.
	RunID string
	// Topic is the usage-report topic. Default "quotient.usage.<RunID>".
	// The run creates it before the coordinators start.
	Topic string
	// HeadStartEpochs is how many epochs before t=0 the coordinators
	// start (they stay silent for their warm-up epochs). Default
	// simulations.HeadStartEpochs, as in virtual time.
	HeadStartEpochs int
	// FlushInterval is the gateways' usage flush interval, real time.
	// Default 1 s / TimeScale (the production 1 s, scaled), at least 10 ms.
	FlushInterval time.Duration
	// MaxWait is how long after an epoch ends a coordinator waits for the
	// other regions' reports, real time. Default: half a scaled epoch
	// (the region package's default), which leaves the loopback broker
	// room.
	MaxWait time.Duration
	// CollectDelay is how long after an epoch ends a coordinator collects
	// its usage, real time. Default FlushInterval (production: 1 s and
	// 1 s), at most MaxWait/2.
	CollectDelay time.Duration
	// Workers is the number of concurrent gateway callers per region.
	// Default 8.
	Workers int
	// StoreDeadline is the gateways' limiter Deadline. Default 250 ms:
	// far above the production 5 ms, because a loaded test machine is not
	// under test; decisions that still miss it fall back and are counted
	// in Stats.Fallback.
	StoreDeadline time.Duration
	// Logger receives the coordinators' and gateways' log lines. Default:
	// discard.
	Logger *slog.Logger
	// Progress, when set, is called after every scenario second with the
	// seconds done and the total, from the run's sampling goroutine.
	Progress func(done, total int64)
}

// DefaultConfig returns the defaults; KafkaBrokers and RedisAddrs are
// empty.
func DefaultConfig() Config {
	return Config{TimeScale: 20, HeadStartEpochs: simulations.HeadStartEpochs, Workers: 8, StoreDeadline: 250 * time.Millisecond}
}

// timing is the scaled clockwork of one run.
type timing struct {
	scale   int64
	epoch   time.Duration // real
	second  time.Duration // one scenario second, real
	flush   time.Duration
	maxWait time.Duration
	collect time.Duration
}

// validate fills defaults and checks cfg against sc; errors name the
// field.
func (c *Config) validate(sc *simulations.Scenario, now time.Time) (timing, error) {
	d := DefaultConfig()
	if c.TimeScale == 0 {
		c.TimeScale = d.TimeScale
	}
	if c.HeadStartEpochs == 0 {
		c.HeadStartEpochs = d.HeadStartEpochs
	}
	if c.Workers == 0 {
		c.Workers = d.Workers
	}
	if c.StoreDeadline == 0 {
		c.StoreDeadline = d.StoreDeadline
	}
	if c.RunID == "" {
		c.RunID = "live-" + strconv.FormatInt(now.UnixMilli(), 36)
	}
	if c.Topic == "" {
		c.Topic = kafkabus.DefaultTopic + "." + c.RunID
	}
	var t timing
	switch {
	case c.TimeScale < 1:
		return t, fmt.Errorf("%w: TimeScale %d: want at least 1", ErrConfig, c.TimeScale)
	case len(c.KafkaBrokers) == 0:
		return t, fmt.Errorf("%w: KafkaBrokers is empty", ErrConfig)
	case c.HeadStartEpochs < 0:
		return t, fmt.Errorf("%w: HeadStartEpochs %d is negative", ErrConfig, c.HeadStartEpochs)
	case c.Workers < 1:
		return t, fmt.Errorf("%w: Workers %d: want at least 1", ErrConfig, c.Workers)
	case c.StoreDeadline < 0:
		return t, fmt.Errorf("%w: StoreDeadline %v is negative", ErrConfig, c.StoreDeadline)
	case strings.ContainsAny(c.RunID, "/{}"):
		return t, fmt.Errorf("%w: RunID %q: must not contain '/', '{' or '}'", ErrConfig, c.RunID)
	}
	for _, r := range sc.Regions {
		if c.RedisAddrs[r] == "" {
			return t, fmt.Errorf("%w: RedisAddrs: no Redis for region %q", ErrConfig, r)
		}
	}
	for r := range c.RedisAddrs {
		found := false
		for _, name := range sc.Regions {
			found = found || name == r
		}
		if !found {
			return t, fmt.Errorf("%w: RedisAddrs: region %q is not in the scenario (regions %v)", ErrConfig, r, sc.Regions)
		}
	}
	t.scale = int64(c.TimeScale)
	epochNs := sc.EpochSec * int64(time.Second)
	if epochNs%(t.scale*int64(time.Millisecond)) != 0 {
		return t, fmt.Errorf("%w: TimeScale %d: epoch_s %d / %d is not a whole number of milliseconds", ErrConfig, c.TimeScale, sc.EpochSec, c.TimeScale)
	}
	t.epoch = time.Duration(epochNs / t.scale)
	t.second = time.Second / time.Duration(t.scale)
	if c.FlushInterval == 0 {
		c.FlushInterval = max(10*time.Millisecond, t.second)
	}
	if c.MaxWait == 0 {
		c.MaxWait = t.epoch / 2
	}
	if c.CollectDelay == 0 {
		c.CollectDelay = min(c.FlushInterval, c.MaxWait/2)
	}
	switch {
	case c.FlushInterval < 0:
		return t, fmt.Errorf("%w: FlushInterval %v is negative", ErrConfig, c.FlushInterval)
	case c.MaxWait < 0 || c.MaxWait > t.epoch/2:
		return t, fmt.Errorf("%w: MaxWait %v not in (0, epoch/2 = %v]", ErrConfig, c.MaxWait, t.epoch/2)
	case c.CollectDelay < 0 || c.CollectDelay >= c.MaxWait:
		return t, fmt.Errorf("%w: CollectDelay %v not in [0, MaxWait = %v)", ErrConfig, c.CollectDelay, c.MaxWait)
	}
	t.flush, t.maxWait, t.collect = c.FlushInterval, c.MaxWait, c.CollectDelay
	return t, nil
}

// Stats describes how faithfully a run kept to its schedule.
type Stats struct {
	// TimeScale is the scale the run used.
	TimeScale int
	// Start is the real time of the scenario's t=0.
	Start time.Time
	// Requests is the number of decisions made.
	Requests int64
	// Fallback counts decisions the limiter answered from its in-process
	// fallback (the store missed StoreDeadline): they did not consult the
	// shares.
	Fallback int64
	// DenyCache counts decisions answered by the gateways' deny cache.
	DenyCache int64
	// MaxLateness is the longest a request waited, real time, between its
	// scheduled arrival and the start of its decision.
	MaxLateness time.Duration
	// Late counts requests that started more than one scenario second
	// (1 s / TimeScale real) after their arrival: the machine could not
	// keep up.
	Late int64
	// Coordinators is each region's coordinator status just before the
	// run stopped it (last epoch collected, last decision and its mode,
	// unwritten updates), by region; empty when the scenario has no global
	// bucket policy (no coordinator runs).
	Coordinators map[string]rebalancer.Status
	// CoordinatorStats is what each region's coordinator did, by region.
	CoordinatorStats map[string]CoordinatorStats
}

// gateway is one limiter (the policies of one set of traffic entries) of
// one region.
type gateway struct {
	lim     *limiter.Limiter
	flusher *limiter.UsageFlusher
}

type regionRun struct {
	name     string
	client   *redis.Client
	gateways map[string]*gateway // by policy set
	coord    *region.Coordinator
	ran      bool // coord.Run was called
	queue    chan work
}

type work struct {
	due time.Time
	req simulations.Request
}

// entryInfo is what a request of one traffic entry needs.
type entryInfo struct {
	policySet string
	cost      int64
	subjects  []string // per key: "<RunID>/<key>"
	tracked   [][]int  // per key: recorder indexes, one per policy
}

type run struct {
	sc      *simulations.Scenario
	cfg     Config
	t       timing
	log     *slog.Logger
	regions []*regionRun
	entries []entryInfo
	named   []namedKey
	start   time.Time // t=0, real

	mu  sync.Mutex // guards rec
	rec *simulations.Recorder

	status map[string]rebalancer.Status // taken before the coordinators stop
	cstats map[string]CoordinatorStats

	requests, fallback, denied, late atomic.Int64
	maxLateNs                        atomic.Int64

	errMu sync.Mutex
	err   error
}

func (r *run) fail(err error) {
	r.errMu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.errMu.Unlock()
}

func (r *run) firstErr() error {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	return r.err
}

// Run runs sc in real time against the Redis servers and the Kafka broker
// of cfg, with one real coordinator (package region) per region and
// gateways calling the real limiter (RedisStore, deny cache, usage
// flushing), and returns the same Report the virtual-time engine does
// (Wall filled) with the run's Stats. It blocks for about
// (HeadStartEpochs x epoch_s + duration_s) / TimeScale seconds. A
// scenario live mode cannot run fails with a *simulations.ScenarioError
// (see Check); a bad cfg with ErrConfig; anything else with ErrRun. ctx
// cancels the run (ErrRun). Every goroutine, client and coordinator the
// run starts is stopped before it returns.
func Run(ctx context.Context, sc *simulations.Scenario, cfg Config) (*simulations.Report, Stats, error) {
	wallStart := time.Now()
	if err := Check(sc); err != nil {
		return nil, Stats{}, err
	}
	t, err := cfg.validate(sc, wallStart)
	if err != nil {
		return nil, Stats{}, err
	}
	r := &run{sc: sc, cfg: cfg, t: t, log: cfg.Logger, rec: simulations.NewRecorder(sc)}
	if r.log == nil {
		r.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	defer r.close()
	if err := r.setup(ctx); err != nil {
		return nil, Stats{}, err
	}
	if err := r.execute(ctx); err != nil {
		return nil, Stats{}, err
	}
	rep := r.rec.Report(r.start.Unix())
	rep.Wall = time.Since(wallStart)
	st := Stats{
		TimeScale: cfg.TimeScale, Start: r.start,
		Requests: r.requests.Load(), Fallback: r.fallback.Load(), DenyCache: r.denied.Load(),
		MaxLateness: time.Duration(r.maxLateNs.Load()), Late: r.late.Load(),
		Coordinators: r.status, CoordinatorStats: r.cstats,
	}
	return rep, st, nil
}
