package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// batchPolicies: a bucket of 3 and a window of 4, so that a few requests
// of one subject in one call exhaust both, and requests of one call
// depend on each other.
func batchPolicies(t *testing.T) []*Policy {
	ps, err := ParsePolicies([]byte(`[
		{"id":"tb","algorithm":"token_bucket","rate_per_sec":1,"burst":3},
		{"id":"fw","algorithm":"fixed_window","limit":4,"window_s":60}]`))
	require.NoError(t, err)
	return ps
}

// batchReq is one request of a hand-built script call.
type batchReq struct {
	subjects []Subject
	ops      []op
	at       time.Time
	str      string
	rk       reqKeys
}

func buildBatchReq(t *testing.T, s *RedisStore, l *Limiter, at time.Time, cost int64, subjects ...Subject) batchReq {
	r := batchReq{at: at}
	for _, subj := range subjects {
		for _, p := range l.Policies() {
			r.subjects = append(r.subjects, subj)
			r.ops = append(r.ops, l.opFor(p, cost))
		}
	}
	buf, err := s.appendRequest(nil, at, r.subjects, r.ops, false, &r.rk)
	require.NoError(t, err)
	r.str = string(buf)
	return r
}

// runBatch sends reqs in one script call to client (keys: the first
// request's route) and returns each request's reply.
func runBatch(t *testing.T, client redis.Scripter, reqs []batchReq) []reqReply {
	args := make([]any, len(reqs))
	nvals := make([]int, len(reqs))
	for i, r := range reqs {
		args[i], nvals[i] = r.str, 5*len(r.ops)
	}
	route := reqs[0].str[reqs[0].rk.route[0]:reqs[0].rk.route[1]]
	v, err := scriptValues(evalScript.Run(context.Background(), client, []string{route}, args...))
	require.NoError(t, err)
	out := make([]reqReply, len(reqs))
	_, err = parseReply(v, nvals, out)
	require.NoError(t, err)
	return out
}

