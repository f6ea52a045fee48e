package quota

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/redisio"
	"github.com/quotientlabs/quotient/rls"
)

const testConfig = `
domain: edge
descriptors:
  - key: path
    value: /api
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: path
    value: /global
    rate_limit: {policy: api-global}
  - key: tenant
    descriptors:
      - key: route
        rate_limit: {unit: minute, requests_per_unit: 600}
`

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

type harness struct {
	srv    *Server
	rc     redis.UniversalClient
	clock  *fakeClock
	client rlqsv3.RateLimitQuotaServiceClient
	cfg    *rls.Config
	qcfg   Config
}

func startQuota(t *testing.T) *harness { return startQuotaWarm(t, true) }

func startQuotaWarm(t *testing.T, skipWarmUp bool) *harness {
	t.Helper()
	return startQuotaWith(t, skipWarmUp, nil)
}

// startQuotaWith is startQuotaWarm with the ServerConfig changed by mut
// (if not nil) before NewServer.
func startQuotaWith(t *testing.T, skipWarmUp bool, mut func(*ServerConfig)) *harness {
	t.Helper()
	rc := redistest.StartServer(t).Client()
	cfg, err := rls.Parse([]rls.File{{Name: "edge.yaml", Data: []byte(testConfig)}}, rls.ParseOptions{})
	require.NoError(t, err)
	clock := &fakeClock{now: time.Now().Truncate(10 * time.Second)}
	qcfg := DefaultConfig()
	sc := ServerConfig{
		Config:     func() *rls.Config { return cfg },
		Shares:     &RedisShares{Client: rc},
		Usage:      limiter.NewRedisUsageSink(rc, limiter.DefaultUsageShards, 10*time.Second, 3),
		Regions:    func() int { return 1 },
		Policy:     func(id string) *limiter.Policy { return harnessPolicies[id] },
		Quota:      qcfg,
		Clock:      clock,
		SkipWarmUp: skipWarmUp,
	}
	if mut != nil {
		mut(&sc)
	}
	srv, err := NewServer(sc)
	require.NoError(t, err)
	gs := grpc.NewServer()
	rlqsv3.RegisterRateLimitQuotaServiceServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return &harness{srv: srv, rc: rc, clock: clock, client: rlqsv3.NewRateLimitQuotaServiceClient(conn), cfg: cfg, qcfg: qcfg}
}

// envoy is one simulated Envoy: a real bidirectional stream; a goroutine
// records every bucket action it receives.
type envoy struct {
	name   string
	stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	cancel context.CancelFunc

	mu      sync.Mutex
	actions []*rlqsv3.RateLimitQuotaResponse_BucketAction
	ended   error
	done    chan struct{}
	onRecv  func(e *envoy, a *rlqsv3.RateLimitQuotaResponse_BucketAction)
}

func (h *harness) envoy(t *testing.T, name string, onRecv func(*envoy, *rlqsv3.RateLimitQuotaResponse_BucketAction)) *envoy {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	st, err := h.client.StreamRateLimitQuotas(ctx)
	require.NoError(t, err)
	e := &envoy{name: name, stream: st, cancel: cancel, done: make(chan struct{}), onRecv: onRecv}
	t.Cleanup(cancel)
	go func() {
		defer close(e.done)
		for {
			resp, err := st.Recv()
			if err != nil {
				e.mu.Lock()
				e.ended = err
				e.mu.Unlock()
				return
			}
			for _, a := range resp.BucketAction {
				e.mu.Lock()
				e.actions = append(e.actions, a)
				if e.onRecv != nil {
					e.onRecv(e, a)
				}
				e.mu.Unlock()
			}
		}
	}()
	return e
}

func usage(id map[string]string, allowed, denied uint64, elapsed time.Duration) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId: &rlqsv3.BucketId{Bucket: id}, TimeElapsed: durationpb.New(elapsed),
		NumRequestsAllowed: allowed, NumRequestsDenied: denied,
	}
}

func (e *envoy) report(t *testing.T, domain string, us ...*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) {
	t.Helper()
	require.NoError(t, e.stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us}))
}

// latest is the last action received for the bucket, nil before any.
func (e *envoy) latest() *rlqsv3.RateLimitQuotaResponse_BucketAction {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.actions) == 0 {
		return nil
	}
	return e.actions[len(e.actions)-1]
}

