package limiter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
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

// stepsPerAlgorithmSubjects is the length of each random sequence of
// TestDifferentialSubjects, per algorithm and per server kind.
const stepsPerAlgorithmSubjects = 1500

// TestDifferentialSubjects draws requests with one to three subjects (an
// API key, an account, a user), each with its own random subset of three
// policies of one algorithm, and decides each request three ways: the Lua
// script on real redis-servers (standalone, and a three-node cluster where
// the subjects of a request are sometimes on one node, one script call,
// and sometimes not, calls in order with refunds), the MemoryStore, and a
// naive sequential reference that decides the subjects one after the
// other on a copy of its state and keeps the copy only when every subject
// admitted. After each step it requires:
//
//   - the MemoryStore's decision and state to equal the reference's (so a
//     rejected request changed no state), and its state to be unchanged
//     by a rejected request;
//   - the script's decision to equal the MemoryStore's, field for field,
//     when the subjects share a node; across nodes, the same outcome and
//     the same answers for the subjects that were evaluated (refunded
//     subjects report their quota approximately, see refund.go);
//   - the state in Redis of every policy of the request, brought to the
//     step's time (advance: so an expired key and a live full one compare
//     equal), to equal the MemoryStore's: refunds give back exactly.
func TestDifferentialSubjects(t *testing.T) {
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
					// Across cluster nodes refunds are exact only while
					// the clock does not step back (see refund.go), so
					// time steps back only on the standalone server.
					differentialSubjects(t, rand.New(rand.NewPCG(uint64(i)+100, 7)), c.algo, c.monthly, rs, name == "standalone")
				})
			}
		})
	}
}

