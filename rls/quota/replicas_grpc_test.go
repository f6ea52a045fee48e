package quota

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/rls"
)

// grpcReplica is one `quotient rls` RLQS replica of the test region: a
// Server on a real gRPC listener, claiming through the region's
// redis-server.
type grpcReplica struct {
	h    *harness
	gs   *grpc.Server
	reg  *prometheus.Registry
	dead bool
}

// startReplicas starts n replicas on one redis-server and one fake clock
// (also the claims' store clock, so that leases run out as the test
// moves time).
func startReplicas(t *testing.T, n int) ([]*grpcReplica, *fakeClock) {
	rc := redistest.StartServer(t).Client()
	cfg, err := rls.Parse([]rls.File{{Name: "edge.yaml", Data: []byte(testConfig)}}, rls.ParseOptions{})
	require.NoError(t, err)
	clock := &fakeClock{now: time.Now().Truncate(10 * time.Second)}
	var out []*grpcReplica
	for i := range n {
		reg := prometheus.NewRegistry()
		srv, err := NewServer(ServerConfig{
			Config: func() *rls.Config { return cfg }, Shares: &RedisShares{Client: rc}, Quota: DefaultConfig(), Clock: clock,
			Claims:     &RedisClaims{Client: rc, Replica: fmt.Sprintf("replica-%d", i), Clock: clock},
			SkipWarmUp: true, Metrics: reg, Logger: slog.New(slog.DiscardHandler),
		})
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
		out = append(out, &grpcReplica{h: &harness{srv: srv, rc: rc, clock: clock, client: rlqsv3.NewRateLimitQuotaServiceClient(conn), cfg: cfg, qcfg: DefaultConfig()}, gs: gs, reg: reg})
	}
	return out, clock
}

