package limiter

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// bucketStore is one store under test, with the coordinator's way of
// writing a share record into it.
type bucketStore struct {
	name     string
	store    Store
	setShare func(t *testing.T, now time.Time, subj Subject, policyID string, rateMilli, burstMilli int64)
}

// bucketStores are the in-memory store and the script on a real
// redis-server (deciding at the time given), which must both pass every
// timeline below.
func bucketStores(t *testing.T) []bucketStore {
	ms := NewMemoryStore()
	out := []bucketStore{{
		name:  "memory",
		store: ms,
		setShare: func(_ *testing.T, now time.Time, subj Subject, id string, r, b int64) {
			ms.SetShare(now, subj, id, r, b, 0)
		},
	}}
	rs := NewRedisStore(redistest.StartServer(t).Client())
	rs.decideAtGivenTime()
	return append(out, bucketStore{
		name:  "redis",
		store: rs,
		setShare: func(t *testing.T, _ time.Time, subj Subject, id string, r, b int64) {
			require.NoError(t, rs.SetShare(context.Background(), subj, id, r, b, 0))
		},
	})
}

// change is one step of a timeline whose policy (an edit or an override
// of the same id, so the same state) or share may change before it.
type change struct {
	p     *Policy
	share []int64 // when set: {rate milli, burst milli} written before the step
	step
}

func runChanges(t *testing.T, regions int, steps []change) {
	t.Helper()
	for _, bs := range bucketStores(t) {
		t.Run(bs.name, func(t *testing.T) {
			l, err := New(Config{Store: bs.store, Regions: regions, Region: "us-east"}, []*Policy{steps[0].p})
			require.NoError(t, err)
			subj := Subject{Kind: SubjectAPIKey, Value: t.Name()}
			for i, s := range steps {
				if s.share != nil {
					bs.setShare(t, at(s.ms), subj, s.p.ID, s.share[0], s.share[1])
				}
				d, err := l.checkSubjectAt(context.Background(), at(s.ms), subj, []*Policy{s.p}, s.cost)
				require.NoError(t, err, "step %d", i)
				pd := d.Policies[0]
				assert.Equal(t, s.allowed, d.Allowed, "step %d (t=%dms cost %d): allowed", i, s.ms, s.cost)
				assert.Equal(t, s.remaining, pd.Remaining, "step %d: remaining", i)
				if s.retryMs < 0 {
					assert.True(t, pd.Never, "step %d: never", i)
				} else {
					assert.False(t, pd.Never, "step %d: never", i)
					assert.Equal(t, time.Duration(s.retryMs)*time.Millisecond, pd.RetryAfter, "step %d: retry", i)
				}
				assert.Equal(t, time.Duration(s.resetMs)*time.Millisecond, pd.ResetAfter, "step %d: reset", i)
				assert.Equal(t, time.Duration(s.delayMs)*time.Millisecond, d.Delay, "step %d: delay", i)
			}
		})
	}
}

func bucketPolicy(t *testing.T, algo Algorithm, rate, burst float64, scope Scope) *Policy {
	return mustPolicy(t, fmt.Sprintf(`{"id":"b","algorithm":%q,"rate_per_sec":%g,"burst":%g,"scope":%q}`, algo, rate, burst, scope))
}

// TestRateCutCarriesTokens is issue 11's example: a 500/s, burst-1000
// bucket emptied and cut to 50/s at the same instant holds nothing (not
// the 900 tokens that "time when full" recomputed at the new rate), and
// refills at 50/s; raised again, it keeps what it had.
func TestRateCutCarriesTokens(t *testing.T) {
	fast := bucketPolicy(t, TokenBucket, 500, 1000, ScopeRegion)
	slow := bucketPolicy(t, TokenBucket, 50, 1000, ScopeRegion) // an override or an edit: same id
	runChanges(t, 1, []change{
		{p: fast, step: step{ms: 0, cost: 1000, allowed: true, remaining: 0, resetMs: 2_000}},
		{p: slow, step: step{ms: 0, cost: 0, allowed: true, remaining: 0, resetMs: 20_000}},
		{p: slow, step: step{ms: 0, cost: 1, allowed: false, remaining: 0, retryMs: 20, resetMs: 20_000}},
		{p: slow, step: step{ms: 1_000, cost: 0, allowed: true, remaining: 50, resetMs: 19_000}},
		{p: slow, step: step{ms: 1_000, cost: 50, allowed: true, remaining: 0, resetMs: 20_000}},
		{p: fast, step: step{ms: 1_000, cost: 0, allowed: true, remaining: 0, resetMs: 2_000}}, // raised: still empty
		{p: fast, step: step{ms: 1_100, cost: 1, allowed: true, remaining: 49, resetMs: 1_902}},
		{p: slow, step: step{ms: 1_100, cost: 0, allowed: true, remaining: 49, resetMs: 19_020}}, // cut again: keeps 49
	})
}