func differentialSubjects(t *testing.T, rng *rand.Rand, algo Algorithm, monthly bool, rs *RedisStore, backwards bool) {
	ctx := context.Background()
	policies := randomPolicies(t, rng, algo, monthly)
	regions := 1 + rng.IntN(3)
	newStore := func() *MemoryStore {
		ms := NewMemoryStore()
		ms.keepExpired = true
		return ms
	}
	ms, ref := newStore(), newStore()
	lr, err := New(Config{Store: rs, Regions: regions, Region: "us-east", DenyCacheMaxKeys: -1, Deadline: 10 * time.Second}, policies)
	require.NoError(t, err)
	lm, err := New(Config{Store: ms, Regions: regions, Region: "us-east"}, policies)
	require.NoError(t, err)
	// Six subjects, two of each kind, so that on a cluster some requests
	// find all their subjects on one node and others do not.
	subjects := []Subject{
		{Kind: SubjectAPIKey, Value: t.Name() + "-k{}"},
		{Kind: SubjectAccount, Value: t.Name() + "-a\x00%"},
		{Kind: SubjectUser, Value: t.Name() + "-u/ü}"},
		{Kind: SubjectAPIKey, Value: t.Name() + "-k2"},
		{Kind: SubjectAccount, Value: t.Name() + "-a2"},
		{Kind: SubjectUser, Value: t.Name() + "-u2"},
	}
	now := time.Now().Add(time.Hour).Add(time.Duration(rng.IntN(3600_000)) * time.Millisecond)
	if monthly {
		now = now.AddDate(0, 2, 0)
	}
	var admitted, rejected, multi, split, refunded int
	var d Decision
	for step := range stepsPerAlgorithmSubjects {
		switch r := rng.IntN(100); {
		case monthly && r == 0:
			_, end := policies[0].WindowAt(now)
			now = end.Add(-time.Duration(rng.IntN(3_000)) * time.Millisecond)
		case r < 70:
			now = now.Add(time.Duration(rng.IntN(200)) * time.Millisecond)
		case r < 95:
			now = now.Add(time.Duration(rng.IntN(30_000)) * time.Millisecond)
		case r < 98:
			if backwards {
				now = now.Add(-time.Duration(rng.IntN(2_000)) * time.Millisecond)
			}
		default:
			now = now.Add(time.Duration(rng.IntN(3_600_000)) * time.Millisecond)
		}
		// One to three subjects, in random order, each with a random
		// non-empty subset of the policies in random order.
		var groups []SubjectPolicies
		for _, si := range rng.Perm(len(subjects))[:1+rng.IntN(3)] {
			perm := rng.Perm(len(policies))
			var set []*Policy
			for _, j := range perm[:1+rng.IntN(len(perm))] {
				set = append(set, policies[j])
			}
			groups = append(groups, SubjectPolicies{Subject: subjects[si], Policies: set})
		}
		if len(groups) > 1 {
			multi++
		}
		subj := groups[rng.IntN(len(groups))].Subject
		if algo.isBucket() && rng.IntN(50) == 0 {
			rate, burst := int64(1+rng.IntN(5000)), int64(1+rng.IntN(10000))
			require.NoError(t, rs.SetShare(ctx, subj, policies[0].ID, rate, burst, 0))
			ms.SetShare(now, subj, policies[0].ID, rate, burst, 0)
			ref.SetShare(now, subj, policies[0].ID, rate, burst, 0)
		}
		if p := policies[0]; p.Scope == ScopeGlobal && p.Algorithm == FixedWindow && rng.IntN(10) == 0 {
			start, end := p.WindowAt(now)
			ws, win := start.UnixMilli(), end.Sub(start).Milliseconds()
			region := []string{"eu-west", "ap-south", "us-east"}[rng.IntN(3)]
			c := int64(rng.IntN(int(p.Limit) + 1))
			require.NoError(t, rs.MergeWindowCount(ctx, subj, p.ID, ws, win, region, c))
			ms.MergeWindowCount(now, subj, p.ID, ws, win, region, c)
			ref.MergeWindowCount(now, subj, p.ID, ws, win, region, c)
		}
		var cost int64
		switch r := rng.IntN(20); {
		case r == 0:
			cost = 0
		case r == 1:
			cost = 25 + rng.Int64N(10)
		default:
			cost = 1 + rng.Int64N(4)
		}
		req := Request{Cost: cost, Peek: cost == 0}
		msg := fmt.Sprintf("step %d at %s cost %d, request %s", step, now.Format(time.RFC3339Nano), cost, describeGroups(groups))

		before := dumpMemory(ms)
		require.NoError(t, lm.CheckSubjectsInto(ctx, now, groups, req, &d), msg)
		dm := d
		dm.Policies = append([]PolicyDecision(nil), d.Policies...)

		// The reference: subjects one by one on a copy, kept only when all
		// admitted.
		cp := cloneMemory(ref)
		refAllowed := true
		var refAdmits []bool
		for _, g := range groups {
			ops := make([]op, len(g.Policies))
			res := make([]result, len(g.Policies))
			subjs := make([]Subject, len(g.Policies))
			for i, p := range g.Policies {
				ops[i], subjs[i] = lm.opFor(p, costOf(p, &req)), g.Subject
			}
			ok, err := cp.eval(ctx, now, subjs, ops, res)
			require.NoError(t, err)
			refAllowed = refAllowed && ok
			for i := range res {
				refAdmits = append(refAdmits, res[i].allowed)
			}
		}
		if refAllowed {
			ref = cp
		}
		require.Equal(t, refAllowed, dm.Allowed, "%s: outcome against the reference", msg)
		require.Len(t, dm.Policies, len(refAdmits), msg)
		for i := range refAdmits {
			require.Equal(t, refAdmits[i], dm.Policies[i].Allowed, "%s: policy %d against the reference", msg, i)
		}
		after := dumpMemory(ms)
		require.Equal(t, dumpMemory(ref), after, "%s: memory store against the reference", msg)
		if !dm.Allowed {
			require.Equal(t, before, after, "%s: a rejected request changed the memory store", msg)
		}

		subjs := make([]Subject, 0, 8)
		ops := make([]op, 0, 8)
		for _, g := range groups {
			for _, p := range g.Policies {
				subjs, ops = append(subjs, g.Subject), append(ops, lm.opFor(p, cost))
			}
		}
		oneNode := rs.oneCall(ctx, subjs, ops)
		require.NoError(t, lr.CheckSubjectsInto(ctx, now, groups, req, &d), msg)
		dr := d
		if oneNode {
			require.Equal(t, dm, dr, "%s: script against memory", msg)
		} else {
			split++
			require.Equal(t, dm.Allowed, dr.Allowed, "%s: outcome, script in order against memory", msg)
			require.Equal(t, worse(dm.Source, dr.Source), SourceStore, msg)
			if dm.Allowed {
				require.Equal(t, dm, dr, "%s: admitted, script in order against memory", msg)
			} else {
				// The subjects evaluated: those before the rejecting one
				// (refunded) and the rejecting one, whose answers are exact.
				require.LessOrEqual(t, len(dr.Policies), len(dm.Policies), msg)
				last := dr.Policies[len(dr.Policies)-1].Subject
				for i, pd := range dr.Policies {
					require.Equal(t, dm.Policies[i].Allowed, pd.Allowed, "%s: policy %d", msg, i)
					if pd.Subject == last {
						require.Equal(t, dm.Policies[i], pd, "%s: policy %d of the rejecting subject", msg, i)
					}
				}
				if last != groups[0].Subject {
					refunded++
				}
			}
		}
		nowUs := now.UnixMicro()
		for i := range ops {
			o := ops[i]
			rate, burst := o.rate, o.burst
			var mst *state
			sh := ms.shard(subjs[i])
			if s := sh.get(subjs[i]); s != nil {
				if sv := s.share(o.policy, now.UnixMilli()); sv != nil && o.global && !o.replicated() {
					rate, burst = sv.rate, sv.burst
				}
				mst = s.lookup(o.policy, o.tag(), now.UnixMilli(), true)
			}
			rst := readRedisState(t, rs.client, subjs[i], &o)
			want := advance(&o, mst, nowUs, rate, burst)
			got := advance(&o, rst, nowUs, rate, burst)
			want.expireMs, got.expireMs = 0, 0
			if len(want.log) == 0 {
				want.log = nil
			}
			if len(got.log) == 0 {
				got.log = nil
			}
			require.Equal(t, want, got, "%s: state of %s in Redis against memory", msg, o.policy+"@"+subjs[i].Key())
		}
		if dm.Allowed {
			admitted++
		} else {
			rejected++
		}
	}
	require.Greater(t, admitted, stepsPerAlgorithmSubjects/20, "admitted")
	require.Greater(t, rejected, stepsPerAlgorithmSubjects/20, "rejected")
	if _, ok := rs.client.(*redis.ClusterClient); ok {
		require.Greater(t, split, stepsPerAlgorithmSubjects/20, "requests across nodes")
		require.Greater(t, refunded, 0, "refunds")
	}
	t.Logf("%s (monthly %v): %d admitted, %d rejected, %d with several subjects, %d across nodes, %d refunded", algo, monthly, admitted, rejected, multi, split, refunded)
}