// waitEnd waits, bounded, for the stream to end.
func (e *envoy) waitEnd(t *testing.T) {
	t.Helper()
	select {
	case <-e.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: the stream did not end", e.name)
	}
}

func (e *envoy) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.actions)
}

func rateOf(a *rlqsv3.RateLimitQuotaResponse_BucketAction) Amount {
	if a == nil || a.GetQuotaAssignmentAction() == nil {
		return Amount{}
	}
	amt, _ := AmountOf(a.GetQuotaAssignmentAction().GetRateLimitStrategy())
	return amt
}

// waitFor waits, bounded, until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, not waiting for time to pass
	}
}

// receipts checks the invariant from the Envoys' side: every assignment
// received binds its Envoy for its TTL from receipt (the fake clock does
// not move while messages travel), and the sum of the largest binding
// assignment of each Envoy stays within the share.
type receipts struct {
	mu    sync.Mutex
	clock *fakeClock
	by    map[string][]sentGrant
	share func() Amount
	bad   []string
}

func (r *receipts) on(e *envoy, a *rlqsv3.RateLimitQuotaResponse_BucketAction) {
	qa := a.GetQuotaAssignmentAction()
	if qa == nil {
		return
	}
	amt, _ := AmountOf(qa.GetRateLimitStrategy())
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	until := now.Add(qa.GetAssignmentTimeToLive().AsDuration())
	// The same strategy before the last one expired is an extension (the
	// bucket goes on); anything else starts a full bucket, whose burst is
	// held on top of the earlier ones' until they would have expired.
	if gs := r.by[e.name]; len(gs) > 0 && gs[len(gs)-1].amt == amt && now.Before(gs[len(gs)-1].until) {
		gs[len(gs)-1].until = until
	} else {
		r.by[e.name] = append(gs, sentGrant{amt: amt, until: until})
	}
	var sum Amount
	for _, gs := range r.by {
		var rate int64
		for _, g := range gs {
			if now.Before(g.until) {
				rate = max(rate, g.amt.RateMilli)
				sum.BurstMilli += g.amt.BurstMilli
			}
		}
		sum.RateMilli += rate
	}
	if s := r.share(); !sum.fits(s) {
		r.bad = append(r.bad, e.name+": sum "+fmtAmount(sum)+" above share "+fmtAmount(s))
	}
}

func fmtAmount(a Amount) string { return fmt.Sprintf("%d/%d milli", a.RateMilli, a.BurstMilli) }

var apiBucket = map[string]string{"path": "/api"}

// globalBucket's rule names the global policy api-global (100/s, burst
// 100), whose region share the coordinators move through share records.
var globalBucket = map[string]string{"path": "/global"}

var harnessPolicies = func() map[string]*limiter.Policy {
	pols, err := limiter.ParsePolicies([]byte(`[{"id": "api-global", "scope": "global", "subject": "api_key",
		"algorithm": "token_bucket", "rate_per_sec": 100, "burst": 100}]`))
	if err != nil {
		panic(err)
	}
	return map[string]*limiter.Policy{pols[0].ID: pols[0]}
}()