// TestBurstChangeCarriesTokens: a smaller burst clamps what the bucket
// holds; a larger one keeps it (it does not hand out the difference).
func TestBurstChangeCarriesTokens(t *testing.T) {
	big := bucketPolicy(t, TokenBucket, 10, 1000, ScopeRegion)
	small := bucketPolicy(t, TokenBucket, 10, 100, ScopeRegion)
	runChanges(t, 1, []change{
		{p: big, step: step{ms: 0, cost: 500, allowed: true, remaining: 500, resetMs: 50_000}},
		{p: small, step: step{ms: 0, cost: 0, allowed: true, remaining: 100, resetMs: 0}},
		{p: small, step: step{ms: 0, cost: 100, allowed: true, remaining: 0, resetMs: 10_000}},
		{p: big, step: step{ms: 0, cost: 0, allowed: true, remaining: 0, resetMs: 100_000}},
		{p: big, step: step{ms: 1_000, cost: 11, allowed: false, remaining: 10, retryMs: 100, resetMs: 99_000}},
	})
}

// TestLeakyBucketRateCut: a leaky bucket's queued work is carried too, and
// drains at the new rate.
func TestLeakyBucketRateCut(t *testing.T) {
	fast := bucketPolicy(t, LeakyBucket, 100, 10, ScopeRegion)
	slow := bucketPolicy(t, LeakyBucket, 10, 10, ScopeRegion)
	runChanges(t, 1, []change{
		{p: fast, step: step{ms: 0, cost: 5, allowed: true, remaining: 5, resetMs: 50}},
		{p: slow, step: step{ms: 0, cost: 1, allowed: true, remaining: 4, resetMs: 600, delayMs: 500}},
		{p: slow, step: step{ms: 100, cost: 0, allowed: true, remaining: 5, resetMs: 500, delayMs: 500}},
	})
}

// TestShareChangeCarriesTokens: the coordinator's share record changes the
// rate of a global bucket like an edit does.
func TestShareChangeCarriesTokens(t *testing.T) {
	p := bucketPolicy(t, TokenBucket, 1500, 3000, ScopeGlobal) // three regions: 500/s, 1000
	runChanges(t, 3, []change{
		{p: p, step: step{ms: 0, cost: 1000, allowed: true, remaining: 0, resetMs: 2_000}},
		{p: p, share: []int64{50_000, 1_000_000}, step: step{ms: 0, cost: 0, allowed: true, remaining: 0, resetMs: 20_000}},
		{p: p, step: step{ms: 2_000, cost: 0, allowed: true, remaining: 100, resetMs: 18_000}},
		{p: p, share: []int64{50_000, 50_000}, step: step{ms: 2_000, cost: 1, allowed: true, remaining: 49, resetMs: 20}},
		{p: p, share: []int64{500_000, 1_000_000}, step: step{ms: 2_000, cost: 0, allowed: true, remaining: 49, resetMs: 1_902}},
	})
}

// TestZeroRateShare: a share whose rate is 0 refills nothing. The bucket
// admits what it holds, then rejects with retry never; its reset (and its
// key's life) is the time to fill at the policy's own default share (here
// 3/s over three regions: 1/s). A positive rate later refills from what
// was left. Before, the script divided by zero (a store error) and the
// memory store admitted everything.
func TestZeroRateShare(t *testing.T) {
	p := bucketPolicy(t, TokenBucket, 3, 30, ScopeGlobal)
	runChanges(t, 3, []change{
		{p: p, share: []int64{0, 5_000}, step: step{ms: 0, cost: 3, allowed: true, remaining: 2, resetMs: 3_000}},
		{p: p, step: step{ms: 100, cost: 2, allowed: true, remaining: 0, resetMs: 5_000}},
		{p: p, step: step{ms: 200, cost: 1, allowed: false, remaining: 0, retryMs: -1, resetMs: 5_000}},
		{p: p, step: step{ms: 1_000, cost: 1, allowed: false, remaining: 0, retryMs: -1, resetMs: 5_000}},
		{p: p, step: step{ms: 1_000, cost: 0, allowed: true, remaining: 0, resetMs: 5_000}},
		{p: p, share: []int64{2_000, 5_000}, step: step{ms: 1_100, cost: 0, allowed: true, remaining: 2, resetMs: 1_500}},
		{p: p, share: []int64{0, 0}, step: step{ms: 1_100, cost: 1, allowed: false, remaining: 0, retryMs: -1, resetMs: 0}},
		{p: p, step: step{ms: 1_100, cost: 0, allowed: true, remaining: 0, resetMs: 0}},
	})
}

