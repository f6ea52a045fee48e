package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// The pair of issue #19: a per-key burst and a per-account hourly quota.
const keyAccountPolicies = `[
	{"id":"burst","subject":"api_key","algorithm":"token_bucket","rate_per_sec":0.01,"burst":5},
	{"id":"acct","subject":"account","algorithm":"fixed_window","limit":8,"window_s":3600}]`

// aonServer is one way of running the pair against real Redis:
// a client, and the account name to use with keys k3 and k4 (on a
// cluster, chosen so that the account's slot is on the same node as the
// keys', or on another one).
type aonServer struct {
	name    string
	client  redis.UniversalClient
	account string
}

// aonServers starts a standalone redis-server and a three-node cluster,
// picks n API key names on one cluster node (from prefix3 on), and returns
// them with the three layouts: standalone, cluster with the account on the
// keys' node (one script call), cluster with the account on another node
// (calls in order, with refunds).
func aonServers(t *testing.T, prefix string, n int) ([]string, []aonServer) {
	t.Helper()
	srv := redistest.StartServer(t)
	cl := redistest.StartCluster(t).Client()
	keys := keysOnOneNode(t, cl, prefix, n)
	same, other := accountsByNode(t, cl, keys...)
	return keys, []aonServer{
		{"standalone", srv.Client(), "acme"},
		{"cluster_same_node", cl, same},
		{"cluster_other_node", cl, other},
	}
}

// flush empties every node behind client.
func flush(t *testing.T, client redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	if cl, ok := client.(*redis.ClusterClient); ok {
		require.NoError(t, cl.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.FlushAll(ctx).Err() }))
		return
	}
	require.NoError(t, client.FlushAll(ctx).Err())
}

// accountsByNode finds two account names: one whose keys live on the node
// of every given API key (all keys must share a node), one on another node
// than all of them.
func accountsByNode(t *testing.T, cl *redis.ClusterClient, keys ...string) (same, other string) {
	t.Helper()
	ctx := context.Background()
	node := func(s Subject) string {
		c, err := cl.MasterForKey(ctx, stateKey(s.Key(), "x", "tb"))
		require.NoError(t, err)
		return c.Options().Addr
	}
	keyNodes := map[string]bool{}
	for _, k := range keys {
		keyNodes[node(Subject{Kind: SubjectAPIKey, Value: k})] = true
	}
	require.Len(t, keyNodes, 1, "the test's keys must share one node")
	for i := 0; (same == "" || other == "") && i < 10_000; i++ {
		a := "acme-" + strconv.Itoa(i)
		if keyNodes[node(Subject{Kind: SubjectAccount, Value: a})] {
			if same == "" {
				same = a
			}
		} else if other == "" {
			other = a
		}
	}
	require.NotEmpty(t, same)
	require.NotEmpty(t, other)
	return same, other
}

// keysOnOneNode returns n API key names (prefix + i) whose slots share
// one cluster node.
func keysOnOneNode(t *testing.T, cl *redis.ClusterClient, prefix string, n int) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	var addr string
	for i := 3; len(out) < n && i < 10_000; i++ {
		k := prefix + strconv.Itoa(i)
		c, err := cl.MasterForKey(ctx, stateKey(Subject{Kind: SubjectAPIKey, Value: k}.Key(), "x", "tb"))
		require.NoError(t, err)
		if a := c.Options().Addr; addr == "" || a == addr {
			addr = a
			out = append(out, k)
		}
	}
	require.Len(t, out, n)
	return out
}

// fixedClock is a Clock that stays at one time.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

// aonLimiter is a limiter on client that decides at the fixed time now
// (given to the script: no hour boundary or refill during the test), with
// a deadline long enough for a loaded machine and the deny cache on or
// off.
func aonLimiter(t *testing.T, client redis.UniversalClient, policies string, now time.Time, denyCache bool) (*Limiter, *RedisStore) {
	t.Helper()
	rs := NewRedisStore(client)
	rs.decideAtGivenTime()
	cfg := Config{Store: rs, Clock: fixedClock{now}, Deadline: 5 * time.Second}
	if !denyCache {
		cfg.DenyCacheMaxKeys = -1
	}
	l, err := New(cfg, mustPolicies(t, policies))
	require.NoError(t, err)
	return l, rs
}

// midHour is the middle of the current hour: the fixed windows of the
// tests never end while they run.
func midHour() time.Time { return time.Now().Truncate(time.Hour).Add(30 * time.Minute) }

