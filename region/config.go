package region

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/segmentio/kafka-go/sasl"

	"github.com/quotientlabs/quotient/dailyquota/kafkarepl"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
	"github.com/quotientlabs/quotient/region/admin"
	"github.com/quotientlabs/quotient/region/membership"
	"github.com/quotientlabs/quotient/region/policysync"
	"github.com/quotientlabs/quotient/shares"
)

// ErrConfig is wrapped by every configuration error; the message names the
// field.
var ErrConfig = errors.New("region: invalid config")

// Config configures a Coordinator. Start from DefaultConfig and set
// Region, Regions, RedisAddrs, KafkaBrokers and Policies.
type Config struct {
	// Region is this region's name; it must be one of Regions.
	Region string
	// Regions are every region's names, this one included; the same list
	// in every region.
	Regions []string
	// Epoch is the rebalance interval, the same in every region. Default
	// 10 s.
	Epoch time.Duration
	// MaxWait is how long after an epoch ends the coordinator waits for
	// the other regions' reports. Default: the smaller of 2 s and Epoch/2.
	MaxWait time.Duration
	// CollectDelay is how long after an epoch ends its usage is collected
	// (the gateways flush every second). Default: the smaller of 1 s and
	// MaxWait/2.
	CollectDelay time.Duration
	// RedisAddrs are this region's Redis addresses (host:port). Several
	// addresses, or RedisCluster, mean a Redis Cluster.
	RedisAddrs []string
	// RedisCluster: RedisAddrs[0] is a cluster configuration endpoint
	// (e.g. ElastiCache cluster mode), not a standalone server.
	RedisCluster bool
	// RedisTLS, when non-nil, encrypts every Redis connection (build it
	// with internal/tlsconfig). Default nil: plaintext.
	RedisTLS *tls.Config
	// RedisUsername is the ACL user (empty: the default user) and
	// RedisPassword its password or the AUTH token (empty: no AUTH).
	RedisUsername, RedisPassword string
	// UsageShards is the gateways' usage shard count (the packed layout,
	// limiter.NewRedisUsageSink). Default limiter.DefaultUsageShards.
	UsageShards int
	// UsageSplitShards, when > 0, is the shard count of the previous
	// release's split usage layout, which the coordinator also reads (and
	// states in its record for that release's gateways) during a rolling
	// upgrade (limiter.UsageLayout). 0: not read.
	UsageSplitShards int
	// KafkaBrokers are the Kafka bootstrap brokers (host:port).
	KafkaBrokers []string
	// KafkaTLS, when non-nil, encrypts every Kafka connection; KafkaSASL,
	// when non-nil, authenticates it (kafkautil.NewSASL). Default nil:
	// plaintext, unauthenticated.
	KafkaTLS  *tls.Config
	KafkaSASL sasl.Mechanism
	// Topic is the usage-report topic. Default kafkabus.DefaultTopic.
	Topic string
	// TransferTopic is the topic of asks and gives between decisions
	// (issue 17; the mirrored layout also consumes
	// "<region>.<TransferTopic>" per other region). Default
	// kafkabus.TransferTopic(Topic): "<Topic>-transfers".
	TransferTopic string
	// NoTransfers turns transfers between decisions off: shares move at
	// epoch decisions only, and the transfer topic is neither created nor
	// read. Default false (transfers on).
	NoTransfers bool
	// PressureInterval is how often the coordinator reads the gateways'
	// pressure marks and asks for the keys that need share. Default
	// rebalancer.DefaultPressureInterval (1 s, the gateways' default
	// usage flush). It is also the shortest time between two asks for one
	// key (rebalancer.Config.AskInterval, at most Epoch).
	PressureInterval time.Duration
	// Mirrored selects the one-cluster-per-region layout (MirrorMaker 2):
	// publish to Topic on this region's cluster, consume Topic and
	// "<region>.<Topic>" for every other region. Default false: one shared
	// cluster and topic.
	Mirrored bool
	// Listen is the HTTP server's address (/metrics, /healthz, /readyz,
	// and the admin API with AdminTokens). Default
	// ":9090".
	Listen string
	// ListenTLS, when non-nil, makes the HTTP server serve TLS only with
	// it (build it with tlsconfig.NewReloader, so certificates rotate
	// without a restart); a plaintext request to the port gets no answer.
	// Default nil: plaintext HTTP.
	ListenTLS *tls.Config
	// AdminClientCert makes the admin API (/v1/) require a client
	// certificate that verified against ListenTLS's client CAs, on top of
	// the bearer token; /metrics, /healthz and /readyz do not, so load
	// balancers and scrapers need none. It needs ListenTLS. Default false.
	AdminClientCert bool
	// AdminInsecure lets the admin API serve plaintext HTTP on an address
	// other than loopback. Without it, AdminTokens with a non-loopback
	// Listen (":9090" is every interface) and no ListenTLS is a
	// configuration error: the bearer tokens would cross the network in
	// the clear. Default false.
	AdminInsecure bool
	// Policies are the policy documents; the global bucket policies among
	// them (scope global, token_bucket or leaky_bucket) are shared, and the
	// global fixed windows are replicated (daily quotas, package
	// dailyquota). Others are ignored. Without PolicyLog at least one
	// global policy is required; with it, Policies may be empty and are
	// replaced by the log's as soon as it holds any record.
	Policies []*limiter.Policy
	// DailyQuotaTopic is the topic of replicated fixed-window counts
	// (mirrored layout: also "<region>.<DailyQuotaTopic>" per other
	// region, with Mirrored). Default kafkarepl.DefaultTopic.
	DailyQuotaTopic string
	// PolicyLog makes the coordinator follow the policy topic (PolicyTopic,
	// the admin API's durable log, package policysync): it replays the
	// topic at start into a catalog, materialises the policies in force
	// into this region's Redis for the gateways, and takes its global
	// policies from the log as soon as the log holds any record; until
	// then Policies (the --policies file) is the bootstrap set. Default
	// false: Policies only.
	PolicyLog bool
	// PolicyTopic is the policy topic. Default policysync.Topic.
	PolicyTopic string
	// AdminTokens, when set, serves the admin API (package admin) under
	// /v1/ on Listen, beside /metrics, /healthz and /readyz. It requires
	// PolicyLog (every write is a record on the log). Default nil: no
	// admin API.
	AdminTokens *admin.Tokens
	// Gossip, when set, makes this coordinator one of several replicas of
	// the region (package membership): the epoch loop and the daily-quota
	// replication run only while it leads, and every epoch is claimed in
	// the region's Redis before it is collected (membership.Fence), so
	// each epoch's report is published once and a new leader resumes
	// after the last. Gossip.Name must be unique in the region. Default
	// nil: a single replica, which always leads (it claims epochs too, so
	// a restart resumes where it stopped).
	Gossip *membership.Config
	// Parts splits the key space into Parts parts (issue 15), a
	// fleet-wide constant (every region and replica the same): a key's
	// part is limiter.UsagePart of it, and each part is an independent
	// instance of the protocol, with its own Core, epoch fence
	// (membership.NewPartFence) and reports (marked with their part on
	// the wire; a report of another Parts is refused and counted). With
	// Gossip, each live replica runs the parts for which it has the
	// highest rendezvous hash (membership.OwnerOf) and the daily-quota
	// replication runs on the leader; without it, this replica runs
	// StaticParts. UsageShards must be a multiple of Parts, and Parts > 1
	// needs UsageSplitShards 0 (see the package doc). The usage topic, when
	// the coordinator creates it, gets max(3, Parts) partitions, and each
	// part's consumer reads only its part's partition
	// (kafkabus.PartitionOf); an existing topic keeps its partitions
	// (fewer than Parts: parts share partitions, still correct). Default 1:
	// one part, the whole key space, exactly the protocol and wire format
	// without parts.
	Parts int
	// StaticParts, with Parts > 1 and without Gossip, are the parts this
	// replica runs (each in [0, Parts), once); the operator runs every
	// part on exactly one replica. It runs the daily-quota replication
	// when it runs part 0. Default nil: every part. Not allowed with
	// Gossip (ownership follows the membership).
	StaticParts []int
	// LeaveTimeout bounds the announcement that this replica leaves the
	// gossip cluster at shutdown, so another takes over at once. Default
	// 2 s; negative: stop gossip without a goodbye, as a crash would (for
	// tests of failure detection).
	LeaveTimeout time.Duration
	// ShutdownTimeout bounds the HTTP server's graceful shutdown (in-flight
	// admin writes finish within it). Default 5 s.
	ShutdownTimeout time.Duration
	// Logger receives the coordinator's log lines. Default: discard.
	Logger *slog.Logger
	// Clock is the coordinator's time source for everything the protocol
	// reads the time for: the epoch loop (epoch numbers, its deadlines and
	// the fence's claims), the reports' sent_unix_ms and the Kafka record
	// timestamps, the consumers' lookback start, the daily-quota
	// replication (windows, record timestamps, active keys), admin writes'
	// stamps and override expiry, and /healthz. One clock for all, so a
	// skewed coordinator (cmd/quotient --clock-offset, for tests) is skewed
	// everywhere at once. Timers wait real durations. Must be safe for
	// concurrent use. Default: the system clock.
	Clock rebalancer.Clock
	// Observer, when set, also receives what the epoch loop does, in every
	// term this replica leads (after the coordinator's metrics; same
	// rules: called from the loop's goroutine, must not block). Default:
	// none.
	Observer rebalancer.Observer
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Epoch: 10 * time.Second, Topic: kafkabus.DefaultTopic, DailyQuotaTopic: kafkarepl.DefaultTopic,
		PolicyTopic: policysync.Topic, Listen: ":9090", LeaveTimeout: 2 * time.Second, ShutdownTimeout: 5 * time.Second,
	}
}