// TestZeroRateLeakyBucket: a leaky bucket whose share drains nothing
// forwards what fits in its queue at once (there is no drain to wait for)
// and then rejects with retry never.
func TestZeroRateLeakyBucket(t *testing.T) {
	p := bucketPolicy(t, LeakyBucket, 2, 4, ScopeGlobal) // two regions: 1/s, 2
	runChanges(t, 2, []change{
		{p: p, share: []int64{0, 2_000}, step: step{ms: 0, cost: 1, allowed: true, remaining: 1, resetMs: 1_000}},
		{p: p, step: step{ms: 0, cost: 1, allowed: true, remaining: 0, resetMs: 2_000}},
		{p: p, step: step{ms: 500, cost: 1, allowed: false, remaining: 0, retryMs: -1, resetMs: 2_000}},
	})
}

// TestShareRecordsAreClamped: share records outside what the parser
// allows (negative, above the maxima) decide as the nearest bound, alike
// in both stores.
func TestShareRecordsAreClamped(t *testing.T) {
	p := bucketPolicy(t, TokenBucket, 10, 10, ScopeGlobal)
	runChanges(t, 1, []change{
		{p: p, share: []int64{-5, -5}, step: step{ms: 0, cost: 1, allowed: false, remaining: 0, retryMs: -1, resetMs: 0}},
		{p: p, share: []int64{10_000_000_000_000, 2_000_000_000}, step: step{ms: 0, cost: 0, allowed: true, remaining: 1_000_000, resetMs: 0}},
		{p: p, step: step{ms: 0, cost: 1_000_000, allowed: true, remaining: 0, resetMs: 1}},
	})
}

// TestBucketStateBeforeTokens: a bucket written by the script before
// buckets kept their tokens (a decimal "µs when full") still decides as
// it did, so an upgrade mints nothing.
func TestBucketStateBeforeTokens(t *testing.T) {
	client := redistest.StartServer(t).Client()
	rs := NewRedisStore(client)
	rs.decideAtGivenTime()
	p := bucketPolicy(t, TokenBucket, 10, 20, ScopeRegion)
	l, err := New(Config{Store: rs}, []*Policy{p})
	require.NoError(t, err)
	subj := Subject{Kind: SubjectAPIKey, Value: "old"}
	ctx := context.Background()
	// Full again 1.5 s after t0: 15 tokens missing.
	require.NoError(t, client.Set(ctx, StateKey(subj, p), at(1_500).UnixMicro(), time.Minute).Err())
	d, err := l.checkSubjectAt(ctx, at(0), subj, []*Policy{p}, 1)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, int64(4), d.Policies[0].Remaining)
	assert.Equal(t, 1600*time.Millisecond, d.Policies[0].ResetAfter)
	v, err := client.Get(ctx, StateKey(subj, p)).Result()
	require.NoError(t, err)
	assert.Len(t, v, 12, "rewritten in the new layout")
}

