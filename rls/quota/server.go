package quota

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rls"
)

// Bounds on reports, so that a malformed or hostile client gets a clear
// error instead of skewing demand or exhausting memory.
const (
	// MaxBucketsPerReport bounds the bucket_quota_usages of one message.
	MaxBucketsPerReport = 1000
	// MaxReportCount bounds num_requests_allowed and num_requests_denied
	// of one bucket in one message.
	MaxReportCount = 1_000_000_000
	// MaxElapsed bounds time_elapsed.
	MaxElapsed = time.Hour
)

// Clock is the time source of the server; nil means real time.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// ServerConfig configures a Server.
type ServerConfig struct {
	// Config returns the RLS configuration in force (rls.Server.Config):
	// buckets map onto its rules. Required.
	Config func() *rls.Config
	// Policy returns the Quotient policy of an id, for rules that name
	// one (rate_limit.policy; the rls.Server's policy set, which is its
	// limiter's). Nil: such rules' buckets are DENY_ALL.
	Policy func(id string) *limiter.Policy
	// Shares reads the region's share records. Required.
	Shares ShareSource
	// Usage receives every report's usage, as gateways' flushes
	// (limiter.RedisUsageSink on the region's Redis). Nil: none written.
	Usage limiter.UsageSink
	// Regions is the number of regions sharing every limit (the limiter's
	// RegionSetting): a bucket without a share record gets 1/Regions of
	// its limit. Nil means 1.
	Regions func() int
	// Replicas is the number of RLQS servers of the region when Claims is
	// nil; each then splits 1/Replicas of the region's share among the
	// Envoys connected to it, so that the replicas together stay within
	// the share wherever the Envoys connect (static division; unused
	// capacity of one replica is not lent to another). Ignored with
	// Claims. Default 1.
	Replicas int
	// Claims, when set, splits the region's share among the region's
	// replicas by their Envoys' demand (package doc, "Replicas"): every
	// ShareRefresh, and when a bucket first reports, the server publishes
	// its demand and claim on each active bucket and splits the part it
	// gets (Allocate). Nil: Replicas' static split.
	Claims ReplicaStore
	// ClaimSlack is how much longer than TTL + InFlight a replica's claim
	// lasts (ClaimRequest.Lease = TTL + InFlight + ClaimSlack): the time
	// a replica keeps granting without reaching the store, and the time
	// after its last grant that a dead replica's part stays unusable by
	// the others. It must exceed ShareRefresh (claims are renewed then).
	// Default 2 ShareRefresh + RedisTimeout.
	ClaimSlack time.Duration
	// Quota configures the split; the zero value means DefaultConfig().
	Quota Config
	// UsageEpoch is the coordinator's epoch (--epoch). Default 10 s.
	UsageEpoch time.Duration
	// ShareRefresh is how often the share records of active buckets are
	// read again. Default 1 s.
	ShareRefresh time.Duration
	// UsageFlush is how often usage is written to Usage. Default 1 s.
	UsageFlush time.Duration
	// UsageMaxKeys bounds the usage counts held between flushes, one per
	// (epoch, policy, subject). Beyond it a new key's usage is dropped,
	// counted (quotient_rlqs_usage_overflow_keys_total, _requests_total)
	// and its epoch marked incomplete (limiter.UsageOverflow, when Usage is
	// a limiter.UsageOverflowSink as limiter.RedisUsageSink is), so the
	// coordinator holds the shares of that epoch instead of shrinking the
	// keys it cannot see. Default 100,000; `quotient rls` passes its
	// --usage-max-keys.
	UsageMaxKeys int
	// RedisTimeout bounds every share read and usage write. Default 1 s.
	RedisTimeout time.Duration
	// SkipWarmUp: grant at once after start. By default a new server
	// grants nothing for TTL + InFlight after NewServer (Core.WarmUp), so
	// that assignments a previous process made before it crashed have run
	// out before the new one splits the share again; Envoys meanwhile keep
	// enforcing those, then their no_assignment_behavior. Set it only when
	// no Envoy can hold an assignment from an earlier process.
	SkipWarmUp bool
	// Metrics registers the server's metrics (quotient_rlqs_*); nil: none.
	Metrics prometheus.Registerer
	// Clock; nil means real time.
	Clock Clock
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

type bucketInfo struct {
	domain    string
	id        map[string]string
	policyID  string // "" for unlimited and zero rules (no usage, no share record)
	subject   limiter.Subject
	limit     Amount
	global    bool // scope global: the region's share is a share record or 1/Regions
	unlimited bool
	share     Amount
	hasShare  bool
}

type usageKey struct {
	epoch   int64
	policy  string
	subject limiter.Subject
}

// Server implements envoy.service.rate_limit_quota.v3.RateLimitQuotaService
// on a Core: it maps buckets onto the RLS configuration, reads shares,
// writes usage and sends each stream its assignments. Safe for
// concurrent use. Run (or Tick, driven by the caller) must run for
// assignments to be extended, shares refreshed and usage written.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer

	cfg   ServerConfig
	clock Clock
	log   *slog.Logger

	// claimMu serialises the claims (one ReplicaStore call at a time),
	// so that a bucket's ceiling and part are never computed by two
	// calls at once. Taken before mu.
	claimMu sync.Mutex

	mu        sync.Mutex
	core      *Core
	info      map[BucketKey]*bucketInfo
	streams   map[EnvoyID]*outbox
	nextID    EnvoyID
	closed    bool
	done      chan struct{}
	lastShare time.Time

	mStreams prometheus.Gauge
	mReports *prometheus.CounterVec
	mActions *prometheus.CounterVec
	mMsgs    prometheus.Counter
	mOvfKeys prometheus.Counter
	mOvfReqs prometheus.Counter

	usageMu   sync.Mutex
	usage     map[usageKey]limiter.UsageCount
	lastFlush time.Time
	// overflow is the usage dropped at ServerConfig.UsageMaxKeys, by epoch, not yet
	// written as a marker; overflowSeen makes a key count once per epoch
	// (up to maxOverflowSeen keys).
	overflow     map[int64]*limiter.UsageOverflow
	overflowSeen map[usageKey]struct{}
}