// TestEnvoysMaxMinFairThenShareChange: three Envoys with skewed demand
// (10, 40 and 200 requests/s) on one bucket of 100/s get 10, 40 and 50
// once the first Envoy's larger assignment has run out; the Envoys' own
// view of what binds them never sums above the share; a lowered share
// record re-sends assignments within it.
func TestEnvoysMaxMinFairThenShareChange(t *testing.T) {
	h := startQuota(t)
	share := Amount{100_000, 100_000}
	var shareMu sync.Mutex
	rec := &receipts{clock: h.clock, by: map[string][]sentGrant{}, share: func() Amount { shareMu.Lock(); defer shareMu.Unlock(); return share }}
	es := []*envoy{h.envoy(t, "a", rec.on), h.envoy(t, "b", rec.on), h.envoy(t, "c", rec.on)}
	demand := []uint64{10, 40, 200}
	for i, e := range es {
		e.report(t, "edge", usage(globalBucket, demand[i], 0, time.Second))
		waitFor(t, e.name+"'s first assignment", func() bool { return e.latest() != nil })
	}
	// a got the whole share alone; b and c get what is left until a's
	// first assignment runs out (TTL + InFlight after it was sent).
	h.clock.Advance(h.qcfg.TTL + h.qcfg.InFlight)
	for i, e := range es {
		e.report(t, "edge", usage(globalBucket, demand[i], 0, time.Second))
	}
	h.srv.Tick(context.Background(), h.clock.Now())
	want := []int64{10_000, 40_000, 50_000}
	waitFor(t, "the max-min fair split 10/40/50", func() bool {
		for i, e := range es {
			if r := rateOf(e.latest()).RateMilli; r > want[i] || r < want[i]-10 {
				return false
			}
		}
		return true
	})
	var sum Amount
	for _, e := range es {
		sum = sum.add(rateOf(e.latest()))
		assert.Equal(t, h.qcfg.TTL, e.latest().GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration())
	}
	assert.True(t, sum.fits(share), "sum %+v", sum)

	// The coordinator halves the region's share.
	policyID := mustBucket(t, h.cfg, globalBucket).Rule.PolicyID
	subj := mustBucket(t, h.cfg, globalBucket).Subject
	require.NoError(t, limiter.NewRedisStore(h.rc).SetShare(context.Background(), subj, policyID, 50_000, 50_000, time.Minute))
	before := []int{es[0].count(), es[1].count(), es[2].count()}
	aBefore := es[0].latest()
	// b's and c's lowered assignments are new buckets, whose bursts do
	// not fit beside those of the assignments they replace (the sum is
	// above the halved share): they are sent once those run out, TTL +
	// InFlight after they were sent. a's is extended meanwhile.
	h.srv.Tick(context.Background(), h.clock.Advance(time.Second))
	h.srv.Tick(context.Background(), h.clock.Advance(h.qcfg.TTL/2))
	waitFor(t, "a's extension", func() bool { return es[0].count() > before[0] })
	h.srv.Tick(context.Background(), h.clock.Advance(h.qcfg.TTL+h.qcfg.InFlight-time.Second-h.qcfg.TTL/2+250*time.Millisecond))
	waitFor(t, "re-sent assignments within the halved share", func() bool {
		var s Amount
		for i, e := range es {
			// a's assignment (10/s, 10 requests of burst) is the same
			// under either share.
			if i > 0 && e.count() == before[i] {
				return false
			}
			s = s.add(rateOf(e.latest()))
		}
		return s.RateMilli <= 50_000 && s.BurstMilli <= 50_000
	})
	// a's assignment is the same under either share (a re-send of it
	// would be an extension, which Envoy does not see as a change).
	assert.True(t, proto.Equal(aBefore.GetQuotaAssignmentAction().GetRateLimitStrategy(), es[0].latest().GetQuotaAssignmentAction().GetRateLimitStrategy()))
	// 50/s max-min fair over 10, 40, 200: 10, 20, 20.
	for i, w := range []int64{10_000, 20_000, 20_000} {
		r := rateOf(es[i].latest()).RateMilli
		assert.InDelta(t, w, r, 10, "envoy %s", es[i].name)
	}
	shareMu.Lock()
	share = Amount{50_000, 50_000} // from now on: the lowered share binds once a's older grants run out
	shareMu.Unlock()
	h.clock.Advance(h.qcfg.TTL + h.qcfg.InFlight)
	for i, e := range es {
		e.report(t, "edge", usage(globalBucket, demand[i], 0, time.Second))
	}
	h.srv.Tick(context.Background(), h.clock.Now())
	rec.mu.Lock()
	assert.Empty(t, rec.bad, "the Envoys' assignments summed above the share")
	rec.mu.Unlock()
	var after Amount
	for _, e := range es {
		after = after.add(rateOf(e.latest()))
	}
	assert.True(t, after.fits(Amount{50_000, 50_000}), "after the TTL: %+v", after)
}

func mustBucket(t *testing.T, cfg *rls.Config, id map[string]string) rls.Bucket {
	t.Helper()
	b, ok := cfg.LookupBucket("edge", id)
	require.True(t, ok)
	return b
}

// TestUsageReachesTheRegionsUsage: what the Envoys report is in the
// region's usage as the coordinator reads it (limiter.CollectUsage over
// the gateways' layout), under the rule's policy and the descriptor's
// subject, summed over Envoys.
func TestUsageReachesTheRegionsUsage(t *testing.T) {
	h := startQuota(t)
	a, b := h.envoy(t, "a", nil), h.envoy(t, "b", nil)
	a.report(t, "edge", usage(apiBucket, 30, 5, time.Second))
	b.report(t, "edge", usage(apiBucket, 12, 0, time.Second))
	waitFor(t, "assignments", func() bool { return a.latest() != nil && b.latest() != nil })
	h.srv.Tick(context.Background(), h.clock.Now())
	epoch := h.srv.epochOf(h.clock.Now())
	got, err := limiter.CollectUsage(context.Background(), h.rc, epoch, limiter.DefaultUsageShards)
	require.NoError(t, err)
	bk := mustBucket(t, h.cfg, apiBucket)
	require.Len(t, got, 1)
	assert.Equal(t, limiter.UsageCount{Epoch: epoch, PolicyID: bk.Rule.Policy().ID, Subject: bk.Subject, Demand: 47, Admitted: 42}, got[0])
}

