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

// extremeOps is the length of each sequence of TestDifferentialExtremes.
const extremeOps = 4_000

// differentialServers starts each kind of server the differential tests
// run against.
var differentialServers = []struct {
	name  string
	start func(t *testing.T) redis.UniversalClient
}{
	{"standalone", func(t *testing.T) redis.UniversalClient { return redistest.StartServer(t).Client() }},
	{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t).Client() }},
}

// TestDifferentialExtremes is TestDifferential at the edges of what the
// parser allows and the coordinator may write: rates from 0.001/s to
// 1e9/s, bursts from 0.001 to 1e6, limits from 1 to 1e12 (1,000 for
// sliding logs), windows from 1 s to 366 days, costs from 0 to 1e8; share
// records of rate 0, burst 0, both, the maxima and beyond them; and rate,
// burst and limit changes (an edit or an override of the same id) between
// operations, with time steps down to the microsecond. The script on real
// redis-servers (standalone and a three-node cluster) and the in-memory
// store must give identical decisions.
func TestDifferentialExtremes(t *testing.T) {
	cases := []struct {
		algo    Algorithm
		monthly bool
	}{
		{TokenBucket, false}, {LeakyBucket, false}, {FixedWindow, false}, {FixedWindow, true},
		{SlidingWindowLog, false}, {SlidingWindowCounter, false},
	}
	for _, srv := range differentialServers {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			client := srv.start(t)
			for i, c := range cases {
				name := string(c.algo)
				if c.monthly {
					name += "_month"
				}
				t.Run(name, func(t *testing.T) {
					rs := NewRedisStore(client)
					rs.decideAtGivenTime()
					ms := NewMemoryStore()
					ms.keepExpired = true
					extremes(t, rand.New(rand.NewPCG(uint64(i)+100, 7)), c.algo, c.monthly, rs, ms)
				})
			}
		})
	}
}

func pick[T any](rng *rand.Rand, vs ...T) T { return vs[rng.IntN(len(vs))] }

// extremePolicy draws policy id of algo with parameters mostly at the
// bounds. Windows keep window (their shape) across versions.
func extremePolicy(t *testing.T, rng *rand.Rand, id string, algo Algorithm, scope Scope, window string, version int) *Policy {
	mode := pick(rng, Enforce, Enforce, Enforce, Shadow)
	var doc string
	if algo.isBucket() {
		rate := pick(rng, 0.001, 0.002, 0.01, 0.5, 1, 3.333, 50, 500, 1e6, 1e9, float64(1+rng.IntN(5000))/1000)
		burst := pick(rng, 0.001, 0.5, 1, 2, 5, 10, 1000, 1e6, float64(1+rng.IntN(10000))/1000)
		doc = fmt.Sprintf(`{"id":%q,"version":%d,"algorithm":%q,"rate_per_sec":%g,"burst":%g,"scope":%q,"mode":%q}`, id, version, algo, rate, burst, scope, mode)
	} else {
		limit := pick[int64](rng, 1, 2, 3, 10, 1000, 1_000_000, MaxLimit, 1+rng.Int64N(30))
		if algo == SlidingWindowLog {
			limit = min(limit, MaxSlidingLogLimit)
		}
		doc = fmt.Sprintf(`{"id":%q,"version":%d,"algorithm":%q,"limit":%d,%s,"scope":%q,"mode":%q}`, id, version, algo, limit, window, scope, mode)
	}
	return mustPolicy(t, doc)
}

