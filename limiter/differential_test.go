package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// opsPerAlgorithm is the length of each random sequence of the differential
// test, per algorithm and per server kind.
const opsPerAlgorithm = 10_000

// TestDifferential feeds the same random sequences (times, costs, policy
// sets, shares) to the Lua script on real redis-servers (standalone and a
// three-node cluster) and to the in-memory store, and requires identical
// decisions, field for field. Fixed windows run twice: aligned to the
// epoch (window_s) and over calendar months (window "month"), whose
// sequences jump across many month ends, February of leap years included.
func TestDifferential(t *testing.T) {
	if testing.Short() {
		t.Skip("needs redis-server; runs in make test")
	}
	servers := map[string]func(t *testing.T) redis.UniversalClient{
		"standalone": func(t *testing.T) redis.UniversalClient { return redistest.StartServer(t).Client() },
		"cluster":    func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t).Client() },
	}
	cases := []struct {
		name    string
		algo    Algorithm
		monthly bool
	}{
		{string(TokenBucket), TokenBucket, false},
		{string(LeakyBucket), LeakyBucket, false},
		{string(FixedWindow), FixedWindow, false},
		{string(SlidingWindowLog), SlidingWindowLog, false},
		{string(SlidingWindowCounter), SlidingWindowCounter, false},
		{"fixed_window_month", FixedWindow, true},
	}
	for name, start := range servers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			client := start(t)
			for i, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					rs := NewRedisStore(client)
					rs.decideAtGivenTime()
					ms := NewMemoryStore()
					ms.keepExpired = true
					differential(t, rand.New(rand.NewPCG(uint64(i)+1, 42)), c.algo, c.monthly, rs, ms)
				})
			}
		})
	}
}

// randomPolicies makes three policies of one algorithm with small random
// parameters (so refills, window ends and rejections all happen), in random
// modes, one of them global when the algorithm allows it. monthly makes
// fixed windows calendar months, with limits up to 60.
func randomPolicies(t *testing.T, rng *rand.Rand, algo Algorithm, monthly bool) []*Policy {
	var out []*Policy
	for i := range 3 {
		mode := Enforce
		if rng.IntN(4) == 0 {
			mode = Shadow
		}
		scope := ScopeRegion
		if i == 0 && (algo.isBucket() || algo == FixedWindow) {
			scope = ScopeGlobal
		}
		var doc string
		if algo.isBucket() {
			rate := float64(1+rng.IntN(5000)) / 1000 // 0.001 .. 5 per second
			burst := float64(1+rng.IntN(10000)) / 1000
			doc = fmt.Sprintf(`{"id":"p%d","algorithm":%q,"rate_per_sec":%g,"burst":%g,"mode":%q,"scope":%q}`, i, algo, rate, burst, mode, scope)
		} else if monthly {
			doc = fmt.Sprintf(`{"id":"p%d","algorithm":%q,"limit":%d,"window":"month","mode":%q,"scope":%q}`, i, algo, 1+rng.IntN(60), mode, scope)
		} else {
			doc = fmt.Sprintf(`{"id":"p%d","algorithm":%q,"limit":%d,"window_s":%d,"mode":%q,"scope":%q}`, i, algo, 1+rng.IntN(30), 1+rng.IntN(20), mode, scope)
		}
		out = append(out, mustPolicy(t, doc))
	}
	return out
}