// TestUsageOverflowMarksTheEpoch: usage dropped at UsageMaxKeys is
// counted and marks its epoch incomplete in the region's Redis, so the
// coordinator's usage source (redisio.Source) reports the epoch as
// incomplete and holds the shares instead of shrinking the dropped key's.
func TestUsageOverflowMarksTheEpoch(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := startQuotaWith(t, true, func(c *ServerConfig) { c.UsageMaxKeys = 1; c.Metrics = reg })
	a := h.envoy(t, "a", nil)
	a.report(t, "edge", usage(apiBucket, 30, 5, time.Second), usage(map[string]string{"tenant": "t1", "route": "r"}, 7, 1, time.Second))
	waitFor(t, "assignments", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.actions) >= 2
	})
	h.srv.Tick(context.Background(), h.clock.Now())
	epoch := h.srv.epochOf(h.clock.Now())
	got, err := limiter.CollectUsage(context.Background(), h.rc, epoch, limiter.DefaultUsageShards)
	require.NoError(t, err)
	require.Len(t, got, 1, "one key fits the bound")
	dropped := 43 - got[0].Demand
	require.Contains(t, []int64{8, 35}, dropped, "the other key's attempts were dropped: %+v", got[0])

	_, err = redisio.NewSource(h.rc, limiter.DefaultUsageShards).Usage(context.Background(), epoch)
	require.ErrorIs(t, err, rebalancer.ErrUsageIncomplete, "the epoch is marked incomplete")
	assert.Contains(t, err.Error(), fmt.Sprintf("usage of 1 keys (%d requests)", dropped))

	mfs, err := reg.Gather()
	require.NoError(t, err)
	vals := map[string]float64{}
	for _, mf := range mfs {
		if len(mf.GetMetric()) > 0 {
			vals[mf.GetName()] = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	assert.Equal(t, 1.0, vals["quotient_rlqs_usage_overflow_keys_total"])
	assert.Equal(t, float64(dropped), vals["quotient_rlqs_usage_overflow_requests_total"])
}

// TestIdleBucketAbandoned: a bucket that reports no request for
// IdleTimeout gets an AbandonAction.
func TestIdleBucketAbandoned(t *testing.T) {
	h := startQuota(t)
	a := h.envoy(t, "a", nil)
	a.report(t, "edge", usage(apiBucket, 3, 0, time.Second))
	waitFor(t, "an assignment", func() bool { return a.latest() != nil })
	for el := time.Duration(0); el < h.qcfg.IdleTimeout; el += time.Second {
		h.clock.Advance(time.Second)
		a.report(t, "edge", usage(apiBucket, 0, 0, time.Second))
		h.srv.Tick(context.Background(), h.clock.Now())
	}
	waitFor(t, "an abandon action", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, act := range a.actions {
			if act.GetAbandonAction() != nil {
				assert.Equal(t, apiBucket, act.GetBucketId().GetBucket())
				return true
			}
		}
		return false
	})
}

// TestShutdownSendsTTLZero: Shutdown expires every assignment at once and
// ends the streams with OK.
func TestShutdownSendsTTLZero(t *testing.T) {
	h := startQuota(t)
	a, b := h.envoy(t, "a", nil), h.envoy(t, "b", nil)
	a.report(t, "edge", usage(apiBucket, 3, 0, time.Second))
	b.report(t, "edge", usage(map[string]string{"tenant": "t1", "route": "r"}, 3, 0, time.Second))
	waitFor(t, "assignments", func() bool { return a.latest() != nil && b.latest() != nil })
	require.NoError(t, h.srv.Shutdown(context.Background()))
	for _, e := range []*envoy{a, b} {
		e.waitEnd(t)
		qa := e.latest().GetQuotaAssignmentAction()
		require.NotNil(t, qa, e.name)
		assert.Equal(t, time.Duration(0), qa.GetAssignmentTimeToLive().AsDuration(), e.name)
		require.NotNil(t, qa.GetAssignmentTimeToLive(), "TTL 0 is set, not absent (absent means no expiry)")
		assert.True(t, errors.Is(e.ended, io.EOF), "%s ended with %v", e.name, e.ended)
	}
}