// sendStatus sends n requests as key of account and returns their
// outcomes ("200" or "429").
func sendStatus(t *testing.T, l *Limiter, key, account string, n int) []string {
	t.Helper()
	var out []string
	for range n {
		d, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: key, Account: account}})
		require.NoError(t, err)
		require.NotEqual(t, SourceFallback, d.Source, "the store must answer")
		if d.Allowed {
			out = append(out, "200")
		} else {
			out = append(out, "429")
		}
	}
	return out
}

// peek is what the store holds for one policy of one subject: a cost-0
// evaluation, which writes nothing.
func peek(t *testing.T, l *Limiter, subj Subject, id string) PolicyDecision {
	t.Helper()
	for _, p := range l.Policies() {
		if p.ID == id {
			d, err := l.checkSubjectAt(context.Background(), l.Now(), subj, []*Policy{p}, 0)
			require.NoError(t, err)
			return d.Policies[0]
		}
	}
	t.Fatalf("no policy %q", id)
	return PolicyDecision{}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestAllOrNothingKeyThenAccount is issue #19's example: k3 sends 8
// requests (5 admitted by its burst, 3 rejected by it); the rejected ones
// must not count against the account, so k4, another key of the account,
// is admitted 3 times (8 - 5), then rejected by the account.
func TestAllOrNothingKeyThenAccount(t *testing.T) {
	keys, servers := aonServers(t, "k", 2)
	k3, k4 := keys[0], keys[1]
	for _, srv := range servers {
		for _, deny := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/deny_cache_%v", srv.name, deny), func(t *testing.T) {
				flush(t, srv.client)
				l, _ := aonLimiter(t, srv.client, keyAccountPolicies, midHour(), deny)
				account := srv.account
				assert.Equal(t, append(repeat("200", 5), repeat("429", 3)...), sendStatus(t, l, k3, account, 8))
				assert.Equal(t, int64(3), peek(t, l, Subject{Kind: SubjectAccount, Value: account}, "acct").Remaining,
					"the account counts only k3's admitted requests")
				assert.Equal(t, append(repeat("200", 3), repeat("429", 2)...), sendStatus(t, l, k4, account, 5))
				assert.Equal(t, int64(2), peek(t, l, Subject{Kind: SubjectAPIKey, Value: k4}, "burst").Remaining,
					"k4's burst gave only its 3 admitted requests")
			})
		}
	}
}

// TestAllOrNothingAccountThenKey is the reverse: once the account is
// exhausted, a fresh key of the account is rejected and its burst stays
// whole (on a cluster with the account on another node: consumed, then
// refunded).
func TestAllOrNothingAccountThenKey(t *testing.T) {
	keys, servers := aonServers(t, "a", 3)
	for _, srv := range servers {
		for _, deny := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/deny_cache_%v", srv.name, deny), func(t *testing.T) {
				flush(t, srv.client)
				l, rs := aonLimiter(t, srv.client, keyAccountPolicies, midHour(), deny)
				account := srv.account
				require.Equal(t, repeat("200", 5), sendStatus(t, l, keys[0], account, 5))
				require.Equal(t, repeat("200", 3), sendStatus(t, l, keys[1], account, 3))
				got := sendStatus(t, l, keys[2], account, 4)
				assert.Equal(t, repeat("429", 4), got)
				k5 := peek(t, l, Subject{Kind: SubjectAPIKey, Value: keys[2]}, "burst")
				assert.Equal(t, int64(5), k5.Remaining, "a rejected request spent nothing from the key's burst")
				n, err := srv.client.Exists(context.Background(), StateKey(Subject{Kind: SubjectAPIKey, Value: keys[2]}, l.Policies()[0])).Result()
				require.NoError(t, err)
				if srv.name == "cluster_other_node" {
					// Consumed, then given back exactly: the key is
					// there, at the state of a full bucket.
					assert.Equal(t, int64(0), rs.RefundFailures())
				} else {
					assert.Equal(t, int64(0), n, "one atomic call wrote nothing for the key")
				}
			})
		}
	}
}