func differential(t *testing.T, rng *rand.Rand, algo Algorithm, monthly bool, redisStore *RedisStore, memStore *MemoryStore) {
	ctx := context.Background()
	policies := randomPolicies(t, rng, algo, monthly)
	regions := 1 + rng.IntN(3)
	lr, err := New(Config{Store: redisStore, Regions: regions, Region: "us-east"}, policies)
	require.NoError(t, err)
	lm, err := New(Config{Store: memStore, Regions: regions, Region: "us-east"}, policies)
	require.NoError(t, err)
	// Subjects with bytes that must be escaped, each test run its own.
	subjects := []Subject{
		{Kind: SubjectAPIKey, Value: fmt.Sprintf("%s-a{}", t.Name())},
		{Kind: SubjectAccount, Value: fmt.Sprintf("%s-b\x00 %%", t.Name())},
		{Kind: SubjectUser, Value: t.Name() + "/ü}"},
	}
	var admitted, rejected, shadowRejects int
	// Virtual time starts ahead of Redis's clock, so that replicated windows,
	// which expire at an absolute time, never expire by Redis's clock during
	// the test (the memory store keeps expired state, see keepExpired).
	// Months start two months ahead, so that even the previous month's
	// window ends after Redis's clock.
	now := time.Now().Add(time.Hour).Add(time.Duration(rng.IntN(3600_000)) * time.Millisecond)
	if monthly {
		now = now.AddDate(0, 2, 0)
	}
	var months int
	for step := range opsPerAlgorithm {
		// Time mostly moves by a few ms, sometimes by seconds or a window,
		// rarely backwards. Monthly windows also jump to the last seconds
		// of the month (then often step over its end, or back over it) or
		// days ahead, so the sequence spans years of month ends.
		if monthly {
			switch r := rng.IntN(100); {
			case r == 0:
				_, end := policies[0].WindowAt(now)
				now = end.Add(-time.Duration(rng.IntN(3_000)) * time.Millisecond)
				months++
			case r == 1:
				now = now.Add(time.Duration(rng.IntN(20*86_400_000)) * time.Millisecond)
			}
		}
		switch r := rng.IntN(100); {
		case r < 70:
			now = now.Add(time.Duration(rng.IntN(200)) * time.Millisecond)
		case r < 95:
			now = now.Add(time.Duration(rng.IntN(30_000)) * time.Millisecond)
		case r < 98:
			now = now.Add(-time.Duration(rng.IntN(2_000)) * time.Millisecond)
		default:
			now = now.Add(time.Duration(rng.IntN(3_600_000)) * time.Millisecond)
		}
		subj := subjects[rng.IntN(len(subjects))]
		// A random non-empty subset of the policies, in random order.
		perm := rng.Perm(len(policies))
		set := make([]*Policy, 0, 3)
		for _, j := range perm[:1+rng.IntN(len(perm))] {
			set = append(set, policies[j])
		}
		if algo.isBucket() && rng.IntN(50) == 0 {
			// The coordinator moves the share of the global policy.
			rate, burst := int64(1+rng.IntN(5000)), int64(1+rng.IntN(10000))
			require.NoError(t, redisStore.SetShare(ctx, subj, policies[0].ID, rate, burst, 0))
			memStore.SetShare(now, subj, policies[0].ID, rate, burst, 0)
		}
		if p := policies[0]; p.Scope == ScopeGlobal && p.Algorithm == FixedWindow && rng.IntN(10) == 0 {
			// Replication from another region, or the coordinator's cap: for
			// this window, mostly, else the previous or the next one.
			// win is the window's own length: for months, 28 to 31 days.
			start, end := p.WindowAt(now)
			switch rng.IntN(3) * rng.IntN(2) {
			case 1:
				start, end = p.WindowAt(start.Add(-time.Millisecond))
			case 2:
				start, end = p.WindowAt(end)
			}
			ws, win := start.UnixMilli(), end.Sub(start).Milliseconds()
			if rng.IntN(5) == 0 {
				c := int64(rng.IntN(int(p.Limit)+2)) - 1
				require.NoError(t, redisStore.SetWindowCap(ctx, subj, p.ID, ws, win, c))
				memStore.SetWindowCap(now, subj, p.ID, ws, win, c)
			} else {
				region := []string{"eu-west", "ap-south", "us-east"}[rng.IntN(3)]
				c := int64(rng.IntN(int(p.Limit) + 1))
				require.NoError(t, redisStore.MergeWindowCount(ctx, subj, p.ID, ws, win, region, c))
				memStore.MergeWindowCount(now, subj, p.ID, ws, win, region, c)
			}
		}
		var cost int64
		switch r := rng.IntN(20); {
		case r == 0:
			cost = 0 // peek
		case r == 1:
			cost = 25 + rng.Int64N(10) // often more than the capacity
		default:
			cost = 1 + rng.Int64N(4)
		}
		dr, err := lr.CheckSubjectAt(ctx, now, subj, set, cost)
		require.NoError(t, err, "step %d", step)
		dm, err := lm.CheckSubjectAt(ctx, now, subj, set, cost)
		require.NoError(t, err, "step %d", step)
		require.Equal(t, dm, dr, "step %d: %s at %s cost %d, policies %v", step, subj.Key(), now.Format(time.RFC3339Nano), cost, ids(set))
		if dm.Allowed {
			admitted++
		} else {
			rejected++
		}
		for _, pd := range dm.Policies {
			if !pd.Allowed && pd.Policy.Mode == Shadow {
				shadowRejects++
			}
		}
	}
	// The sequence must exercise both outcomes, or the comparison proves little.
	require.Greater(t, admitted, opsPerAlgorithm/20, "admitted")
	require.Greater(t, rejected, opsPerAlgorithm/20, "rejected")
	t.Logf("%s (monthly %v): %d admitted, %d rejected, %d shadow would-rejects, %d jumps to a month end, up to %s",
		algo, monthly, admitted, rejected, shadowRejects, months, now.UTC().Format(time.DateOnly))
}

func ids(ps []*Policy) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = fmt.Sprintf("%s(%s %s)", p.ID, p.Algorithm, p.Mode)
	}
	return out
}