func extremes(t *testing.T, rng *rand.Rand, algo Algorithm, monthly bool, redisStore *RedisStore, memStore *MemoryStore) {
	ctx := context.Background()
	windows := make([]string, 3)
	policies := make([]*Policy, 3)
	scopes := make([]Scope, 3)
	for i := range policies {
		scopes[i] = ScopeRegion
		if i == 0 && (algo.isBucket() || algo == FixedWindow) {
			scopes[i] = ScopeGlobal
		}
		switch {
		case monthly:
			windows[i] = `"window":"month"`
		case !algo.isBucket():
			windows[i] = fmt.Sprintf(`"window_s":%d`, pick[int64](rng, 1, 2, 60, 86_400, MaxWindowSec, 1+rng.Int64N(20)))
		}
		policies[i] = extremePolicy(t, rng, fmt.Sprintf("x%d", i), algo, scopes[i], windows[i], 1)
	}
	regions := 1 + rng.IntN(3)
	lr, err := New(Config{Store: redisStore, Regions: regions, Region: "us-east"}, policies)
	require.NoError(t, err)
	lm, err := New(Config{Store: memStore, Regions: regions, Region: "us-east"}, policies)
	require.NoError(t, err)
	subjects := []Subject{
		{Kind: SubjectAPIKey, Value: t.Name() + "-a"},
		{Kind: SubjectUser, Value: t.Name() + "-b{}"},
	}
	// Ahead of Redis's clock, as in TestDifferential, so that no key expires
	// by Redis's clock while virtual time still holds it.
	now := time.Now().Add(time.Hour).Add(time.Duration(rng.IntN(3600_000_000)) * time.Microsecond)
	if monthly {
		now = now.AddDate(0, 2, 0)
	}
	var admitted, rejected, edits, shares, zeroRateNever int
	for step := range extremeOps {
		switch r := rng.IntN(100); {
		case r < 30:
			now = now.Add(time.Duration(rng.IntN(2_000)) * time.Microsecond)
		case r < 40: // same instant
		case r < 70:
			now = now.Add(time.Duration(rng.IntN(200)) * time.Millisecond)
		case r < 90:
			now = now.Add(time.Duration(rng.IntN(30_000)) * time.Millisecond)
		case r < 93:
			now = now.Add(-time.Duration(rng.IntN(2_000_000)) * time.Microsecond)
		case r < 98:
			now = now.Add(time.Duration(rng.IntN(3_600_000)) * time.Millisecond)
		default:
			now = now.Add(time.Duration(rng.Int64N(int64(400 * 24 * time.Hour))))
		}
		if rng.IntN(30) == 0 {
			// An edit, or an override for the subjects: same id, new numbers.
			j := rng.IntN(len(policies))
			policies[j] = extremePolicy(t, rng, policies[j].ID, algo, scopes[j], windows[j], step+2)
			edits++
		}
		subj := subjects[rng.IntN(len(subjects))]
		perm := rng.Perm(len(policies))
		set := make([]*Policy, 0, 3)
		for _, j := range perm[:1+rng.IntN(len(perm))] {
			set = append(set, policies[j])
		}
		if algo.isBucket() && rng.IntN(15) == 0 {
			rate := pick[int64](rng, 0, 0, 1, 2, 333, 1_000_000, maxRateMilli, maxRateMilli+5, -1, 1+rng.Int64N(5000))
			burst := pick[int64](rng, 0, 1, 999, 1000, 1001, maxBurstMilli, 2*maxBurstMilli, -5, 1+rng.Int64N(10000))
			require.NoError(t, redisStore.SetShare(ctx, subj, policies[0].ID, rate, burst, 0))
			memStore.SetShare(now, subj, policies[0].ID, rate, burst, 0)
			shares++
		}
		if p := policies[0]; p.Scope == ScopeGlobal && p.Algorithm == FixedWindow && rng.IntN(10) == 0 {
			start, end := p.WindowAt(now)
			if rng.IntN(4) == 0 {
				start, end = p.WindowAt(start.Add(-time.Millisecond))
			}
			ws, win := start.UnixMilli(), end.Sub(start).Milliseconds()
			if rng.IntN(5) == 0 {
				c := pick[int64](rng, -1, 0, 1, p.Limit, rng.Int64N(p.Limit+1))
				require.NoError(t, redisStore.SetWindowCap(ctx, subj, p.ID, ws, win, c))
				memStore.SetWindowCap(now, subj, p.ID, ws, win, c)
			} else {
				region := pick(rng, "eu-west", "ap-south", "us-east")
				c := pick[int64](rng, 0, p.Limit, rng.Int64N(p.Limit+1))
				require.NoError(t, redisStore.MergeWindowCount(ctx, subj, p.ID, ws, win, region, c))
				memStore.MergeWindowCount(now, subj, p.ID, ws, win, region, c)
			}
		}
		capacity := set[0].Capacity()
		cost := pick[int64](rng, 0, 1, 1, 1, 2, 3, 10, 1000, 1_000_000, MaxCost, capacity, capacity+1, max(1, capacity/2))
		dr, err := lr.checkSubjectAt(ctx, now, subj, set, cost)
		require.NoError(t, err, "step %d", step)
		dm, err := lm.checkSubjectAt(ctx, now, subj, set, cost)
		require.NoError(t, err, "step %d", step)
		require.Equal(t, dm, dr, "step %d: %s at %s cost %d, policies %v", step, subj.Key(), now.Format(time.RFC3339Nano), cost, ids(set))
		if dm.Allowed {
			admitted++
		} else {
			rejected++
		}
		for _, pd := range dm.Policies {
			if pd.Never && cost <= pd.Limit && pd.Policy.Scope == ScopeGlobal {
				zeroRateNever++ // a share of rate (or burst) 0
			}
		}
	}
	require.Greater(t, admitted, extremeOps/20, "admitted")
	require.Greater(t, rejected, extremeOps/20, "rejected")
	require.Greater(t, edits, extremeOps/60, "edits")
	if algo.isBucket() {
		require.Greater(t, shares, extremeOps/30, "share records")
		require.Positive(t, zeroRateNever, "rejections at a zero share")
	}
	t.Logf("%s (monthly %v, %d regions): %d admitted, %d rejected, %d edits, %d share records, %d never at a zero share",
		algo, monthly, regions, admitted, rejected, edits, shares, zeroRateNever)
}