// TestAllOrNothingConcurrent: 12 goroutines, one key each, all of one
// account, 20 requests each against a key burst of 10 and an account
// limit of 50. The account's count never exceeds its limit and equals the
// admitted requests exactly, and each key's burst spent exactly its own
// admitted requests (no rejected request spent anything on either side).
func TestAllOrNothingConcurrent(t *testing.T) {
	const keys, perKey, burst, limit = 12, 20, 10, 50
	policies := fmt.Sprintf(`[
		{"id":"burst","subject":"api_key","algorithm":"token_bucket","rate_per_sec":0.01,"burst":%d},
		{"id":"acct","subject":"account","algorithm":"fixed_window","limit":%d,"window_s":3600}]`, burst, limit)
	srv := redistest.StartServer(t)
	cl := redistest.StartCluster(t).Client()
	names := keysOnOneNode(t, cl, "c", keys)
	same, other := accountsByNode(t, cl, names...)
	for _, s := range []aonServer{{"standalone", srv.Client(), "acme"}, {"cluster_same_node", cl, same}, {"cluster_other_node", cl, other}} {
		t.Run(s.name, func(t *testing.T) {
			flush(t, s.client)
			l, rs := aonLimiter(t, s.client, policies, midHour(), false)
			admitted := make([]int, keys)
			var wg sync.WaitGroup
			for g := range keys {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range perKey {
						d, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: names[g], Account: s.account}})
						if !assert.NoError(t, err) || !assert.NotEqual(t, SourceFallback, d.Source) {
							return
						}
						if d.Allowed {
							admitted[g]++
						}
					}
				}()
			}
			wg.Wait()
			total := 0
			for g, a := range admitted {
				total += a
				assert.Equal(t, int64(burst-a), peek(t, l, Subject{Kind: SubjectAPIKey, Value: names[g]}, "burst").Remaining, "key %s", names[g])
			}
			assert.Equal(t, limit, total, "the account admits exactly its limit (demand is %d)", keys*perKey)
			v, err := s.client.Get(context.Background(), StateKey(Subject{Kind: SubjectAccount, Value: s.account}, l.Policies()[1])).Result()
			require.NoError(t, err)
			_, count, ok := strings.Cut(v, ":")
			require.True(t, ok, v)
			assert.Equal(t, strconv.Itoa(total), count, "the account's stored count equals the admitted requests")
			assert.Equal(t, int64(0), rs.RefundFailures())
		})
	}
}

// TestAllOrNothingDenyCacheAnswersForTheRequest: once the store rejected
// the account, a request of another key of the account is rejected from
// the deny cache with no store call at all, and the key's state is
// untouched (before, the key's group still went to the store and
// consumed).
func TestAllOrNothingDenyCacheAnswersForTheRequest(t *testing.T) {
	fs := newFlakyStore()
	clock := newManualClock()
	l, err := New(Config{Store: fs, Clock: clock}, mustPolicies(t, keyAccountPolicies))
	require.NoError(t, err)
	ctx := context.Background()
	for i := range 8 {
		d, err := l.Check(ctx, Request{Identity: Identity{APIKey: fmt.Sprintf("k%d", i), Account: "acme"}})
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	d, err := l.Check(ctx, Request{Identity: Identity{APIKey: "k8", Account: "acme"}})
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, SourceStore, d.Source)
	calls := fs.calls.Load()
	d, err = l.Check(ctx, Request{Identity: Identity{APIKey: "k9", Account: "acme"}})
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, SourceDenyCache, d.Source)
	require.Len(t, d.Policies, 1, "only the cached policy is reported")
	assert.Equal(t, "acct", d.Policies[0].Policy.ID)
	assert.Equal(t, calls, fs.calls.Load(), "no store call for any subject")
	lm, err := New(Config{Store: fs.mem, Clock: clock}, mustPolicies(t, keyAccountPolicies))
	require.NoError(t, err)
	for _, k := range []string{"k8", "k9"} {
		assert.Equal(t, int64(5), peek(t, lm, Subject{Kind: SubjectAPIKey, Value: k}, "burst").Remaining, k)
	}
}