// TestScriptBatchDecidesInOrder: one script call of seven requests, five
// of them on one subject (so each depends on those before it) and one
// with two subjects, decides exactly as the in-memory store deciding the
// same requests one after the other: every field of every policy, and
// the state left behind (a request after the batch, decided by both).
func TestScriptBatchDecidesInOrder(t *testing.T) {
	srv := redistest.StartServer(t)
	rs := NewRedisStore(srv.Client())
	rs.decideAtGivenTime()
	lr, err := New(Config{Store: rs}, batchPolicies(t))
	require.NoError(t, err)
	ms := NewMemoryStore()
	at := time.Now().Add(time.Hour).Truncate(time.Minute).Add(10 * time.Second)
	a, b := Subject{Kind: SubjectAPIKey, Value: "a"}, Subject{Kind: SubjectAPIKey, Value: "b"}
	reqs := []batchReq{
		buildBatchReq(t, rs, lr, at, 1, a),
		buildBatchReq(t, rs, lr, at, 1, a),
		buildBatchReq(t, rs, lr, at.Add(time.Millisecond), 2, a), // 3 of the bucket's 3: rejected
		buildBatchReq(t, rs, lr, at.Add(2*time.Millisecond), 1, a),
		buildBatchReq(t, rs, lr, at.Add(3*time.Millisecond), 1, b, a), // a's bucket is empty: b consumes nothing
		buildBatchReq(t, rs, lr, at.Add(4*time.Millisecond), 1, b),
		buildBatchReq(t, rs, lr, at.Add(1500*time.Millisecond), 1, a), // refilled one token
	}
	got := runBatch(t, srv.Client(), reqs)
	allowedSeen := map[bool]int{}
	for i, r := range reqs {
		require.NoError(t, got[i].err, "request %d", i)
		res := make([]result, len(r.ops))
		allowed, err := ms.eval(context.Background(), r.at, r.subjects, r.ops, res)
		require.NoError(t, err)
		require.Equal(t, allowed, got[i].vals[0] == 1, "request %d: allowed", i)
		allowedSeen[allowed]++
		for j := range r.ops {
			v := got[i].vals[1+5*j:]
			want := res[j]
			require.Equal(t, []int64{b2i(want.allowed), want.remaining, want.resetMs, want.retryMs, want.delayMs}, v[:5], "request %d, op %d", i, j)
		}
	}
	// a: 1, 1 admitted; 2 rejected (1 token left); 1 admitted (empty);
	// b with a rejected; b admitted; a 1.5 s later admitted.
	require.Equal(t, map[bool]int{true: 5, false: 2}, allowedSeen, "the batch both admits and rejects")
	// The state left: one more request of each subject, alone.
	for _, subj := range []Subject{a, b} {
		after := at.Add(1600 * time.Millisecond)
		d, err := lr.checkSubjectAt(context.Background(), after, subj, lr.Policies(), 1)
		require.NoError(t, err)
		lm, err := New(Config{Store: ms}, lr.Policies())
		require.NoError(t, err)
		dm, err := lm.checkSubjectAt(context.Background(), after, subj, lm.Policies(), 1)
		require.NoError(t, err)
		require.Equal(t, dm.Allowed, d.Allowed, subj.Value)
		for j := range d.Policies {
			require.Equal(t, dm.Policies[j].Remaining, d.Policies[j].Remaining, "%s %s", subj.Value, d.Policies[j].Policy.ID)
		}
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// clusterSubjects returns n subjects whose keys (for policy p) live on
// the node of addr (same true) or on other nodes (same false).
func clusterSubjects(t *testing.T, c *redis.ClusterClient, p *Policy, addr string, same bool, n int, prefix string) []Subject {
	var out []Subject
	for i := 0; len(out) < n && i < 10_000; i++ {
		s := Subject{Kind: SubjectAPIKey, Value: fmt.Sprintf("%s-%d", prefix, i)}
		node, err := c.MasterForKey(context.Background(), StateKey(s, p))
		require.NoError(t, err)
		if (node.Options().Addr == addr) == same {
			out = append(out, s)
		}
	}
	require.Len(t, out, n)
	return out
}

// TestScriptBatchKeyOfAnotherNodeWritesNothing: on a three-node cluster,
// a call to one node carries a request whose second subject lives on
// another node. That request fails with the error eval looks for ("non
// local key") and writes nothing, not even for its first subject, which
// is on this node; the requests before and after it in the same call are
// decided and written.
func TestScriptBatchKeyOfAnotherNodeWritesNothing(t *testing.T) {
	cl := redistest.StartCluster(t)
	c := cl.Client()
	ctx := context.Background()
	rs := NewRedisStore(c)
	lr, err := New(Config{Store: rs}, batchPolicies(t))
	require.NoError(t, err)
	p := lr.Policies()[0]
	first := Subject{Kind: SubjectAPIKey, Value: "first"}
	node, err := c.MasterForKey(ctx, StateKey(first, p))
	require.NoError(t, err)
	addr := node.Options().Addr
	local := clusterSubjects(t, c, p, addr, true, 2, "local")
	remote := clusterSubjects(t, c, p, addr, false, 1, "remote")
	now := time.Now()
	reqs := []batchReq{
		buildBatchReq(t, rs, lr, now, 1, first),
		buildBatchReq(t, rs, lr, now, 1, local[0], remote[0]),
		buildBatchReq(t, rs, lr, now, 1, local[1]),
	}
	got := runBatch(t, node, reqs)
	require.NoError(t, got[0].err)
	require.Equal(t, int64(1), got[0].vals[0])
	require.ErrorIs(t, got[1].err, errNonLocal)
	require.Contains(t, got[1].err.Error(), "non local key")
	require.NoError(t, got[2].err)
	require.Equal(t, int64(1), got[2].vals[0])
	for _, q := range lr.Policies() {
		n, err := node.Exists(ctx, StateKey(local[0], q)).Result()
		require.NoError(t, err)
		require.Zero(t, n, "the failed request wrote %s", StateKey(local[0], q))
		for _, s := range []Subject{first, local[1]} {
			n, err := node.Exists(ctx, StateKey(s, q)).Result()
			require.NoError(t, err)
			require.Equal(t, int64(1), n, "the request of %s was written", s.Value)
		}
	}
}

// TestPipelineOneCallPerNode: a batch of 30 requests over a three-node
// cluster goes out as one script call per node (three), and every request
// is decided (admitted, consuming once: the bucket of each subject holds
// 2 of its 3 tokens after).
func TestPipelineOneCallPerNode(t *testing.T) {
	cl := redistest.StartCluster(t)
	c := cl.Client()
	rs := NewRedisStore(c)
	lr, err := New(Config{Store: rs}, batchPolicies(t))
	require.NoError(t, err)
	p := &pipeliner{client: c, cfg: DefaultPipelineConfig()}
	ctx := context.Background()
	var batch []*pending
	nodes := map[string]bool{}
	for i := range 30 {
		s := Subject{Kind: SubjectAPIKey, Value: fmt.Sprintf("s-%d", i)}
		r := buildBatchReq(t, rs, lr, time.Now(), 1, s)
		batch = append(batch, &pending{ctx: ctx, route: r.str[r.rk.route[0]:r.rk.route[1]], req: r.str, nvals: 5 * len(r.ops), done: make(chan struct{}, 1)})
		node, err := c.MasterForKey(ctx, batch[i].route)
		require.NoError(t, err)
		nodes[node.Options().Addr] = true
	}
	require.Len(t, nodes, 3, "the subjects spread over the three nodes")
	p.send(&batcher{}, batch)
	require.Equal(t, int64(3), p.calls.Load(), "one script call per node")
	require.Equal(t, int64(30), p.batched.Load())
	for i, req := range batch {
		<-req.done
		require.NoError(t, req.err, "request %d", i)
		require.Equal(t, []int64{1, 1, 2}, req.vals[:3], "request %d: allowed, bucket admits, 2 left", i)
	}
}

// TestPipelinedCheckEndsAtTheDeadline: through a pipelined store, Check
// waits for a call queued behind one that a paused Redis holds only until
// Config.Deadline (the pipeline's pooled timer, no context deadline from
// the caller), answers from the fallback, and once Redis answers again
// the call is not sent: its subject's bucket is untouched.
func TestPipelinedCheckEndsAtTheDeadline(t *testing.T) {
	store, l, srv, unpause, _ := pausedPipeline(t, 64)
	short, err := New(Config{Store: store, Deadline: 50 * time.Millisecond}, l.Policies())
	require.NoError(t, err)
	ctx := context.Background()
	start := time.Now()
	d, err := short.Check(ctx, Request{Identity: Identity{APIKey: "late"}})
	require.NoError(t, err)
	require.Equal(t, SourceFallback, d.Source)
	require.Less(t, time.Since(start), 5*time.Second, "answered at the 50 ms deadline, not when Redis came back")
	unpause()
	// One worker takes calls in order: when this one is answered, the
	// late call was either sent or dropped.
	after, err := l.checkSubjectAt(ctx, time.Now(), Subject{Kind: SubjectAPIKey, Value: "after"}, l.Policies(), 1)
	require.NoError(t, err)
	require.True(t, after.Allowed)
	n, err := srv.Client().Exists(ctx, StateKey(Subject{Kind: SubjectAPIKey, Value: "late"}, l.Policies()[0])).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the call of a caller past its deadline was not sent")
}

// TestRequestRouteIsStateKey: the first state key a request string
// carries (built from the subject's Key in parts, without allocating it)
// is StateKey, for subjects whose value needs no escaping and for those
// that do.
func TestRequestRouteIsStateKey(t *testing.T) {
	rs := NewRedisStore(nil)
	ps := benchPolicies(t)
	l, err := New(Config{Store: rs}, ps)
	require.NoError(t, err)
	for _, subj := range []Subject{
		{Kind: SubjectAPIKey, Value: "k_8f2a4c1d"},
		{Kind: SubjectIP, Value: "2001:db8::/48"},
		{Kind: SubjectUser, Value: "a b{c}%é"},
		{Kind: SubjectDescriptor, Value: ""},
	} {
		r := buildBatchReq(t, rs, l, time.Now(), 1, subj)
		require.Equal(t, StateKey(subj, ps[0]), r.str[r.rk.route[0]:r.rk.route[1]], "%+v", subj)
	}
}