// TestDifferentialServerTime runs the script with Redis server TIME (not a
// time passed in) and lets keys expire by Redis's own clock, and compares
// with the memory store deciding at a Redis TIME read just before the call
// (t1; the script ran at some t in [t1, t2], t2 read just after). Where a
// decision cannot depend on the time within [t1, t2] it must be identical:
// buckets whose share has rate 0 (nothing refills; their keys live for
// hours), and whether a window admits and what it has left. What runs to
// a window's end (reset, retry) may be earlier in Redis by the time
// between t1 and t2: the stated bound is 0 <= memory - redis <= t2 - t1,
// rounded up to a millisecond, plus 1 ms.
func TestDifferentialServerTime(t *testing.T) {
	for _, srv := range differentialServers {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			client := srv.start(t)
			t.Run("zero_rate_and_long_windows", func(t *testing.T) { serverTimeSequence(t, client) })
			t.Run("expiry", func(t *testing.T) { serverTimeExpiry(t, client) })
		})
	}
}

// redisNow is Redis's clock.
func redisNow(t *testing.T, client redis.UniversalClient) time.Time {
	now, err := client.Time(context.Background()).Result()
	require.NoError(t, err)
	return now
}

// requireAlikeWithin compares a decision taken by Redis at some time in
// [t1, t2] with the memory store's at t1.
func requireAlikeWithin(t *testing.T, dm, dr Decision, t1, t2 time.Time, msg string) {
	t.Helper()
	bound := (t2.Sub(t1) + time.Millisecond - 1).Truncate(time.Millisecond) + time.Millisecond
	require.Equal(t, dm.Allowed, dr.Allowed, msg)
	require.Equal(t, dm.Delay, dr.Delay, msg)
	require.Len(t, dr.Policies, len(dm.Policies), msg)
	for i := range dm.Policies {
		m, r := dm.Policies[i], dr.Policies[i]
		require.Equal(t, m.Allowed, r.Allowed, "%s: %s", msg, m.Policy.ID)
		require.Equal(t, m.Remaining, r.Remaining, "%s: %s", msg, m.Policy.ID)
		require.Equal(t, m.Never, r.Never, "%s: %s", msg, m.Policy.ID)
		for _, d := range [][2]time.Duration{{m.ResetAfter, r.ResetAfter}, {m.RetryAfter, r.RetryAfter}} {
			diff := d[0] - d[1]
			require.True(t, diff >= 0 && diff <= bound, "%s: %s: memory %v, redis %v, bound %v", msg, m.Policy.ID, d[0], d[1], bound)
		}
	}
}

func serverTimeSequence(t *testing.T, client redis.UniversalClient) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 9))
	// The buckets' own rate is the smallest, so that a key written at rate
	// 0 lives for hours and expires in neither store during the test.
	policies := []*Policy{
		mustPolicy(t, `{"id":"tb","algorithm":"token_bucket","rate_per_sec":0.001,"burst":20,"scope":"global"}`),
		mustPolicy(t, `{"id":"lb","algorithm":"leaky_bucket","rate_per_sec":0.001,"burst":20,"scope":"global"}`),
		mustPolicy(t, `{"id":"fw","algorithm":"fixed_window","limit":40,"window_s":31622400}`),
		mustPolicy(t, `{"id":"mo","algorithm":"fixed_window","limit":30,"window":"month"}`),
	}
	rs := NewRedisStore(client)
	ms := NewMemoryStore()
	lr, err := New(Config{Store: rs}, policies)
	require.NoError(t, err)
	lm, err := New(Config{Store: ms}, policies)
	require.NoError(t, err)
	subj := Subject{Kind: SubjectAPIKey, Value: t.Name()}
	var admitted, rejected, compared int
	for step := range 400 {
		if rng.IntN(20) == 0 || step == 0 {
			for _, p := range policies[:2] {
				burst := pick[int64](rng, 0, 1000, 5000, 20_000, rng.Int64N(20_001))
				require.NoError(t, rs.SetShare(ctx, subj, p.ID, 0, burst, time.Hour))
				ms.SetShare(redisNow(t, client), subj, p.ID, 0, burst, time.Hour)
			}
		}
		set := []*Policy{policies[rng.IntN(2)], policies[2+rng.IntN(2)]}
		cost := pick[int64](rng, 0, 1, 1, 2, 3)
		t1 := redisNow(t, client)
		dr, err := lr.checkSubjectAt(ctx, t1, subj, set, cost)
		require.NoError(t, err)
		t2 := redisNow(t, client)
		if s1, _ := set[1].WindowAt(t1); !s1.Equal(func() time.Time { s, _ := set[1].WindowAt(t2); return s }()) {
			// The call may have run on either side of a window's end; the
			// two stores may rightly differ, and from here on they will.
			t.Logf("step %d straddles the end of %s's window; stopping", step, set[1].ID)
			break
		}
		dm, err := lm.checkSubjectAt(ctx, t1, subj, set, cost)
		require.NoError(t, err)
		requireAlikeWithin(t, dm, dr, t1, t2, fmt.Sprintf("step %d cost %d %v", step, cost, ids(set)))
		compared++
		if dm.Allowed {
			admitted++
		} else {
			rejected++
		}
	}
	require.Greater(t, compared, 300)
	require.Greater(t, admitted, 10)
	require.Greater(t, rejected, 10)
	t.Logf("%d decisions compared under Redis TIME: %d admitted, %d rejected", compared, admitted, rejected)
}