// NewServer returns a Server, or an error naming the missing or invalid
// field.
func NewServer(c ServerConfig) (*Server, error) {
	if c.Config == nil {
		return nil, errors.New("quota: ServerConfig.Config is required")
	}
	if c.Shares == nil {
		return nil, errors.New("quota: ServerConfig.Shares is required")
	}
	if c.Quota == (Config{}) {
		c.Quota = DefaultConfig()
	}
	core, err := NewCore(c.Quota)
	if err != nil {
		return nil, err
	}
	if c.UsageEpoch <= 0 {
		c.UsageEpoch = 10 * time.Second
	}
	if c.ShareRefresh <= 0 {
		c.ShareRefresh = time.Second
	}
	if c.UsageFlush <= 0 {
		c.UsageFlush = time.Second
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.RedisTimeout <= 0 {
		c.RedisTimeout = time.Second
	}
	if c.UsageMaxKeys <= 0 {
		c.UsageMaxKeys = defaultUsageMaxKeys
	}
	if c.ClaimSlack <= 0 {
		c.ClaimSlack = 2*c.ShareRefresh + c.RedisTimeout
	}
	if c.Claims != nil && c.ClaimSlack <= c.ShareRefresh {
		return nil, fmt.Errorf("quota: ServerConfig.ClaimSlack (%v) must exceed ShareRefresh (%v): claims are renewed every ShareRefresh", c.ClaimSlack, c.ShareRefresh)
	}
	s := &Server{cfg: c, clock: c.Clock, log: c.Logger, core: core,
		info: map[BucketKey]*bucketInfo{}, streams: map[EnvoyID]*outbox{},
		done: make(chan struct{}), usage: map[usageKey]limiter.UsageCount{},
		overflow: map[int64]*limiter.UsageOverflow{}, overflowSeen: map[usageKey]struct{}{}}
	if s.clock == nil {
		s.clock = realClock{}
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.mStreams = prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotient_rlqs_streams", Help: "Open RLQS streams (one per Envoy connection)."})
	s.mReports = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotient_rlqs_reports_total", Help: "RLQS usage report messages by result (ok, invalid, unknown_bucket)."}, []string{"result"})
	s.mActions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotient_rlqs_bucket_actions_total", Help: "Bucket actions sent to Envoys by kind (assign, abandon)."}, []string{"kind"})
	s.mMsgs = prometheus.NewCounter(prometheus.CounterOpts{Name: "quotient_rlqs_messages_sent_total", Help: "RLQS response messages sent to Envoys."})
	s.mOvfKeys = prometheus.NewCounter(prometheus.CounterOpts{Name: "quotient_rlqs_usage_overflow_keys_total", Help: "Bucket usage keys (policy, subject) whose usage was dropped because the server already held its bound of usage keys, each counted once per epoch."})
	s.mOvfReqs = prometheus.NewCounter(prometheus.CounterOpts{Name: "quotient_rlqs_usage_overflow_requests_total", Help: "Reported requests (allowed + denied) whose usage was dropped at the server's bound of usage keys."})
	if c.Metrics != nil {
		for _, m := range []prometheus.Collector{s.mStreams, s.mReports, s.mActions, s.mMsgs, s.mOvfKeys, s.mOvfReqs} {
			if err := c.Metrics.Register(m); err != nil {
				return nil, fmt.Errorf("quota: metrics: %w", err)
			}
		}
	}
	if !c.SkipWarmUp {
		core.WarmUp(s.clock.Now().Add(c.Quota.TTL + c.Quota.InFlight))
	}
	return s, nil
}

// outbox holds the actions not yet sent on one stream, the latest per
// bucket (a newer action replaces an older unsent one; the older one's
// reservation is kept by the core, which errs on the safe side).
type outbox struct {
	mu      sync.Mutex
	pending map[BucketKey]Action
	order   []BucketKey
	wake    chan struct{}
}

func newOutbox() *outbox {
	return &outbox{pending: map[BucketKey]Action{}, wake: make(chan struct{}, 1)}
}

func (o *outbox) put(a Action) {
	o.mu.Lock()
	if _, ok := o.pending[a.Bucket]; !ok {
		o.order = append(o.order, a.Bucket)
	}
	o.pending[a.Bucket] = a
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

func (o *outbox) take() []Action {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]Action, 0, len(o.order))
	for _, k := range o.order {
		out = append(out, o.pending[k])
	}
	clear(o.pending)
	o.order = o.order[:0]
	return out
}

// dispatch queues actions on their streams; s.mu is held.
func (s *Server) dispatch(acts []Action) {
	for _, a := range acts {
		if ob := s.streams[a.Envoy]; ob != nil {
			ob.put(a)
		}
	}
}

func (s *Server) response(acts []Action) *rlqsv3.RateLimitQuotaResponse {
	resp := &rlqsv3.RateLimitQuotaResponse{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range acts {
		inf := s.info[a.Bucket]
		if inf == nil {
			continue
		}
		ba := &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: &rlqsv3.BucketId{Bucket: maps.Clone(inf.id)}}
		kind := "assign"
		if a.Abandon {
			kind = "abandon"
		}
		s.mActions.WithLabelValues(kind).Inc()
		if a.Abandon {
			ba.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}
		} else {
			ba.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(a.TTL),
				RateLimitStrategy:    Strategy(a.Unlimited, a.Amount),
			}}
		}
		resp.BucketAction = append(resp.BucketAction, ba)
	}
	return resp
}

