package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/rls"
)

// noShares is a ShareSource without records (the tests' buckets are
// region limits, which read none).
type noShares struct{}

func (noShares) ReadShares(_ context.Context, qs []ShareQuery) ([]ShareRecord, error) {
	return make([]ShareRecord, len(qs)), nil
}

// TestAllocate: the part is the max-min fair target cut to what the
// others' claims leave; the claim covers the ceiling only while the
// replica's own record is live.
func TestAllocate(t *testing.T) {
	share := Amount{100_000, 100_000}
	other := func(name string, d int64, c Amount) ReplicaClaim {
		return ReplicaClaim{Replica: name, DemandMilli: d, Claim: c}
	}
	own := &ReplicaClaim{Replica: "a"}
	for _, tc := range []struct {
		name        string
		demand      int64
		ceiling     Amount
		own         *ReplicaClaim
		others      []ReplicaClaim
		part, claim Amount
	}{
		{"alone", 150_000, Amount{}, nil, nil, share, share},
		{"idle other, no claim", 150_000, Amount{}, own, []ReplicaClaim{other("b", 0, Amount{})}, Amount{100_000, 99_000}, Amount{100_000, 99_000}},
		{"busy other holding all", 150_000, Amount{}, own, []ReplicaClaim{other("b", 150_000, share)}, Amount{}, Amount{}},
		{"busy other holding half", 150_000, Amount{}, own, []ReplicaClaim{other("b", 150_000, Amount{50_000, 50_000})}, Amount{50_000, 50_000}, Amount{50_000, 50_000}},
		{"lowering keeps the ceiling claimed", 10_000, share, own, []ReplicaClaim{other("b", 150_000, Amount{})}, Amount{10_000, 10_800}, share},
		{"expired own record: ceiling not claimed", 10_000, share, nil, []ReplicaClaim{other("b", 150_000, Amount{})}, Amount{10_000, 10_800}, Amount{10_000, 10_800}},
		{"fair split of spare", 20_000, Amount{}, own, []ReplicaClaim{other("b", 20_000, Amount{})}, Amount{50_000, 50_000}, Amount{50_000, 50_000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			part, claim := Allocate(share, "a", tc.demand, tc.ceiling, tc.own, tc.others)
			assert.Equal(t, tc.part, part, "part")
			assert.Equal(t, tc.claim, claim, "claim")
		})
	}
}

// replicaRig is a region of RLQS replicas in one process on a fake
// clock, its Envoys on quota.Conn streams, every assignment delivered at
// once and recorded in a ledger by physical Envoy (an Envoy that moves to
// another replica is the same Envoy, holding what it was given before).
type replicaRig struct {
	t      *testing.T
	cfg    *rls.Config
	qcfg   Config
	clock  *fakeClock
	table  *ClaimTable
	srvs   []*Server       // nil: killed
	cut    map[string]bool // replicas that cannot reach the store
	l      *ledger
	conns  map[EnvoyID]*Conn // by physical Envoy
	on     map[EnvoyID]int   // replica of each connected Envoy
	nextID int
}

func newReplicaRig(t *testing.T, qcfg Config, n int) *replicaRig {
	cfg, err := rls.Parse([]rls.File{{Name: "edge.yaml", Data: []byte(testConfig)}}, rls.ParseOptions{})
	require.NoError(t, err)
	clock := &fakeClock{now: t0}
	r := &replicaRig{t: t, cfg: cfg, qcfg: qcfg, clock: clock, table: &ClaimTable{Clock: clock}, l: newLedger(qcfg),
		conns: map[EnvoyID]*Conn{}, on: map[EnvoyID]int{}, cut: map[string]bool{}}
	for range n {
		r.srvs = append(r.srvs, r.start(true))
	}
	return r
}