// TestMalformedReports: every malformed message ends its stream with a
// status naming the problem, and changes nothing: no assignment, no
// usage.
func TestMalformedReports(t *testing.T) {
	h := startQuota(t)
	good := usage(apiBucket, 5, 0, time.Second)
	for _, tc := range []struct {
		name   string
		domain string
		us     []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
		code   codes.Code
		msg    string
	}{
		{"missing domain", "", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good}, codes.InvalidArgument, "domain is empty"},
		{"unknown bucket", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good, usage(map[string]string{"path": "/other"}, 1, 0, time.Second)}, codes.NotFound, "bucket_quota_usages[1]: bucket edge/path=%2Fother matches no rate limit rule"},
		{"unknown domain", "nope", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good}, codes.NotFound, "matches no rate limit rule of domain \"nope\""},
		{"huge count", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good, usage(apiBucket, MaxReportCount+1, 0, time.Second)}, codes.InvalidArgument, "num_requests_allowed 1000000001 is more than 1000000000"},
		{"negative elapsed", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(apiBucket, 1, 0, -time.Second)}, codes.InvalidArgument, "time_elapsed"},
		{"empty bucket id", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(nil, 1, 0, time.Second)}, codes.InvalidArgument, "bucket_quota_usages[0].bucket_id is empty"},
		{"duplicate bucket", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good, good}, codes.InvalidArgument, "appears twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := h.envoy(t, tc.name, nil)
			e.report(t, tc.domain, tc.us...)
			e.waitEnd(t)
			st, ok := status.FromError(e.ended)
			require.True(t, ok, "%v", e.ended)
			assert.Equal(t, tc.code, st.Code(), st.Message())
			assert.Contains(t, st.Message(), tc.msg)
			assert.Equal(t, 0, e.count(), "no assignment")
		})
	}
	assert.Equal(t, 5.0, metricValue(t, h.srv.mReports.WithLabelValues("invalid")))
	assert.Equal(t, 2.0, metricValue(t, h.srv.mReports.WithLabelValues("unknown_bucket")))
	assert.Equal(t, 0.0, metricValue(t, h.srv.mReports.WithLabelValues("ok")))
	waitFor(t, "every stream counted closed", func() bool { return metricValue(t, h.srv.mStreams) == 0 })
	h.srv.Tick(context.Background(), h.clock.Now())
	got, err := limiter.CollectUsage(context.Background(), h.rc, h.srv.epochOf(h.clock.Now()), limiter.DefaultUsageShards)
	require.NoError(t, err)
	assert.Empty(t, got, "no usage from malformed reports")
	h.srv.mu.Lock()
	defer h.srv.mu.Unlock()
	assert.False(t, h.srv.core.Known(BucketKey(rls.BucketKey("edge", apiBucket))), "no bucket from malformed reports")
}

// TestBucketKeyOrder: one bucket whatever order its entries come in, and
// the configuration's nesting (tenant, then route) found from a map.
func TestBucketKeyOrder(t *testing.T) {
	h := startQuota(t)
	id1 := map[string]string{}
	id1["tenant"], id1["route"] = "t1", "r"
	id2 := map[string]string{}
	id2["route"], id2["tenant"] = "r", "t1"
	a, b := h.envoy(t, "a", nil), h.envoy(t, "b", nil)
	a.report(t, "edge", usage(id1, 100, 0, time.Second))
	waitFor(t, "a's assignment", func() bool { return a.latest() != nil })
	b.report(t, "edge", usage(id2, 100, 0, time.Second))
	waitFor(t, "b's assignment", func() bool { return b.latest() != nil })
	h.srv.mu.Lock()
	n := len(h.srv.info)
	h.srv.mu.Unlock()
	assert.Equal(t, 1, n, "one bucket")
	// 600/minute = 10/s, split between two Envoys of equal demand once
	// a's first (whole) assignment ran out.
	h.clock.Advance(h.qcfg.TTL + h.qcfg.InFlight)
	a.report(t, "edge", usage(id1, 100, 0, time.Second))
	b.report(t, "edge", usage(id2, 100, 0, time.Second))
	h.srv.Tick(context.Background(), h.clock.Now())
	waitFor(t, "an even split", func() bool {
		return rateOf(a.latest()).RateMilli == 5000 && rateOf(b.latest()).RateMilli == 5000
	})
	bk := mustBucket(t, h.cfg, id2)
	assert.Equal(t, []rls.Entry{{Key: "tenant", Value: "t1"}, {Key: "route", Value: "r"}}, bk.Entries)
}