// validate fills defaults and checks the fields.
func (c *Config) validate() error {
	d := DefaultConfig()
	if c.Epoch == 0 {
		c.Epoch = d.Epoch
	}
	if c.Topic == "" {
		c.Topic = d.Topic
	}
	if c.TransferTopic == "" {
		c.TransferTopic = kafkabus.TransferTopic(c.Topic)
	}
	if c.PressureInterval == 0 {
		c.PressureInterval = rebalancer.DefaultPressureInterval
	}
	if c.DailyQuotaTopic == "" {
		c.DailyQuotaTopic = d.DailyQuotaTopic
	}
	if c.Listen == "" {
		c.Listen = d.Listen
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = d.ShutdownTimeout
	}
	if c.PolicyTopic == "" {
		c.PolicyTopic = d.PolicyTopic
	}
	if c.LeaveTimeout == 0 {
		c.LeaveTimeout = d.LeaveTimeout
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	switch {
	case len(c.RedisAddrs) == 0:
		return fmt.Errorf("%w: RedisAddrs is empty", ErrConfig)
	case c.RedisCluster && len(c.RedisAddrs) != 1:
		return fmt.Errorf("%w: RedisCluster wants one configuration endpoint in RedisAddrs, got %d", ErrConfig, len(c.RedisAddrs))
	case len(c.KafkaBrokers) == 0:
		return fmt.Errorf("%w: KafkaBrokers is empty", ErrConfig)
	case c.ShutdownTimeout < 0:
		return fmt.Errorf("%w: ShutdownTimeout %v is negative", ErrConfig, c.ShutdownTimeout)
	case c.PressureInterval < 0:
		return fmt.Errorf("%w: PressureInterval %v is negative", ErrConfig, c.PressureInterval)
	case c.TransferTopic == c.Topic || c.TransferTopic == c.DailyQuotaTopic || c.TransferTopic == c.PolicyTopic:
		return fmt.Errorf("%w: TransferTopic %q is another bus's topic: give asks and gives their own", ErrConfig, c.TransferTopic)
	case c.UsageShards < 0:
		return fmt.Errorf("%w: UsageShards %d is negative", ErrConfig, c.UsageShards)
	case c.UsageSplitShards < 0:
		return fmt.Errorf("%w: UsageSplitShards %d is negative", ErrConfig, c.UsageSplitShards)
	case c.AdminTokens != nil && !c.PolicyLog:
		return fmt.Errorf("%w: AdminTokens needs PolicyLog: admin writes are records on the policy log", ErrConfig)
	case c.AdminClientCert && c.ListenTLS == nil:
		return fmt.Errorf("%w: AdminClientCert needs ListenTLS: client certificates come with TLS", ErrConfig)
	case c.AdminTokens != nil && c.ListenTLS == nil && !c.AdminInsecure && !isLoopback(c.Listen):
		return fmt.Errorf("%w: Listen %q is not a loopback address and ListenTLS is not set: the admin API would carry its bearer tokens in the clear (set ListenTLS, listen on loopback, or set AdminInsecure)", ErrConfig, c.Listen)
	case c.Gossip != nil && c.Gossip.Name == "":
		return fmt.Errorf("%w: Gossip.Name is empty: each replica needs a unique name", ErrConfig)
	}
	return c.validateParts()
}

// validateParts fills Parts' default and checks Parts and StaticParts.
func (c *Config) validateParts() error {
	if c.Parts == 0 {
		c.Parts = 1
	}
	shards := c.UsageShards
	if shards == 0 {
		shards = limiter.DefaultUsageShards
	}
	switch {
	case c.Parts < 0 || c.Parts > maxParts:
		return fmt.Errorf("%w: Parts %d not in [1, %d]", ErrConfig, c.Parts, maxParts)
	case shards%c.Parts != 0:
		return fmt.Errorf("%w: Parts %d does not divide UsageShards %d: a part is a set of usage shards (shard mod Parts), so the shard count must be a multiple of the part count", ErrConfig, c.Parts, shards)
	case c.Parts > 1 && c.UsageSplitShards > 0:
		return fmt.Errorf("%w: Parts %d with UsageSplitShards %d: the split usage layout hashes keys apart from the parts; finish the rolling upgrade first (--usage-split-shards 0)", ErrConfig, c.Parts, c.UsageSplitShards)
	case c.StaticParts != nil && c.Gossip != nil:
		return fmt.Errorf("%w: StaticParts with Gossip: with gossip, parts follow the membership", ErrConfig)
	case c.StaticParts != nil && c.Parts == 1:
		return fmt.Errorf("%w: StaticParts without Parts > 1", ErrConfig)
	}
	seen := map[int]bool{}
	for _, p := range c.StaticParts {
		if p < 0 || p >= c.Parts || seen[p] {
			return fmt.Errorf("%w: StaticParts %v: each part in [0, %d), once", ErrConfig, c.StaticParts, c.Parts)
		}
		seen[p] = true
	}
	return nil
}

// maxParts bounds Config.Parts (kafkabus's bound on key_parts).
const maxParts = 4096

// isLoopback reports whether the listen address hostport binds loopback
// only: 127.0.0.0/8, ::1 or "localhost". An empty host (every interface)
// or a name that is not localhost is not loopback.
func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// GlobalLimits returns the shared limits of the global bucket policies
// among policies, for n regions (with the cost of each policy's cheapest
// request, so every share admits one), and how many global policies were skipped
// because the limiter enforces no share for their algorithm (global fixed
// windows, which are replicated instead: see newDailyQuota).
func GlobalLimits(policies []*limiter.Policy, n int) (rebalancer.PolicyMap, int) {
	out := rebalancer.PolicyMap{}
	skipped := 0
	for _, p := range policies {
		if p == nil || p.Scope != limiter.ScopeGlobal {
			continue
		}
		if p.Algorithm != limiter.TokenBucket && p.Algorithm != limiter.LeakyBucket {
			skipped++
			continue
		}
		out[p.ID] = shares.Limit{RateMilli: p.RateMilli(), BurstMilli: p.BurstMilli(), Regions: n, MinCostMilli: p.MinCost() * 1000}
	}
	return out, skipped
}

// checkLimits refuses a global policy whose burst cannot give every region
// one request (shares.Limit.Validate), naming the policy.
func checkLimits(limits rebalancer.PolicyMap) error {
	ids := make([]string, 0, len(limits))
	for id := range limits {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if err := limits[id].Validate(); err != nil {
			return fmt.Errorf("%w: Policies: global policy %q: %w", ErrConfig, id, err)
		}
	}
	return nil
}

// systemClock is the default Config.Clock.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}