// TestAllOrNothingFallback: while the store is down, the fallback limiters
// of all the request's subjects decide together: the account's fallback
// (limit 8 x OpenFactor 2 = 16 at once) refusing leaves the key's fallback
// (burst 20 x 2 = 40) unspent.
func TestAllOrNothingFallback(t *testing.T) {
	fs := newFlakyStore()
	fs.failing.Store(true)
	l, err := New(Config{Store: fs, Clock: newManualClock()}, mustPolicies(t, `[
		{"id":"burst","subject":"api_key","algorithm":"token_bucket","rate_per_sec":0.01,"burst":20},
		{"id":"acct","subject":"account","algorithm":"fixed_window","limit":8,"window_s":3600}]`))
	require.NoError(t, err)
	ctx := context.Background()
	admitted := 0
	for range 25 {
		d, err := l.Check(ctx, Request{Identity: Identity{APIKey: "k", Account: "acme"}})
		require.NoError(t, err)
		require.Equal(t, SourceFallback, d.Source)
		if d.Allowed {
			admitted++
		}
	}
	assert.Equal(t, 16, admitted, "the account's fallback admits 16")
	// Remaining is reported at most the policy's burst (20): probe the
	// fallback's own count with costs instead. 24 are left, not 40-25.
	key := Subject{Kind: SubjectAPIKey, Value: "k"}
	d, err := l.checkSubjectFallbackAt(l.Now(), key, l.Policies()[:1], 0)
	require.NoError(t, err)
	assert.Equal(t, int64(20), d.Policies[0].Remaining, "remaining is stated against the policy's burst")
	d, err = l.checkSubjectFallbackAt(l.Now(), key, l.Policies()[:1], 25)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "the key's fallback has fewer than 25 left")
	d, err = l.checkSubjectFallbackAt(l.Now(), key, l.Policies()[:1], 24)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "the key's fallback spent only the 16 admitted requests")
}

// TestAllOrNothingUsage: a request that the account rejects counts its
// global key policy's demand but admits nothing, and a skipped or
// rejected subject's global policy is counted as demand too.
func TestAllOrNothingUsage(t *testing.T) {
	clock := newManualClock()
	l, err := New(Config{Clock: clock}, mustPolicies(t, `[
		{"id":"g","subject":"api_key","algorithm":"token_bucket","rate_per_sec":1,"burst":100,"scope":"global"},
		{"id":"acct","subject":"account","algorithm":"fixed_window","limit":2,"window_s":3600}]`))
	require.NoError(t, err)
	for range 5 {
		_, err := l.Check(context.Background(), Request{Identity: Identity{APIKey: "k", Account: "acme"}})
		require.NoError(t, err)
	}
	got := l.usage.take()
	require.Len(t, got, 1)
	assert.Equal(t, int64(5), got[0].Demand, "every attempt")
	assert.Equal(t, int64(2), got[0].Admitted, "only what was consumed")
	assert.Equal(t, int64(98), peek(t, l, Subject{Kind: SubjectAPIKey, Value: "k"}, "g").Remaining)
}

func TestCheckSubjectsIntoErrorsName(t *testing.T) {
	l, err := New(Config{}, mustPolicies(t, keyAccountPolicies))
	require.NoError(t, err)
	ps := l.Policies()
	k := Subject{Kind: SubjectAPIKey, Value: "k"}
	var d Decision
	err = l.CheckSubjectsInto(context.Background(), l.Now(), []SubjectPolicies{{k, ps[:1]}, {k, ps[1:]}}, Request{}, &d)
	assert.ErrorContains(t, err, "subject k:k listed twice")
	err = l.CheckSubjectsInto(context.Background(), l.Now(), []SubjectPolicies{{k, []*Policy{ps[0], ps[0]}}}, Request{}, &d)
	assert.ErrorContains(t, err, `policy "burst" listed twice`)
	err = l.CheckSubjectsInto(context.Background(), l.Now(), []SubjectPolicies{{k, []*Policy{{ID: "raw"}}}}, Request{}, &d)
	assert.ErrorIs(t, err, ErrNoPolicies)
	// Several subjects of one kind (two descriptors naming two keys): one
	// request, all or nothing.
	k2 := Subject{Kind: SubjectAPIKey, Value: "k2"}
	acct := Subject{Kind: SubjectAccount, Value: "acme"}
	for range 5 {
		require.NoError(t, l.CheckSubjectsInto(context.Background(), l.Now(), []SubjectPolicies{{k, ps[:1]}, {acct, ps[1:]}}, Request{}, &d))
		require.True(t, d.Allowed)
	}
	require.NoError(t, l.CheckSubjectsInto(context.Background(), l.Now(), []SubjectPolicies{{k2, ps[:1]}, {k, ps[:1]}, {acct, ps[1:]}}, Request{}, &d))
	assert.False(t, d.Allowed, "k's burst is empty")
	assert.Equal(t, int64(5), peek(t, l, k2, "burst").Remaining, "k2 spent nothing")
	assert.Equal(t, int64(3), peek(t, l, acct, "acct").Remaining, "the account spent nothing")
}

