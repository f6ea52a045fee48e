package limiter

import (
	"context"
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
			d, err := l.CheckSubjectAt(context.Background(), l.Now(), subj, []*Policy{p}, 0)
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