// StreamRateLimitQuotas implements RateLimitQuotaServiceServer. The
// stream ends with InvalidArgument naming the field for a malformed
// report, NotFound for a bucket no rule matches (the message that carried
// either changes nothing), and OK after Shutdown, once the TTL-0
// assignments are sent. It runs the stream on a Conn.
func (s *Server) StreamRateLimitQuotas(st rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	c, err := s.Open()
	if err != nil {
		return err
	}
	defer c.Close()

	recvErr := make(chan error, 1)
	go func() { recvErr <- c.recvLoop(st.Context(), st) }()
	send := func() error {
		if resp := c.Take(); resp != nil {
			return st.Send(resp)
		}
		return nil
	}
	for {
		select {
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-c.ob.wake:
			if err := send(); err != nil {
				return err
			}
		case <-s.done:
			return send()
		}
	}
}

// Conn is one Envoy's stream as the server sees it, without the
// transport: Receive hands the server one message of the Envoy, Take
// returns what the server has to send it. StreamRateLimitQuotas runs
// every gRPC stream on one; a caller that plays the transport itself (the
// simulator, which drives Envoys in virtual time with the server's Clock
// and Tick) uses the same code. Receive and Take may be called from
// different goroutines; Close once, after the last Receive.
type Conn struct {
	s      *Server
	id     EnvoyID
	ob     *outbox
	domain string // set by the stream's first message
}

// Open starts a stream. It fails with Unavailable after Shutdown.
func (s *Server) Open() (*Conn, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, status.Error(codes.Unavailable, "quota: the server is shutting down")
	}
	s.nextID++
	c := &Conn{s: s, id: s.nextID, ob: newOutbox()}
	s.streams[c.id] = c.ob
	s.mu.Unlock()
	s.mStreams.Inc()
	return c, nil
}