// serverTimeExpiry lets every key expire by Redis's clock and requires
// the next decision to be the same in both stores: a bucket is full again
// (at rate 0 too, once the time to fill at the policy's own rate has
// passed), a window starts afresh.
func serverTimeExpiry(t *testing.T, client redis.UniversalClient) {
	ctx := context.Background()
	policies := []*Policy{
		mustPolicy(t, `{"id":"tb","algorithm":"token_bucket","rate_per_sec":1000,"burst":2}`),
		mustPolicy(t, `{"id":"z","algorithm":"token_bucket","rate_per_sec":1000,"burst":2,"scope":"global"}`),
		mustPolicy(t, `{"id":"fw","algorithm":"fixed_window","limit":2,"window_s":1}`),
	}
	rs := NewRedisStore(client)
	ms := NewMemoryStore()
	lr, err := New(Config{Store: rs}, policies)
	require.NoError(t, err)
	lm, err := New(Config{Store: ms}, policies)
	require.NoError(t, err)
	subj := Subject{Kind: SubjectAPIKey, Value: t.Name()}
	keys := make([]string, len(policies))
	for i, p := range policies {
		keys[i] = StateKey(subj, p)
	}
	// Rate 0 for the global bucket: it refills only by expiring.
	require.NoError(t, rs.SetShare(ctx, subj, "z", 0, 2000, time.Hour))
	ms.SetShare(redisNow(t, client), subj, "z", 0, 2000, time.Hour)
	rounds := 0
	for attempt := 0; rounds < 3; attempt++ {
		require.Less(t, attempt, 10, "too many rounds straddled a window's end")
		t1 := redisNow(t, client)
		dr, err := lr.checkSubjectAt(ctx, t1, subj, policies, 2)
		require.NoError(t, err)
		t2 := redisNow(t, client)
		s1, _ := policies[2].WindowAt(t1)
		if s2, _ := policies[2].WindowAt(t2); !s1.Equal(s2) {
			// Memory and Redis counted in different windows: wait for both
			// keys to go, then try again.
			waitGone(t, client, keys...)
			continue
		}
		dm, err := lm.checkSubjectAt(ctx, t1, subj, policies, 2)
		require.NoError(t, err)
		requireAlikeWithin(t, dm, dr, t1, t2, fmt.Sprintf("round %d: fresh", rounds))
		require.True(t, dr.Allowed, "round %d: fresh keys admit the whole burst", rounds)
		// Everything is spent; Redis's clock alone removes the keys.
		waitGone(t, client, keys...)
		t3 := redisNow(t, client)
		dr, err = lr.checkSubjectAt(ctx, t3, subj, policies, 0)
		require.NoError(t, err)
		t4 := redisNow(t, client)
		dm, err = lm.checkSubjectAt(ctx, t3, subj, policies, 0)
		require.NoError(t, err)
		requireAlikeWithin(t, dm, dr, t3, t4, fmt.Sprintf("round %d: after expiry", rounds))
		for _, pd := range dr.Policies {
			require.Equal(t, pd.Limit, pd.Remaining, "round %d: %s is whole again after its key expired", rounds, pd.Policy.ID)
		}
		rounds++
	}
}

// waitGone waits, at most 10 s, until Redis has expired every key.
func waitGone(t *testing.T, client redis.UniversalClient, keys ...string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := int64(0)
		for _, k := range keys {
			c, err := client.Exists(ctx, k).Result()
			require.NoError(t, err)
			n += c
		}
		if n == 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "keys %v still exist after 10 s", keys)
		time.Sleep(20 * time.Millisecond)
	}
}