// counter sums a counter family of the replica's registry.
func (r *grpcReplica) counter(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	require.NoError(t, err)
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

// idle reports whether the replica has nothing left to send.
func (r *grpcReplica) idle() bool {
	s := r.h.srv
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ob := range s.streams {
		ob.mu.Lock()
		n := len(ob.pending)
		ob.mu.Unlock()
		if n > 0 {
			return false
		}
	}
	return true
}

// replicaRegion is the test's view: its replicas, its Envoys by name
// (each on one replica), the receipts that check the invariant at every
// assignment an Envoy receives.
type replicaRegion struct {
	t      *testing.T
	reps   []*grpcReplica
	clock  *fakeClock
	rec    *receipts
	envoys map[string]*envoy
	rep    map[string]int
	sent   map[string]int // reports sent per Envoy on its current replica
	checks atomic.Int64   // assignments received (each checked)
}

func (g *replicaRegion) connect(name string, j int) {
	g.envoys[name] = g.reps[j].h.envoy(g.t, name, func(e *envoy, a *rlqsv3.RateLimitQuotaResponse_BucketAction) {
		if a.GetQuotaAssignmentAction() != nil {
			g.checks.Add(1)
		}
		g.rec.on(e, a)
	})
	g.rep[name] = j
}

// report sends one report per Envoy (demand per second over one
// second), waits until every live replica handled them, ticks every live
// replica and waits until what they sent has been received.
func (g *replicaRegion) step(demand map[string]uint64, dt time.Duration) {
	t := g.t
	t.Helper()
	g.clock.Advance(dt)
	want := 0.0
	for _, name := range sortedNames(g.envoys) {
		d := demand[name]
		g.envoys[name].report(t, "edge", usage(apiBucket, d*uint64(dt.Milliseconds())/1000, 0, dt))
		g.sent[name]++
	}
	for _, n := range g.sent {
		want += float64(n)
	}
	waitFor(t, "every report handled", func() bool {
		var got float64
		for _, r := range g.reps {
			if !r.dead {
				got += r.counter(t, "quotient_rlqs_reports_total")
			}
		}
		return got >= want
	})
	for _, r := range g.reps {
		if !r.dead {
			r.h.srv.Tick(context.Background(), g.clock.Now())
		}
	}
	g.quiesce()
}

// quiesce waits until every live replica sent all it decided and every
// Envoy received it, so that the clock does not move while an assignment
// travels (the receipts date it by the clock).
func (g *replicaRegion) quiesce() {
	t := g.t
	t.Helper()
	waitFor(t, "every assignment received", func() bool {
		var sent float64
		for _, r := range g.reps {
			if !r.dead {
				if !r.idle() {
					return false
				}
				sent += r.counter(t, "quotient_rlqs_bucket_actions_total")
			}
		}
		var got float64
		for name, e := range g.envoys {
			if !g.reps[g.rep[name]].dead {
				got += float64(e.count())
			}
		}
		return got >= sent
	})
}

func sortedNames(m map[string]*envoy) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// TestReplicasLendThroughRedis: two and three `quotient rls` replicas of
// one region on a real redis-server, Envoys on real gRPC streams, one
// Envoy per replica. All demand (150/s on a 100/s region limit) sits on
// the Envoy of replica 0, then moves to the Envoy of replica 1: the busy
// replica gets the share an idle one does not use (the static 1/N split
// gave it 50/s or 33/s), and after the shift the other replica's Envoy
// gets it. Replica 1 is then killed mid-stream; its Envoy reconnects to
// another replica and gets the dead replica's part only once its claim
// has run out. At every assignment any Envoy receives, the sum over all
// Envoys of the rates in force and the bursts held stays within the
// region's share.
func TestReplicasLendThroughRedis(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d replicas", n), func(t *testing.T) {
			reps, clock := startReplicas(t, n)
			share := Amount{100_000, 100_000}
			g := &replicaRegion{t: t, reps: reps, clock: clock, envoys: map[string]*envoy{}, rep: map[string]int{}, sent: map[string]int{},
				rec: &receipts{clock: clock, by: map[string][]sentGrant{}, share: func() Amount { return share }}}
			names := []string{"a", "b", "c"}[:n]
			for j, name := range names {
				g.connect(name, j)
			}
			qcfg := DefaultConfig()
			demand := map[string]uint64{"a": 150, "b": 5, "c": 5}
			step := 500 * time.Millisecond
			// Fair over the replicas' demand: the idle ones 5/s each, the
			// busy one the rest.
			busyFair := int64(100_000 - 5_000*(n-1))
			held := func(name string) int64 { return rateOf(g.envoys[name].latest()).RateMilli }
			var tookA time.Duration
			for el := time.Duration(0); el < 30*time.Second; el += step {
				g.step(demand, step)
				if tookA == 0 && held("a") >= busyFair*9/10 {
					tookA = el + step
				}
			}
			require.NotZero(t, tookA, "a never held 90 %% of its fair part; a holds %d milli/s", held("a"))
			assert.Greater(t, held("a"), share.RateMilli/int64(n), "replica 0 lends nothing: a holds no more than the static 1/N")
			t.Logf("%d replicas: a (replica 0) held 90 %% of its fair %d milli/s %v after its first report", n, busyFair, tookA)

			// The shift: b (replica 1) gets the demand.
			demand["a"], demand["b"] = 5, 150
			var tookB time.Duration
			for el := time.Duration(0); el < 30*time.Second && tookB == 0; el += step {
				g.step(demand, step)
				if held("b") >= busyFair*9/10 {
					tookB = el + step
				}
			}
			require.NotZero(t, tookB, "b never held 90 %% of its fair part after the shift; b holds %d milli/s", held("b"))
			t.Logf("%d replicas: shift from replica 0 to replica 1: b held 90 %% of its fair %d milli/s %v after the shift", n, busyFair, tookB)

			// Replica 1 dies mid-stream, without a goodbye; b reconnects
			// to replica 0.
			claimsBefore := claimFields(t, reps[0].h, apiBucket)
			require.Len(t, claimsBefore, n, "every replica has a claim record")
			reps[1].dead = true
			reps[1].gs.Stop()
			g.envoys["b"].waitEnd(t)
			for name := range g.sent {
				if g.rep[name] == 1 {
					g.sent[name] = 0
				}
			}
			g.connect("b", 0)
			died := clock.Now()
			lease := qcfg.TTL + qcfg.InFlight + 3*time.Second // the default ClaimSlack: 2 ShareRefresh + RedisTimeout
			var tookDead time.Duration
			for el := time.Duration(0); el < 30*time.Second && tookDead == 0; el += step {
				g.step(demand, step)
				if held("b") >= busyFair*9/10 {
					tookDead = clock.Now().Sub(died)
				}
				if clock.Now().Sub(died) < lease-time.Second {
					// The dead replica's claim is live: b cannot have it.
					assert.Less(t, held("b")+held("a"), share.RateMilli-int64(40_000), "at %v after the death, a and b hold what the dead replica claimed", clock.Now().Sub(died))
				}
			}
			require.NotZero(t, tookDead, "b never held its fair part after its replica died; b holds %d milli/s", held("b"))
			t.Logf("%d replicas: replica 1 killed: b (reconnected to replica 0) held 90 %% of its fair part %v after the death (claim lease %v)", n, tookDead, lease)
			assert.NotContains(t, claimFields(t, reps[0].h, apiBucket), "replica-1", "the dead replica's record was dropped")

			g.rec.mu.Lock()
			defer g.rec.mu.Unlock()
			assert.Empty(t, g.rec.bad, "the Envoys' assignments summed above the share")
			assert.Greater(t, g.checks.Load(), int64(10*n), "the invariant was checked on every assignment received")
			t.Logf("%d replicas: %d assignments received and checked", n, g.checks.Load())
		})
	}
}