// Receive applies one message of the Envoy, at the server's clock. An
// error (InvalidArgument naming the field, NotFound for a bucket no rule
// matches) ends the stream on the gRPC path; the message that carried it
// changed nothing.
func (c *Conn) Receive(ctx context.Context, msg *rlqsv3.RateLimitQuotaUsageReports) error {
	return c.s.handle(ctx, c.id, &c.domain, msg)
}

// Take returns the bucket actions pending for the Envoy as one response
// message (the latest action per bucket), or nil when none is pending.
// The caller owns the message.
func (c *Conn) Take() *rlqsv3.RateLimitQuotaResponse {
	acts := c.ob.take()
	if len(acts) == 0 {
		return nil
	}
	c.s.mMsgs.Inc()
	return c.s.response(acts)
}

// Close ends the stream: the Envoy's grants stay reserved until they run
// out, and its buckets are re-split among the others.
func (c *Conn) Close() {
	c.s.disconnect(c.id)
	c.s.mStreams.Dec()
}

func (s *Server) disconnect(id EnvoyID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.streams, id)
	s.dispatch(s.core.Disconnect(s.clock.Now(), id))
}

func (c *Conn) recvLoop(ctx context.Context, st rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	for {
		msg, err := st.Recv()
		if err != nil {
			return err
		}
		if err := c.Receive(ctx, msg); err != nil {
			return err
		}
	}
}

type item struct {
	key   BucketKey
	info  *bucketInfo
	usage Usage
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "quota: "+format, args...)
}

// parse validates a whole message and maps its buckets; nothing is
// applied unless every bucket is valid.
func (s *Server) parse(domain *string, msg *rlqsv3.RateLimitQuotaUsageReports) ([]item, error) {
	switch d := msg.GetDomain(); {
	case *domain == "" && d == "":
		return nil, invalid("domain is empty: the first report of a stream names its domain")
	case len(d) > rls.MaxDomainBytes:
		return nil, invalid("domain is %d bytes, more than %d", len(d), rls.MaxDomainBytes)
	case *domain == "":
		*domain = d
	case d != "" && d != *domain:
		return nil, invalid("domain %q differs from the stream's %q (open a new stream to change it)", d, *domain)
	}
	us := msg.GetBucketQuotaUsages()
	if len(us) > MaxBucketsPerReport {
		return nil, invalid("%d bucket_quota_usages, more than %d", len(us), MaxBucketsPerReport)
	}
	cfg := s.cfg.Config()
	items := make([]item, 0, len(us))
	seen := map[BucketKey]bool{}
	for i, u := range us {
		f := fmt.Sprintf("bucket_quota_usages[%d]", i)
		id := u.GetBucketId().GetBucket()
		switch {
		case u == nil:
			return nil, invalid("%s is null", f)
		case len(id) == 0:
			return nil, invalid("%s.bucket_id is empty", f)
		case len(id) > rls.MaxEntries:
			return nil, invalid("%s.bucket_id has %d entries, more than %d", f, len(id), rls.MaxEntries)
		case u.GetTimeElapsed() == nil:
			return nil, invalid("%s.time_elapsed is missing", f)
		case u.GetTimeElapsed().CheckValid() != nil || u.GetTimeElapsed().AsDuration() < 0:
			return nil, invalid("%s.time_elapsed %v is negative or invalid", f, u.GetTimeElapsed())
		case u.GetTimeElapsed().AsDuration() > MaxElapsed:
			return nil, invalid("%s.time_elapsed %v is more than %v", f, u.GetTimeElapsed().AsDuration(), MaxElapsed)
		case u.GetNumRequestsAllowed() > MaxReportCount:
			return nil, invalid("%s.num_requests_allowed %d is more than %d", f, u.GetNumRequestsAllowed(), MaxReportCount)
		case u.GetNumRequestsDenied() > MaxReportCount:
			return nil, invalid("%s.num_requests_denied %d is more than %d", f, u.GetNumRequestsDenied(), MaxReportCount)
		}
		size := 0
		for k, v := range id {
			size += len(k) + len(v)
			switch {
			case k == "":
				return nil, invalid("%s.bucket_id has an empty key", f)
			case len(k) > rls.MaxEntryBytes || len(v) > rls.MaxEntryBytes:
				return nil, invalid("%s.bucket_id[%.40q]: a key or value is more than %d bytes", f, k, rls.MaxEntryBytes)
			}
		}
		if size > rls.MaxDescriptorBytes {
			return nil, invalid("%s.bucket_id: keys and values are %d bytes together, more than %d", f, size, rls.MaxDescriptorBytes)
		}
		key := BucketKey(rls.BucketKey(*domain, id))
		if seen[key] {
			return nil, invalid("%s: bucket %s appears twice in one report", f, key)
		}
		seen[key] = true
		b, ok := cfg.LookupBucket(*domain, id)
		if !ok {
			return nil, status.Errorf(codes.NotFound, "quota: %s: bucket %s matches no rate limit rule of domain %q", f, key, *domain)
		}
		inf := &bucketInfo{domain: *domain, id: maps.Clone(id), subject: b.Subject}
		s.setLimit(inf, b.Rule)
		items = append(items, item{key: key, info: inf, usage: Usage{
			Allowed: u.GetNumRequestsAllowed(), Denied: u.GetNumRequestsDenied(), Elapsed: u.GetTimeElapsed().AsDuration()}})
	}
	return items, nil
}