func (r *replicaRig) start(skipWarmUp bool) *Server {
	r.nextID++
	name := fmt.Sprintf("replica-%d", r.nextID)
	srv, err := NewServer(ServerConfig{
		Config: func() *rls.Config { return r.cfg }, Shares: noShares{}, Quota: r.qcfg, Clock: r.clock,
		Claims: cutStore{r.table.Replica(name), func() bool { return r.cut[name] }}, SkipWarmUp: skipWarmUp,
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(r.t, err)
	return srv
}

// cutStore fails every call while cut reports true (a replica that
// cannot reach the region's Redis).
type cutStore struct {
	ReplicaStore
	cut func() bool
}

func (c cutStore) Claim(ctx context.Context, k BucketKey, req ClaimRequest) (Amount, error) {
	if c.cut() {
		return Amount{}, errors.New("test: the store is unreachable")
	}
	return c.ReplicaStore.Claim(ctx, k, req)
}

// connect opens Envoy e's stream on replica j.
func (r *replicaRig) connect(e EnvoyID, j int) {
	c, err := r.srvs[j].Open()
	require.NoError(r.t, err)
	r.conns[e], r.on[e] = c, j
}

func (r *replicaRig) report(e EnvoyID, allowed, denied uint64, elapsed time.Duration) {
	require.NoError(r.t, r.conns[e].Receive(context.Background(), &rlqsv3.RateLimitQuotaUsageReports{
		Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(apiBucket, allowed, denied, elapsed)}}))
	r.drain()
}

// drain delivers every pending response and records its assignments.
func (r *replicaRig) drain() {
	now := r.clock.Now()
	for e, c := range r.conns {
		resp := c.Take()
		for _, ba := range resp.GetBucketAction() {
			if qa := ba.GetQuotaAssignmentAction(); qa != nil {
				amt, unlimited := AmountOf(qa.GetRateLimitStrategy())
				require.False(r.t, unlimited)
				r.l.add(now, e, amt, qa.GetAssignmentTimeToLive().AsDuration())
			}
		}
	}
}

func (r *replicaRig) tick() {
	for _, s := range r.srvs {
		if s != nil {
			s.Tick(context.Background(), r.clock.Now())
		}
	}
	r.drain()
}

// kill ends replica j without a goodbye: it sends nothing more and its
// Envoys' streams are cut (they keep enforcing what they hold).
func (r *replicaRig) kill(j int) {
	for e, on := range r.on {
		if on == j {
			delete(r.conns, e)
			delete(r.on, e)
		}
	}
	r.srvs[j] = nil
}

// TestReplicasInvariantRandom drives two or three replicas sharing their
// claims with random reports, demand moving between Envoys on different
// replicas, Envoys moving between replicas, replicas killed, restarted
// and cut from the store (they go on serving their Envoys) and time
// passing, and checks after every event, from the ledger of
// every assignment the Envoys received, that the sum over all replicas'
// Envoys of the rates in force and the bursts held stays within the
// region's share (a region limit, so the share never changes).
func TestReplicasInvariantRandom(t *testing.T) {
	for seed := uint64(1); seed <= 60; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runReplicasInvariant(t, seed) })
	}
}

func runReplicasInvariant(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 11))
	qcfg := DefaultConfig()
	qcfg.TTL = time.Duration(1+rng.IntN(4)) * time.Second
	qcfg.InFlight = time.Duration(rng.IntN(1000)) * time.Millisecond
	r := newReplicaRig(t, qcfg, 2+rng.IntN(2))
	share := Amount{100_000, 100_000}
	const envoys = 6
	heavy := EnvoyID(0)
	for e := EnvoyID(0); e < envoys; e++ {
		r.connect(e, int(e)%len(r.srvs))
		r.report(e, 1, 0, 0)
	}
	alive := func() []int {
		var js []int
		for j, s := range r.srvs {
			if s != nil {
				js = append(js, j)
			}
		}
		return js
	}
	var maxSeen Amount
	for step := range 600 {
		var event string
		switch x := rng.IntN(100); {
		case x < 45:
			event = "report"
			e := EnvoyID(rng.IntN(envoys))
			if r.conns[e] == nil {
				break
			}
			d := uint64(3 + rng.IntN(5))
			if e == heavy {
				d = uint64(150 + rng.IntN(50))
			}
			r.report(e, d*8/10, d*2/10, time.Second)
		case x < 50:
			event = "shift"
			heavy = EnvoyID(rng.IntN(envoys))
		case x < 55:
			event = "move"
			e := EnvoyID(rng.IntN(envoys))
			if c := r.conns[e]; c != nil {
				c.Close()
			}
			js := alive()
			r.connect(e, js[rng.IntN(len(js))])
			r.report(e, 1, 0, 0)
		case x < 58 && len(alive()) > 1:
			event = "kill"
			js := alive()
			r.kill(js[rng.IntN(len(js))])
		case x < 61:
			event = "restart"
			for j, s := range r.srvs {
				if s == nil {
					r.srvs[j] = r.start(false)
					break
				}
			}
		case x < 64:
			event = "cut"
			name := fmt.Sprintf("replica-%d", 1+rng.IntN(r.nextID))
			r.cut[name] = !r.cut[name]
		case x < 80:
			event = "tick"
			r.tick()
		default:
			event = "time"
			r.clock.Advance(time.Duration(100+rng.IntN(1500)) * time.Millisecond)
			r.tick()
		}
		// Envoys whose replica died reconnect when their report is due.
		for e := EnvoyID(0); e < envoys; e++ {
			if r.conns[e] == nil && rng.IntN(4) == 0 {
				js := alive()
				r.connect(e, js[rng.IntN(len(js))])
				r.report(e, 1, 0, 0)
			}
		}
		now := r.clock.Now()
		total := r.l.total(now)
		maxSeen = maxAmount(maxSeen, total)
		require.True(t, total.fits(share), "seed %d step %d (%s): the Envoys of all replicas hold %s, above the share %s",
			seed, step, event, fmtAmount(total), fmtAmount(share))
	}
	// The run granted something (the check above is not vacuous).
	require.Positive(t, maxSeen.RateMilli, "seed %d: nothing was ever granted", seed)
}