// TestShareOfReplicasAndRegions: a region-scope limit (an envoyproxy
// rule) is the region's whole, as quotient rls decides it; a global
// policy's share is 1/Regions of its limit by default and its share record
// when there is one; each of Replicas servers takes 1/Replicas of it.
func TestShareOfReplicasAndRegions(t *testing.T) {
	cfg, err := rls.Parse([]rls.File{{Name: "edge.yaml", Data: []byte(testConfig)}}, rls.ParseOptions{})
	require.NoError(t, err)
	srv, err := NewServer(ServerConfig{Config: func() *rls.Config { return cfg }, Shares: &RedisShares{}, Regions: func() int { return 3 }, Replicas: 2})
	require.NoError(t, err)
	inf := &bucketInfo{}
	srv.setLimit(inf, mustBucket(t, cfg, apiBucket).Rule)
	assert.Equal(t, Amount{RateMilli: 100_000, BurstMilli: 100_000}, inf.limit)
	assert.False(t, inf.global)
	assert.Equal(t, Amount{RateMilli: 50_000, BurstMilli: 50_000}, srv.shareOf(inf, ShareRecord{}), "the region's whole limit, over 2 replicas")
	assert.Equal(t, Amount{RateMilli: 50_000, BurstMilli: 50_000}, srv.shareOf(inf, ShareRecord{Found: true, Amount: Amount{60_000, 10_000}}), "no share record applies to a region limit")

	inf.global = true
	assert.Equal(t, Amount{RateMilli: 16_666, BurstMilli: 16_666}, srv.shareOf(inf, ShareRecord{}))
	assert.Equal(t, Amount{RateMilli: 30_000, BurstMilli: 5_000}, srv.shareOf(inf, ShareRecord{Found: true, Amount: Amount{60_000, 10_000}}))
}

// TestStreamCutKeepsReservation: an Envoy whose stream is cut without a
// goodbye keeps its assignment reserved until it runs out (Envoy keeps
// enforcing it); only then does the other Envoy get the whole share.
func TestStreamCutKeepsReservation(t *testing.T) {
	h := startQuota(t)
	a, b := h.envoy(t, "a", nil), h.envoy(t, "b", nil)
	a.report(t, "edge", usage(apiBucket, 100, 0, time.Second))
	waitFor(t, "a's assignment", func() bool { return a.latest() != nil })
	b.report(t, "edge", usage(apiBucket, 100, 0, time.Second))
	waitFor(t, "b's assignment", func() bool { return b.latest() != nil })
	h.clock.Advance(h.qcfg.TTL + h.qcfg.InFlight) // a's whole-share grant runs out
	h.srv.Tick(context.Background(), h.clock.Now())
	waitFor(t, "an even split", func() bool {
		return rateOf(a.latest()).RateMilli == 50_000 && rateOf(b.latest()).RateMilli == 50_000
	})
	a.cancel() // the stream is cut
	a.waitEnd(t)
	waitFor(t, "the server to see the cut", func() bool {
		h.srv.mu.Lock()
		defer h.srv.mu.Unlock()
		return len(h.srv.streams) == 1
	})
	h.clock.Advance(time.Second)
	b.report(t, "edge", usage(apiBucket, 100, 0, time.Second))
	h.srv.Tick(context.Background(), h.clock.Now())
	n := b.count()
	h.srv.mu.Lock()
	reserved := h.srv.core.Reserved(h.clock.Now(), BucketKey(rls.BucketKey("edge", apiBucket)))
	h.srv.mu.Unlock()
	assert.Equal(t, int64(100_000), reserved.RateMilli, "a's 50/s is still reserved")
	assert.Equal(t, int64(50_000), rateOf(b.latest()).RateMilli, "b cannot have a's part yet")
	// a's grant runs out TTL + InFlight after it was sent.
	h.clock.Advance(h.qcfg.TTL + h.qcfg.InFlight)
	b.report(t, "edge", usage(apiBucket, 100, 0, time.Second))
	h.srv.Tick(context.Background(), h.clock.Now())
	waitFor(t, "b to get the whole share", func() bool { return b.count() > n && rateOf(b.latest()).RateMilli == 100_000 })
}