// setLimit sets a bucket's limit from its rule. An envoyproxy rule of
// requests_per_unit per unit is a token bucket of that rate whose burst
// is one window's requests (what the window admits at once); unlimited
// rules are ALLOW_ALL, requests_per_unit 0 is DENY_ALL. A rule naming a
// Quotient policy (rate_limit.policy) takes the policy's rate and burst
// (buckets) or limit per window (windows); a shadow policy is ALLOW_ALL
// (its usage still counts), and a policy missing from the set is DENY_ALL
// until it arrives (rls.Server refuses such a set, so only a race can
// see it). Per-subject overrides of the policy are not applied.
func (s *Server) setLimit(inf *bucketInfo, r *rls.Rule) {
	inf.unlimited = r.Unlimited
	inf.policyID, inf.limit, inf.global = "", Amount{}, false
	p := r.Policy()
	if r.PolicyID != "" {
		p = nil
		if s.cfg.Policy != nil {
			p = s.cfg.Policy(r.PolicyID)
		}
		if p == nil {
			return
		}
	}
	if p == nil {
		return
	}
	inf.unlimited = inf.unlimited || p.Mode == limiter.Shadow
	inf.policyID = p.ID
	inf.global = p.Scope == limiter.ScopeGlobal
	switch {
	case p.Algorithm == limiter.TokenBucket || p.Algorithm == limiter.LeakyBucket:
		inf.limit = Amount{RateMilli: int64(math.Round(p.RatePerSec * 1000)), BurstMilli: int64(math.Round(p.Burst * 1000))}
	case p.NominalWindowSec() > 0:
		inf.limit = Amount{RateMilli: mulDiv(p.Limit, 1000, p.NominalWindowSec()), BurstMilli: satMul1000(p.Limit)}
	}
}

func satMul1000(v int64) int64 {
	if v > math.MaxInt64/1000 {
		return math.MaxInt64
	}
	return v * 1000
}

// shareOf is this replica's part of the bucket's share, divided by
// Replicas, rounded down. The region's share of a global policy is its
// share record when found, else the default, 1/Regions of the limit; a
// region-scope limit (every envoyproxy/ratelimit rule, and Quotient
// policies without scope global) is the region's whole, as quotient rls
// decides it per region.
func (s *Server) shareOf(inf *bucketInfo, rec ShareRecord) Amount {
	region := rec.Amount
	switch {
	case !inf.global:
		region = inf.limit
	case !rec.Found || inf.policyID == "":
		n := int64(1)
		if s.cfg.Regions != nil {
			n = int64(max(1, s.cfg.Regions()))
		}
		region = Amount{RateMilli: inf.limit.RateMilli / n, BurstMilli: inf.limit.BurstMilli / n}
	}
	r := int64(s.cfg.Replicas)
	if s.cfg.Claims != nil {
		r = 1 // the replicas' split is by demand (claim)
	}
	return Amount{RateMilli: region.RateMilli / r, BurstMilli: region.BurstMilli / r}
}