// TestRefundOfATouchedBucketNeverMints: a bucket refunded after another
// request consumed from it in between is given back at most what keeps
// it no fuller than it would be without the refunded request, and at
// most the refund window x rate tokens less; untouched, it is restored
// exactly.
func TestRefundOfATouchedBucketNeverMints(t *testing.T) {
	rs := NewRedisStore(redistest.StartServer(t).Client())
	rs.decideAtGivenTime()
	ctx := context.Background()
	p := mustPolicy(t, `{"id":"tb","algorithm":"token_bucket","rate_per_sec":10,"burst":10}`)
	l, err := New(Config{Store: rs}, []*Policy{p})
	require.NoError(t, err)
	tc := time.Now().Add(time.Hour).Truncate(time.Second)
	consume := func(subj Subject, at time.Time, cost int64) *refundInfo {
		ops := []op{l.opFor(p, cost)}
		ri := &refundInfo{r: make([][5]int64, 1), wrote: make([]bool, 1)}
		ok, _, err := rs.evalCall(ctx, at, []Subject{subj}, ops, make([]result, 1), ri)
		require.NoError(t, err)
		require.True(t, ok)
		return ri
	}
	// tokens is what the stored bucket holds at at (nano-tokens).
	tokens := func(subj Subject, at time.Time) int64 {
		v, err := rs.client.Get(ctx, StateKey(subj, p)).Result()
		if errors.Is(err, redis.Nil) {
			return p.burstMilli * nanoPerMilli // no state: a full bucket
		}
		require.NoError(t, err)
		st := decodeBucket(t, v)
		return bucketTokens(&st, at.UnixMicro(), p.rateMilli, p.burstMilli*nanoPerMilli)
	}
	// Untouched: the key is gone again, as without the request; and a
	// state that existed is restored byte for byte.
	a := Subject{Kind: SubjectAPIKey, Value: "untouched"}
	ri := consume(a, tc, 5)
	tr := tc.Add(2 * time.Millisecond)
	require.NoError(t, rs.refund(ctx, tr, a, []op{l.opFor(p, 5)}, ri, 0, ri.nowUs))
	n, err := rs.client.Exists(ctx, StateKey(a, p)).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(0), n)
	consume(a, tc, 3)
	before, err := rs.client.Get(ctx, StateKey(a, p)).Result()
	require.NoError(t, err)
	ri = consume(a, tc.Add(time.Millisecond), 4)
	require.NoError(t, rs.refund(ctx, tr, a, []op{l.opFor(p, 4)}, ri, 0, ri.nowUs))
	after, err := rs.client.Get(ctx, StateKey(a, p)).Result()
	require.NoError(t, err)
	assert.Equal(t, before, after)

	// Touched: another request of cost 1 at tc+1ms. Without the refunded
	// request it would have found the bucket full: 9 tokens left then,
	// 9.01 at tc+2ms.
	b := Subject{Kind: SubjectAPIKey, Value: "touched"}
	ri = consume(b, tc, 5)
	consume(b, tc.Add(time.Millisecond), 1)
	require.NoError(t, rs.refund(ctx, tr, b, []op{l.opFor(p, 5)}, ri, 0, ri.nowUs))
	exact := int64(9*nano) + 10*nano/1000
	got := tokens(b, tr)
	assert.LessOrEqual(t, got, exact, "never fuller than without the request")
	assert.GreaterOrEqual(t, got, exact-tr.Sub(tc).Microseconds()*p.rateMilli, "at most the refund window's refill withheld")
}

// decodeBucket reads a bucket's 12 bytes (script.lua) into the state the
// MemoryStore keeps.
func decodeBucket(t *testing.T, v string) state {
	t.Helper()
	require.Len(t, v, 12, "bucket state %q", v)
	var h, l int64
	for i := range 6 {
		h = h<<8 | int64(v[i])
		l = l<<8 | int64(v[6+i])
	}
	return state{a: (h%16)<<48 + l - 1<<51, b: h / 16}
}