// TestWarmUpAfterRestart: a new server grants nothing for TTL + InFlight,
// so the assignments a crashed predecessor made have run out first; then
// one Tick sends them all.
func TestWarmUpAfterRestart(t *testing.T) {
	h := startQuotaWarm(t, false)
	a := h.envoy(t, "a", nil)
	a.report(t, "edge", usage(apiBucket, 5, 0, time.Second))
	h.srv.Tick(context.Background(), h.clock.Advance(h.qcfg.TTL+h.qcfg.InFlight-time.Millisecond))
	// Prove the report was handled (its usage is counted) before checking
	// that nothing was sent.
	waitFor(t, "the report to be handled", func() bool {
		h.srv.mu.Lock()
		defer h.srv.mu.Unlock()
		return h.srv.core.Known(BucketKey(rls.BucketKey("edge", apiBucket)))
	})
	h.srv.Tick(context.Background(), h.clock.Now())
	assert.Equal(t, 0, a.count(), "no assignment during the warm-up")
	h.srv.Tick(context.Background(), h.clock.Advance(time.Millisecond))
	waitFor(t, "the first assignment after the warm-up", func() bool { return a.latest() != nil })
	assert.Equal(t, int64(100_000), rateOf(a.latest()).RateMilli)
}

// metricValue reads a counter or gauge.
func metricValue(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// A rule naming a Quotient policy takes the policy's limit: a global token
// bucket's rate and burst (of which the region's default share is 1/n),
// a window's limit per window; a shadow policy is ALLOW_ALL; a policy not
// in the set is DENY_ALL.
func TestPolicyRuleLimit(t *testing.T) {
	cfg, err := rls.Parse([]rls.File{{Name: "p.yaml", Data: []byte(`
domain: edge
descriptors:
  - key: tenant
    rate_limit: {policy: tenant-global}
  - key: user
    rate_limit: {policy: user-daily}
  - key: shadow
    rate_limit: {policy: shadowed}
  - key: gone
    rate_limit: {policy: missing}
`)}}, rls.ParseOptions{})
	require.NoError(t, err)
	pols, err := limiter.ParsePolicies([]byte(`[
	  {"id": "tenant-global", "subject": "api_key", "algorithm": "token_bucket", "rate_per_sec": 30, "burst": 60, "scope": "global"},
	  {"id": "user-daily", "subject": "api_key", "algorithm": "fixed_window", "limit": 8640, "window_s": 86400},
	  {"id": "shadowed", "subject": "api_key", "algorithm": "token_bucket", "rate_per_sec": 5, "mode": "shadow"}
	]`))
	require.NoError(t, err)
	byID := map[string]*limiter.Policy{}
	for _, p := range pols {
		byID[p.ID] = p
	}
	srv, err := NewServer(ServerConfig{Config: func() *rls.Config { return cfg }, Shares: &RedisShares{}, Regions: func() int { return 3 },
		Policy: func(id string) *limiter.Policy { return byID[id] }})
	require.NoError(t, err)
	for _, tc := range []struct {
		key       string
		policy    string
		limit     Amount
		unlimited bool
	}{
		{"tenant", "tenant-global", Amount{30_000, 60_000}, false},
		{"user", "user-daily", Amount{100, 8_640_000}, false},
		{"shadow", "shadowed", Amount{5_000, 5_000}, true},
		{"gone", "", Amount{}, false},
	} {
		b, ok := cfg.LookupBucket("edge", map[string]string{tc.key: "x"})
		require.True(t, ok, tc.key)
		inf := &bucketInfo{}
		srv.setLimit(inf, b.Rule)
		assert.Equal(t, tc.policy, inf.policyID, tc.key)
		assert.Equal(t, tc.limit, inf.limit, tc.key)
		assert.Equal(t, tc.unlimited, inf.unlimited, tc.key)
	}
	inf := &bucketInfo{}
	b, _ := cfg.LookupBucket("edge", map[string]string{"tenant": "x"})
	srv.setLimit(inf, b.Rule)
	assert.Equal(t, Amount{10_000, 20_000}, srv.shareOf(inf, ShareRecord{}), "the default share: a third")
}