func (s *Server) readShares(ctx context.Context, infos []*bucketInfo) []ShareRecord {
	var qs []ShareQuery
	var idx []int
	for i, inf := range infos {
		if inf.global && inf.policyID != "" {
			qs = append(qs, ShareQuery{Subject: inf.subject, PolicyID: inf.policyID})
			idx = append(idx, i)
		}
	}
	out := make([]ShareRecord, len(infos))
	if len(qs) == 0 {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
	defer cancel()
	recs, err := s.cfg.Shares.ReadShares(ctx, qs)
	if err != nil {
		s.log.Warn("quota: share records not read; keeping the shares known (the default for new buckets)", "err", err)
	}
	for j, r := range recs {
		out[idx[j]] = r
	}
	if err != nil && recs == nil {
		return nil
	}
	return out
}

func (s *Server) handle(ctx context.Context, id EnvoyID, domain *string, msg *rlqsv3.RateLimitQuotaUsageReports) error {
	items, err := s.parse(domain, msg)
	if err != nil {
		if status.Code(err) == codes.NotFound {
			s.mReports.WithLabelValues("unknown_bucket").Inc()
		} else {
			s.mReports.WithLabelValues("invalid").Inc()
		}
		return err
	}
	s.mReports.WithLabelValues("ok").Inc()
	// Usage first: it was spent whatever happens to the stream.
	s.addUsage(s.clock.Now(), items)
	var fresh []*bucketInfo
	s.mu.Lock()
	for _, it := range items {
		if s.info[it.key] == nil {
			fresh = append(fresh, it.info)
		}
	}
	s.mu.Unlock()
	recs := s.readShares(ctx, fresh)
	now := s.clock.Now()
	s.mu.Lock()
	if s.streams[id] == nil || s.closed {
		s.mu.Unlock()
		return nil
	}
	for j, inf := range fresh {
		if s.info[key(inf)] == nil {
			var rec ShareRecord
			if recs != nil {
				rec = recs[j]
			}
			inf.share, inf.hasShare = s.shareOf(inf, rec), true
			s.info[key(inf)] = inf
		}
	}
	var claim []BucketKey
	for _, it := range items {
		inf := s.info[it.key]
		if !s.core.Known(it.key) {
			if s.leased(inf) {
				// No part before the first claim: the Envoy stays on
				// its no_assignment_behavior until then.
				s.dispatch(s.core.SetLeasedShare(now, it.key, Amount{}, false, time.Time{}))
				claim = append(claim, it.key)
			} else {
				s.dispatch(s.core.SetShare(now, it.key, inf.share, inf.unlimited))
			}
		}
		s.dispatch(s.core.Report(now, id, it.key, it.usage))
	}
	s.mu.Unlock()
	s.claim(ctx, claim)
	return nil
}

// leased reports whether a bucket's part is claimed from the region's
// replicas (Claims set, and a limited bucket).
func (s *Server) leased(inf *bucketInfo) bool { return s.cfg.Claims != nil && !inf.unlimited }

// claim publishes the replica's demand and claim on each bucket and
// applies the part it gets, with a lease of TTL + InFlight + ClaimSlack
// from before the call (the store's expiry is later still). A bucket
// whose call fails keeps its part and lease (its grants stop when the
// lease no longer covers them).
func (s *Server) claim(ctx context.Context, keys []BucketKey) {
	if s.cfg.Claims == nil || len(keys) == 0 {
		return
	}
	s.claimMu.Lock()
	defer s.claimMu.Unlock()
	lease := s.cfg.Quota.TTL + s.cfg.Quota.InFlight + s.cfg.ClaimSlack
	for _, k := range keys {
		s.mu.Lock()
		inf := s.info[k]
		if inf == nil || !s.leased(inf) || !s.core.Known(k) || s.closed {
			s.mu.Unlock()
			continue
		}
		t0 := s.clock.Now()
		part, _ := s.core.Share(k)
		req := ClaimRequest{Share: inf.share, DemandMilli: s.core.Demand(k), Ceiling: s.core.Ceiling(t0, k), Lease: lease,
			Part: part, ThresholdPermille: s.cfg.Quota.ThresholdPermille}
		s.mu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
		part, err := s.cfg.Claims.Claim(cctx, k, req)
		cancel()
		if err != nil {
			s.log.Warn("quota: replica claim failed; keeping the part and lease held", "bucket", string(k), "err", err)
			continue
		}
		s.mu.Lock()
		if !s.closed && s.core.Known(k) {
			s.dispatch(s.core.SetLeasedShare(s.clock.Now(), k, part, false, t0.Add(lease)))
		}
		s.mu.Unlock()
	}
}

func key(inf *bucketInfo) BucketKey { return BucketKey(rls.BucketKey(inf.domain, inf.id)) }

func (s *Server) epochOf(now time.Time) int64 {
	ms, e := now.UnixMilli(), s.cfg.UsageEpoch.Milliseconds()
	q := ms / e
	if ms < 0 && ms%e != 0 {
		q--
	}
	return q
}

// defaultUsageMaxKeys is ServerConfig.UsageMaxKeys's default. Usage of a
// key beyond the bound is dropped, counted (quotient_rlqs_usage_overflow_*)
// and marked for its epoch (limiter.UsageOverflow, written before the
// counts when Usage is a limiter.UsageOverflowSink), so the coordinator
// collects that epoch as incomplete and holds the shares instead of
// shrinking the keys it cannot see, as for a gateway's UsageMaxKeys.
const defaultUsageMaxKeys = 100_000

// maxOverflowSeen bounds the keys remembered per epoch so that a dropped
// key counts once in the marker; beyond, a key dropped again counts again.
const maxOverflowSeen = 1 << 14

// noteOverflow records that k's usage (d attempts) was dropped. Called
// with usageMu held.
func (s *Server) noteOverflow(k usageKey, d int64) {
	o := s.overflow[k.epoch]
	if o == nil {
		for e := range s.overflow {
			if e < k.epoch-2 {
				delete(s.overflow, e)
			}
		}
		o = &limiter.UsageOverflow{Epoch: k.epoch}
		s.overflow[k.epoch] = o
	}
	o.Requests += d
	s.mOvfReqs.Add(float64(d))
	if _, seen := s.overflowSeen[k]; seen {
		return
	}
	if len(s.overflowSeen) >= maxOverflowSeen {
		for sk := range s.overflowSeen {
			if sk.epoch < k.epoch {
				delete(s.overflowSeen, sk)
			}
		}
	}
	if len(s.overflowSeen) < maxOverflowSeen {
		s.overflowSeen[k] = struct{}{}
	}
	o.Keys++
	s.mOvfKeys.Inc()
}

func (s *Server) addUsage(now time.Time, items []item) {
	if s.cfg.Usage == nil {
		return
	}
	epoch := s.epochOf(now)
	s.usageMu.Lock()
	defer s.usageMu.Unlock()
	for _, it := range items {
		if it.info.policyID == "" {
			continue
		}
		d := int64(it.usage.Allowed + it.usage.Denied)
		a := int64(it.usage.Allowed)
		if d == 0 {
			continue
		}
		k := usageKey{epoch, it.info.policyID, it.info.subject}
		c, ok := s.usage[k]
		if !ok && len(s.usage) >= s.cfg.UsageMaxKeys {
			s.noteOverflow(k, d)
			continue
		}
		if !ok {
			c = limiter.UsageCount{Epoch: epoch, PolicyID: it.info.policyID, Subject: it.info.subject}
		}
		c.Demand += d
		c.Admitted += a
		s.usage[k] = c
	}
}

// FlushUsage writes the usage counted so far to the sink; counts it could
// not write are kept for the next flush while their epoch is at most two
// epochs old (later, no coordinator reads them).
func (s *Server) FlushUsage(ctx context.Context, now time.Time) error {
	if s.cfg.Usage == nil {
		return nil
	}
	s.usageMu.Lock()
	counts := make([]limiter.UsageCount, 0, len(s.usage))
	for _, c := range s.usage {
		counts = append(counts, c)
	}
	clear(s.usage)
	var ovf []limiter.UsageOverflow
	for e, o := range s.overflow {
		if o.Keys > 0 || o.Requests > 0 {
			ovf = append(ovf, *o)
			s.overflow[e] = &limiter.UsageOverflow{Epoch: e}
		}
	}
	s.usageMu.Unlock()
	if len(counts) == 0 && len(ovf) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
	defer cancel()
	oldest := s.epochOf(now) - 2
	// The markers first: a coordinator that reads an epoch's counts after
	// this flush also sees that the epoch is incomplete.
	var ovfErr error
	if os, ok := s.cfg.Usage.(limiter.UsageOverflowSink); ok && len(ovf) > 0 {
		if ovfErr = os.WriteUsageOverflow(ctx, ovf); ovfErr != nil {
			s.usageMu.Lock()
			for _, o := range ovf {
				if o.Epoch < oldest {
					continue
				}
				cur := s.overflow[o.Epoch]
				if cur == nil {
					cur = &limiter.UsageOverflow{Epoch: o.Epoch}
					s.overflow[o.Epoch] = cur
				}
				cur.Keys += o.Keys
				cur.Requests += o.Requests
			}
			s.usageMu.Unlock()
		}
	}
	var failed []limiter.UsageCount
	var err error
	if len(counts) > 0 {
		failed, err = s.cfg.Usage.WriteUsage(ctx, counts)
	}
	if err == nil {
		err = ovfErr
	}
	if len(failed) > 0 {
		s.usageMu.Lock()
		for _, c := range failed {
			k := usageKey{c.Epoch, c.PolicyID, c.Subject}
			old, ok := s.usage[k]
			if c.Epoch < oldest {
				continue
			}
			if !ok && len(s.usage) >= s.cfg.UsageMaxKeys {
				s.noteOverflow(k, c.Demand)
				continue
			}
			old.Epoch, old.PolicyID, old.Subject = c.Epoch, c.PolicyID, c.Subject
			old.Demand += c.Demand
			old.Admitted += c.Admitted
			s.usage[k] = old
		}
		s.usageMu.Unlock()
	}
	return err
}

// Tick does one step of the driver at now: reads the share records of
// active buckets again (every ShareRefresh) and applies changed shares
// and configuration limits, runs out grants, abandons idle buckets,
// extends assignments, and writes usage (every UsageFlush). Run calls it;
// tests call it with their own clock.
func (s *Server) Tick(ctx context.Context, now time.Time) {
	if now.Sub(s.lastShareTime()) >= s.cfg.ShareRefresh {
		s.refresh(ctx, now)
		s.mu.Lock()
		keys := make([]BucketKey, 0, len(s.info))
		for k := range s.info {
			keys = append(keys, k)
		}
		s.mu.Unlock()
		slices.Sort(keys)
		s.claim(ctx, keys)
	}
	s.mu.Lock()
	if !s.closed {
		s.dispatch(s.core.Tick(now))
		for k := range s.info {
			if !s.core.Known(k) {
				delete(s.info, k)
			}
		}
	}
	s.mu.Unlock()
	if now.Sub(s.lastFlush) >= s.cfg.UsageFlush {
		s.lastFlush = now
		if err := s.FlushUsage(ctx, now); err != nil {
			s.log.Warn("quota: usage flush failed; retried on the next", "err", err)
		}
	}
}

func (s *Server) lastShareTime() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastShare
}