func describeGroups(groups []SubjectPolicies) string {
	var b []string
	for _, g := range groups {
		b = append(b, fmt.Sprintf("%s:%v", g.Subject.Key(), ids(g.Policies)))
	}
	return fmt.Sprint(b)
}

// memDump is a MemoryStore's whole content, comparable with require.Equal.
type memDump map[Subject]memSubject

func dumpMemory(m *MemoryStore) memDump {
	out := memDump{}
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		sh.each(func(k Subject, s *memSubject) { out[k] = cloneSubject(s) })
		sh.mu.Unlock()
	}
	return out
}

func cloneSubject(s *memSubject) memSubject {
	c := memSubject{shares: append([]memShare(nil), s.shares...)}
	for _, e := range s.entries {
		e.st.log = append([]logEntry(nil), e.st.log...)
		e.st.counts = append([]regionCount(nil), e.st.counts...)
		c.entries = append(c.entries, e)
	}
	return c
}

// cloneMemory is a deep copy of m.
func cloneMemory(m *MemoryStore) *MemoryStore {
	c := NewMemoryStore()
	c.seed, c.keepExpired = m.seed, m.keepExpired
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		c.shards[i].nextSweep = sh.nextSweep
		sh.each(func(k Subject, s *memSubject) {
			cs := cloneSubject(s)
			c.shards[i].put(k, &cs)
		})
		sh.mu.Unlock()
	}
	return c
}

// readRedisState reads one op's state from Redis into the form the
// MemoryStore keeps (nil when the key does not exist).
func readRedisState(t *testing.T, client redis.UniversalClient, subj Subject, o *op) *state {
	t.Helper()
	ctx := context.Background()
	key := stateKey(subj.Key(), o.policy, o.tag())
	atoi := func(s string) int64 {
		n, err := strconv.ParseInt(s, 10, 64)
		require.NoError(t, err, "key %s: %q", key, s)
		return n
	}
	switch {
	case o.replicated():
		h, err := client.HGetAll(ctx, key).Result()
		require.NoError(t, err)
		if len(h) == 0 {
			return nil
		}
		st := &state{capv: -1}
		var regions []string
		for f, v := range h {
			switch {
			case f == "w":
				st.a = atoi(v)
			case f == "cap":
				st.capv = atoi(v)
			case strings.HasPrefix(f, "n:"):
				regions = append(regions, f[2:])
			}
		}
		slices.Sort(regions)
		for _, r := range regions {
			st.counts = append(st.counts, regionCount{r, atoi(h["n:"+r])})
		}
		return st
	case o.algo == SlidingWindowLog:
		l, err := client.LRange(ctx, key, 0, -1).Result()
		require.NoError(t, err)
		if len(l) == 0 {
			return nil
		}
		st := &state{}
		for _, e := range l {
			ts, c, ok := strings.Cut(e, ":")
			require.True(t, ok, e)
			st.log = append(st.log, logEntry{ts: atoi(ts), cost: atoi(c)})
		}
		return st
	}
	v, err := client.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	require.NoError(t, err)
	if o.algo.isBucket() {
		st := decodeBucket(t, v)
		return &st
	}
	parts := strings.Split(v, ":")
	st := &state{capv: -1}
	st.a = atoi(parts[0])
	if len(parts) > 1 {
		st.b = atoi(parts[1])
	}
	if len(parts) > 2 {
		st.c = atoi(parts[2])
	}
	return st
}