// TestAllOrNothingStaleSlotMap: when the client believes a request's
// subjects share a node and they do not (a stale slot map), the one call
// fails before writing anything and the request is decided in order.
func TestAllOrNothingStaleSlotMap(t *testing.T) {
	cl := redistest.StartCluster(t).Client()
	keys := keysOnOneNode(t, cl, "s", 1)
	_, other := accountsByNode(t, cl, keys...)
	l, rs := aonLimiter(t, cl, keyAccountPolicies, midHour(), false)
	rs.assumeOneNode = true
	ctx := context.Background()
	key, acct := Subject{Kind: SubjectAPIKey, Value: keys[0]}, Subject{Kind: SubjectAccount, Value: other}
	ps := l.Policies()
	ops := []op{l.opFor(ps[0], 1), l.opFor(ps[1], 1)}
	_, _, err := rs.evalCall(ctx, l.Now(), []Subject{key, acct}, ops, make([]result, 2), nil)
	require.ErrorContains(t, err, "non local key")
	n, err := cl.Exists(ctx, StateKey(key, ps[0])).Result()
	require.NoError(t, err)
	require.Equal(t, int64(0), n, "the failed call wrote nothing")
	assert.Equal(t, append(repeat("200", 5), repeat("429", 3)...), sendStatus(t, l, keys[0], other, 8))
	assert.Equal(t, int64(3), peek(t, l, acct, "acct").Remaining)
}

// TestCheckSubjectsAtRaw: the raw multi-subject paths (the simulator's)
// are all or nothing across subjects too, in the store and in the
// fallback.
func TestCheckSubjectsAtRaw(t *testing.T) {
	l, err := New(Config{Clock: newManualClock()}, mustPolicies(t, keyAccountPolicies))
	require.NoError(t, err)
	ps := l.Policies()
	ctx := context.Background()
	acct := Subject{Kind: SubjectAccount, Value: "acme"}
	req := func(key string) []SubjectPolicies {
		return []SubjectPolicies{{Subject{Kind: SubjectAPIKey, Value: key}, ps[:1]}, {acct, ps[1:]}}
	}
	var got []bool
	for range 8 {
		d, err := l.checkSubjectsAt(ctx, l.Now(), req("k3"), 1)
		require.NoError(t, err)
		got = append(got, d.Allowed)
	}
	assert.Equal(t, []bool{true, true, true, true, true, false, false, false}, got)
	for i := range 4 {
		d, err := l.checkSubjectsAt(ctx, l.Now(), req("k4"), 1)
		require.NoError(t, err)
		assert.Equal(t, i < 3, d.Allowed, "k4 request %d", i)
	}
	// Fallback: the account's limiter (8 x 2) refuses after 16, the key's
	// (5 x 2) after 10; k5 spends 10, then k6 gets the account's last 6.
	got = got[:0]
	for _, k := range []string{"k5", "k5", "k5", "k5", "k5", "k5", "k5", "k5", "k5", "k5", "k5", "k5"} {
		d, err := l.checkSubjectsFallbackAt(l.Now(), req(k), 1)
		require.NoError(t, err)
		got = append(got, d.Allowed)
	}
	assert.Equal(t, append(repeat2(true, 10), false, false), got)
	admitted := 0
	for range 10 {
		d, err := l.checkSubjectsFallbackAt(l.Now(), req("k6"), 1)
		require.NoError(t, err)
		if d.Allowed {
			admitted++
		}
	}
	assert.Equal(t, 6, admitted, "k5's refused requests did not spend the account's fallback")
}

func repeat2(v bool, n int) []bool {
	out := make([]bool, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// TestAllOrNothingLaterNodeDown: across nodes, when the key's call has
// consumed and the account's node does not answer, the key is refunded
// and the fallback answers the request: nothing stays spent in Redis for
// a request the store did not decide.
func TestAllOrNothingLaterNodeDown(t *testing.T) {
	c := redistest.StartCluster(t)
	cl := c.Client()
	keys := keysOnOneNode(t, cl, "d", 1)
	_, other := accountsByNode(t, cl, keys...)
	l, rs := aonLimiter(t, cl, keyAccountPolicies, midHour(), false)
	ctx := context.Background()
	acctNode, err := cl.MasterForKey(ctx, StateKey(Subject{Kind: SubjectAccount, Value: other}, l.Policies()[1]))
	require.NoError(t, err)
	for _, n := range c.Nodes() {
		if n.Addr() == acctNode.Options().Addr {
			n.Stop()
		}
	}
	d, err := l.Check(ctx, Request{Identity: Identity{APIKey: keys[0], Account: other}})
	require.NoError(t, err)
	assert.Equal(t, SourceFallback, d.Source)
	n, err := cl.Exists(ctx, StateKey(Subject{Kind: SubjectAPIKey, Value: keys[0]}, l.Policies()[0])).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(0), n, "the key's consumption was given back")
	assert.Equal(t, int64(0), rs.RefundFailures())
}