func (s *Server) refresh(ctx context.Context, now time.Time) {
	cfg := s.cfg.Config()
	s.mu.Lock()
	s.lastShare = now
	keys := make([]BucketKey, 0, len(s.info))
	infos := make([]*bucketInfo, 0, len(s.info))
	for k, inf := range s.info {
		// The configuration may have changed the rule's limit.
		if b, ok := cfg.LookupBucket(inf.domain, inf.id); ok && b.Subject == inf.subject {
			s.setLimit(inf, b.Rule)
		}
		keys = append(keys, k)
		c := *inf
		infos = append(infos, &c)
	}
	s.mu.Unlock()
	recs := s.readShares(ctx, infos)
	if recs == nil {
		return // Redis unreachable: keep what is known
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	for i, k := range keys {
		inf := s.info[k]
		if inf == nil {
			continue
		}
		share := s.shareOf(inf, recs[i])
		if s.leased(inf) {
			inf.share = share // the part is claimed below
			continue
		}
		if share != inf.share || !s.core.Known(k) {
			inf.share = share
			s.dispatch(s.core.SetShare(now, k, share, inf.unlimited))
		}
	}
}

// Run calls Tick every quarter of the assignment TTL (at most every
// 250 ms) until ctx is done. It blocks.
func (s *Server) Run(ctx context.Context) {
	every := min(250*time.Millisecond, s.cfg.Quota.TTL/4)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Tick(ctx, s.clock.Now())
		}
	}
}

// Shutdown sends every stream its live assignments with a TTL of 0, so
// that Envoys fall back to their expired_assignment_behavior at once
// rather than enforce a split nobody updates, ends the streams (OK) and
// writes the usage counted so far. Call it before grpc.Server's
// GracefulStop, which waits for the streams to end. Later streams are
// refused with Unavailable.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.dispatch(s.core.Shutdown(s.clock.Now()))
	close(s.done)
	s.mu.Unlock()
	return s.FlushUsage(ctx, s.clock.Now())
}