// TestBucketAgainstNaiveReference: on whole milliseconds, with the rate and
// burst changing at random between decisions, the memory store admits
// exactly what a naive token count admits: at each decision the bucket
// holds min(burst, tokens at the last admission + elapsed since it x the
// rate read now), and an admission takes its cost; rate 0 refills nothing.
// (The store does not know when between two admissions a share or policy
// changed, so the rate read at a decision counts from the last admission;
// and a state left alone until it would be full at the rate of its last
// admission, plus a second, has expired and is full.)
func TestBucketAgainstNaiveReference(t *testing.T) {
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 11))
		store := NewMemoryStore()
		l, err := New(Config{Store: store}, []*Policy{bucketPolicy(t, TokenBucket, 1, 1, ScopeRegion)})
		require.NoError(t, err)
		subj := Subject{Kind: SubjectAPIKey, Value: "ref"}
		rateMilli, burstMilli := int64(1000), int64(10_000)
		// The reference: nano-tokens at the last admission, and its time.
		lastTokens, lastMs, expireMs := burstMilli*nanoPerMilli, int64(0), int64(0)
		nowMs := int64(0)
		for step := range 300 {
			if rng.IntN(5) == 0 {
				rateMilli = pick[int64](rng, 0, 1, 500, 50_000, 1_000_000, rng.Int64N(2_000_000))
			}
			if rng.IntN(8) == 0 {
				burstMilli = pick[int64](rng, 1000, 5_000, 100_000, 1000*(1+rng.Int64N(200)))
			}
			// The bucket is global so that a share record carries the rate,
			// including 0, which no policy can state.
			p := mustPolicy(t, fmt.Sprintf(`{"id":"r","algorithm":"token_bucket","rate_per_sec":1,"burst":%d,"scope":"global"}`, burstMilli/1000))
			store.SetShare(at(nowMs), subj, "r", rateMilli, burstMilli, 0)
			nowMs += pick[int64](rng, 0, 1, 7, 100, 1_000, rng.Int64N(60_000))
			capN := burstMilli * nanoPerMilli
			add := min((nowMs-lastMs)*1000*rateMilli, capN) // no overflow: both bounded
			tokens := min(capN, lastTokens+add)
			if nowMs >= expireMs {
				tokens = capN // the state expired: full, as the rate of its write had it
			}
			cost := pick[int64](rng, 0, 1, 1, 2, 5, 20)
			d, err := l.checkSubjectAt(context.Background(), at(nowMs), subj, []*Policy{p}, cost)
			require.NoError(t, err)
			wantAdmit := cost*1000 <= burstMilli && tokens >= cost*nano
			if wantAdmit && cost > 0 {
				tokens -= cost * nano
				lastTokens, lastMs = tokens, nowMs
				fill := rateMilli
				if fill == 0 {
					fill = 1000 // the policy's own rate
				}
				expireMs = nowMs + ceilDiv(ceilDiv(capN-tokens, fill), 1000) + 1000
			}
			pd := d.Policies[0]
			require.Equal(t, wantAdmit, d.Allowed, "seed %d step %d", seed, step)
			require.Equal(t, tokens/nano, pd.Remaining, "seed %d step %d", seed, step)
			require.Equal(t, !wantAdmit && (cost*1000 > burstMilli || rateMilli == 0), pd.Never, "seed %d step %d", seed, step)
		}
	}
}

// TestHugeCostIsNever: a request cost so large that the arithmetic on it
// would overflow an int64 (cost x 1000 for buckets, count + cost for
// windows) is rejected as never admissible, as the script (in doubles)
// rejects it, not admitted by a wrapped sum.
func TestHugeCostIsNever(t *testing.T) {
	for _, doc := range []string{
		`{"id":"tb","algorithm":"token_bucket","rate_per_sec":10,"burst":10}`,
		`{"id":"fw","algorithm":"fixed_window","limit":10,"window_s":60}`,
		`{"id":"fg","algorithm":"fixed_window","limit":10,"window_s":60,"scope":"global"}`,
		`{"id":"sl","algorithm":"sliding_window_log","limit":10,"window_s":60}`,
		`{"id":"sc","algorithm":"sliding_window_counter","limit":10,"window_s":60}`,
	} {
		p := mustPolicy(t, doc)
		l, err := New(Config{Region: "us-east"}, []*Policy{p})
		require.NoError(t, err)
		subj := Subject{Kind: SubjectAPIKey, Value: "k"}
		d, err := l.checkSubjectAt(context.Background(), at(0), subj, []*Policy{p}, 1) // state to add to
		require.NoError(t, err)
		require.True(t, d.Allowed, p.ID)
		for _, cost := range []int64{math.MaxInt64 / 999, math.MaxInt64/1000 + 1, math.MaxInt64 - 1, math.MaxInt64} {
			d, err := l.checkSubjectAt(context.Background(), at(0), subj, []*Policy{p}, cost)
			require.NoError(t, err)
			require.False(t, d.Allowed, "%s: cost %d", p.ID, cost)
			require.True(t, d.Policies[0].Never, "%s: cost %d", p.ID, cost)
		}
	}
}