// TestAllocateDamping: a replica keeps its part while nobody needs a
// change (its demand within the part, the others' within what it
// leaves, 10 % over), and moves it when either needs it; a small raise is
// not worth a change of every assignment.
func TestAllocateDamping(t *testing.T) {
	share := Amount{100_000, 100_000}
	own := &ReplicaClaim{Replica: "a"}
	cur := Amount{60_000, 60_000}
	req := func(demand int64) ClaimRequest {
		return ClaimRequest{DemandMilli: demand, Part: cur, Ceiling: cur, ThresholdPermille: 100}
	}
	other := func(d int64) []ReplicaClaim {
		return []ReplicaClaim{{Replica: "b", DemandMilli: d, Claim: Amount{40_000, 40_000}}}
	}
	// Demands 30 and 30: the target is 50/50, but both are met: kept.
	part, _ := allocate(share, req(30_000), own, other(30_000))
	assert.Equal(t, cur, part, "both demands met: kept")
	// b needs more than the 40 a leaves (10 % over): a lowers.
	part, _ = allocate(share, req(30_000), own, other(45_000))
	assert.Less(t, part.RateMilli, cur.RateMilli, "b needs a's spare")
	// a needs more, but the target is within a quarter of the threshold.
	part, _ = allocate(share, req(61_000), own, []ReplicaClaim{{Replica: "b", DemandMilli: 0, Claim: Amount{}}})
	assert.Greater(t, part.RateMilli, cur.RateMilli, "a needs more and the room is free: raised")
	part, _ = allocate(share, req(61_000), own, []ReplicaClaim{{Replica: "b", DemandMilli: 39_000, Claim: Amount{38_700, 38_700}}})
	assert.Equal(t, cur, part, "a raise of 1.3 % is not worth new assignments")
	// Without a live record the part is never kept.
	part, _ = allocate(share, req(30_000), nil, other(30_000))
	assert.Equal(t, int64(50_000), part.RateMilli)
}

// TestClaimSlackMustExceedShareRefresh: a lease that could lapse between
// two renewals is refused, naming both fields.
func TestClaimSlackMustExceedShareRefresh(t *testing.T) {
	cfg, err := rls.Parse([]rls.File{{Name: "edge.yaml", Data: []byte(testConfig)}}, rls.ParseOptions{})
	require.NoError(t, err)
	table := &ClaimTable{Clock: &fakeClock{now: t0}}
	_, err = NewServer(ServerConfig{Config: func() *rls.Config { return cfg }, Shares: noShares{}, Claims: table.Replica("a"),
		ShareRefresh: 2 * time.Second, ClaimSlack: time.Second})
	require.ErrorContains(t, err, "ClaimSlack (1s) must exceed ShareRefresh (2s)")
	_, err = NewServer(ServerConfig{Config: func() *rls.Config { return cfg }, Shares: noShares{}, Claims: table.Replica("a"),
		ShareRefresh: 2 * time.Second})
	require.NoError(t, err, "the default slack is 2 ShareRefresh + RedisTimeout")
	_, err = (&RedisClaims{}).Claim(context.Background(), "b", ClaimRequest{})
	require.ErrorContains(t, err, "RedisClaims.Replica is empty")
}