// claimFields is the replicas named in the bucket's claims hash.
func claimFields(t *testing.T, h *harness, id map[string]string) []string {
	t.Helper()
	m, err := h.rc.HGetAll(context.Background(), ClaimKeyPrefix+rls.BucketKey("edge", id)).Result()
	require.NoError(t, err)
	var out []string
	for k, v := range m {
		require.Len(t, strings.Fields(v), 4, "record %q of %s", v, k)
		out = append(out, k)
	}
	return out
}

// TestRedisClaimsOnCluster: claims on a three-node cluster (one hash per
// bucket, one slot): two replicas split the share by demand, a lowering
// is claimed at the ceiling until the replica's Envoys hold less, an
// expired record is dropped, and a record that does not decode counts as
// the whole share (named in the error).
func TestRedisClaimsOnCluster(t *testing.T) {
	rc := redistest.StartCluster(t).Client()
	clock := &fakeClock{now: time.Now().Truncate(time.Second)}
	ctx := context.Background()
	a := &RedisClaims{Client: rc, Replica: "a", Clock: clock}
	b := &RedisClaims{Client: rc, Replica: "b", Clock: clock}
	k := BucketKey(rls.BucketKey("edge", apiBucket))
	share := Amount{100_000, 100_000}
	lease := 9 * time.Second
	part, err := a.Claim(ctx, k, ClaimRequest{Share: share, DemandMilli: 150_000, Lease: lease})
	require.NoError(t, err)
	assert.Equal(t, share, part, "alone, a gets the share")
	part, err = b.Claim(ctx, k, ClaimRequest{Share: share, DemandMilli: 150_000, Lease: lease})
	require.NoError(t, err)
	assert.Equal(t, Amount{}, part, "a claims it all")
	// a lowers to its fair half, but its Envoys may still hold the share.
	part, err = a.Claim(ctx, k, ClaimRequest{Share: share, DemandMilli: 150_000, Ceiling: share, Lease: lease})
	require.NoError(t, err)
	assert.Equal(t, Amount{50_000, 50_000}, part)
	part, err = b.Claim(ctx, k, ClaimRequest{Share: share, DemandMilli: 150_000, Lease: lease})
	require.NoError(t, err)
	assert.Equal(t, Amount{}, part, "a's ceiling is still claimed")
	// Its Envoys' larger grants ran out: a claims its part only.
	part, err = a.Claim(ctx, k, ClaimRequest{Share: share, DemandMilli: 150_000, Ceiling: Amount{50_000, 50_000}, Lease: lease})
	require.NoError(t, err)
	assert.Equal(t, Amount{50_000, 50_000}, part)
	part, err = b.Claim(ctx, k, ClaimRequest{Share: share, DemandMilli: 150_000, Lease: lease})
	require.NoError(t, err)
	assert.Equal(t, Amount{50_000, 50_000}, part)
	// a dies: its record runs out, b gets the share.
	clock.Advance(lease)
	part, err = b.Claim(ctx, k, ClaimRequest{Share: share, DemandMilli: 150_000, Ceiling: Amount{50_000, 50_000}, Lease: lease})
	require.NoError(t, err)
	assert.Equal(t, share, part)
	m, err := rc.HGetAll(ctx, ClaimKeyPrefix+string(k)).Result()
	require.NoError(t, err)
	assert.NotContains(t, m, "a", "the expired record was dropped")
	// A record that does not decode: fail-safe, and named.
	require.NoError(t, rc.HSet(ctx, ClaimKeyPrefix+string(k), "x", "not numbers").Err())
	part, err = b.Claim(ctx, k, ClaimRequest{Share: share, DemandMilli: 150_000, Ceiling: share, Lease: lease})
	require.ErrorContains(t, err, `"not numbers" of x`)
	assert.Equal(t, Amount{}, part)
}
