package limiter

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed script.lua
var scriptSource string

var evalScript = redis.NewScript(scriptSource)

//go:embed refund.lua
var refundSource string

var refundScript = redis.NewScript(refundSource)

// ErrStoreUnavailable wraps every error of a store call: the store could not
// decide (connection refused, timeout, cluster down). Nothing was consumed.
var ErrStoreUnavailable = errors.New("limiter: store unavailable")

// RedisStore is the [Store] shared by the gateways of one region: standalone
// Redis or Redis Cluster through a go-redis UniversalClient. Each decision is
// one request of an EVALSHA of one Lua script (loaded on first use, re-sent
// with EVAL when Redis has forgotten it; one request per call, or a batch of
// concurrent callers' requests with NewPipelinedRedisStore), deciding with Redis server TIME so gateway clocks
// do not matter, for all the subjects of a request at once when they live
// on one node; on a cluster whose nodes split a request's subjects, one
// call per subject in order with refunds (see eval and refund.go). Keys
// (see the package documentation):
//
//	rl:{<subject>}:<policy>:tb|lb         12 bytes: nano-tokens at a ms (algorithm.go)
//	rl:{<subject>}:<policy>:fw            string "<window start ms>:<count>"
//	rl:{<subject>}:<policy>:sc            string "<window start ms>:<current>:<previous>"
//	rl:{<subject>}:<policy>:sl            list: sliding window log, "ms:cost"
//	rl:{<subject>}:<policy>:fg            hash: replicated window (replicated.go)
//	rl:{<subject>}:<policy>:share         hash r (milli-tokens/s), b (milli-tokens):
//	                                      this region's share of a global policy,
//	                                      written by the coordinator
//
// It is safe for concurrent use. It adds no deadline of its own: pass a
// context with one (the Limiter does).
type RedisStore struct {
	client   redis.UniversalClient
	passTime bool // tests only: decide at the time given, not Redis TIME
	// boundedByContext: the client was built with ContextTimeoutEnabled, so
	// every wait of a call (pool, dial, read, write) ends at the context's
	// deadline and the limiter needs no goroutine to enforce it.
	boundedByContext bool
	// pipe, when set, sends concurrent decisions together (automatic
	// pipelining); see NewPipelinedRedisStore.
	pipe *pipeliner
	// refundFailures counts refunds that failed (see refund.go).
	refundFailures atomic.Int64
	// assumeOneNode (tests only) sends every request in one call, as a
	// stale slot map would.
	assumeOneNode bool
	// cold tells a Warmer that a decision found a script missing (warm.go).
	cold coldSignal
}

// NewPipelinedRedisStore is NewRedisStore with automatic pipelining and
// batching: the decisions of concurrent callers are sent together, up to
// cfg.MaxBatch at once as one script call per Redis node, with
// cfg.Workers batches in flight, so Redis parses, runs and answers one
// command for many decisions. Decisions are the same as without it (the
// script decides the requests of a call one after the other, each all or
// nothing on its own, atomically; a request whose keys turn out to be on
// another node fails alone, having written nothing, and is decided again
// on its own); under load it raises the
// decisions per second one Redis serves, at no cost in latency at low load
// (a lone decision is sent at once). A caller stops waiting at its
// context's deadline. Close the store to stop its goroutines.
func NewPipelinedRedisStore(client redis.UniversalClient, cfg PipelineConfig) (*RedisStore, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := NewRedisStore(client)
	s.pipe = newPipeliner(client, cfg)
	s.pipe.cold = &s.cold
	s.boundedByContext = true
	return s, nil
}

// Close stops the pipelining goroutines of a store from
// NewPipelinedRedisStore; decisions still waiting fail with
// ErrStoreUnavailable. It does not close the client. A no-op for other
// stores.
func (s *RedisStore) Close() {
	if s.pipe != nil {
		s.pipe.close()
	}
}

// NewRedisStore returns a store on client, which the caller owns and closes.
// Build the client with ContextTimeoutEnabled: true (a *redis.Client or
// *redis.ClusterClient): then go-redis itself ends every call at the
// context's deadline and the limiter calls it directly. With any other
// client the limiter runs each call in its own goroutine and abandons it at
// the deadline, which costs more per decision.
func NewRedisStore(client redis.UniversalClient) *RedisStore {
	s := &RedisStore{client: client}
	switch c := client.(type) {
	case *redis.Client:
		s.boundedByContext = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		s.boundedByContext = c.Options().ContextTimeoutEnabled
	}
	return s
}

// Client is the underlying go-redis client.
func (s *RedisStore) Client() redis.UniversalClient { return s.client }

func algoCode(o *op) int {
	if o.replicated() {
		return 6
	}
	switch o.algo {
	case TokenBucket:
		return 1
	case LeakyBucket:
		return 2
	case FixedWindow:
		return 3
	case SlidingWindowLog:
		return 4
	case SlidingWindowCounter:
		return 5
	}
	return 0
}

// StateKey is the Redis key of one policy's state for one subject (see
// Keys in the package documentation), for tools and operators that inspect
// Redis: rl:{<subject>}:<policy>:<tag>, the tag tb, lb, fw, sl or sc by
// algorithm, fg for a global fixed window.
func StateKey(subject Subject, p *Policy) string {
	o := op{algo: p.Algorithm, global: p.Scope == ScopeGlobal}
	return stateKey(subject.Key(), p.ID, o.tag())
}

// ShareKey is the Redis key of this region's share of a global policy for
// one subject; the coordinator writes it.
func ShareKey(subject Subject, policyID string) string {
	return shareKey(subject.Key(), policyID)
}

func stateKey(subject, policy, tag string) string {
	return "rl:{" + subject + "}:" + policy + ":" + tag
}

func shareKey(subject, policy string) string {
	return "rl:{" + subject + "}:" + policy + ":share"
}

// eval implements Store. The ops of every subject go in one script call
// when they live on one Redis node: always with a standalone client
// (*redis.Client), and on a cluster when the slots of all the request's
// subjects are served by one node (by the client's cached slot map).
// Otherwise (a cluster whose nodes split the subjects, or a client of
// another type) the subjects are decided in order, one call each; the
// first subject that rejects stops the sequence (the ops of the subjects
// after it come back skipped) and what the subjects before it consumed is
// given back by refund.lua (see refund.go), before eval returns.
//
// The client's slot map can be stale (a resharding moved a slot): a
// script that finds another subject's key on another node fails before
// it writes anything (its first loop only reads), and the request is then
// decided in order.
func (s *RedisStore) eval(ctx context.Context, now time.Time, subjects []Subject, ops []op, res []result) (bool, error) {
	if err := s.cold.bypassErr(); err != nil {
		return false, err // Redis is down and not warm again yet (warmgate.go)
	}
	if s.oneCall(ctx, subjects, ops) {
		allowed, _, err := s.evalCall(ctx, now, subjects, ops, res, nil)
		if err == nil || sameSubject(subjects) || !strings.Contains(err.Error(), "non local key") {
			return allowed, err
		}
	}
	return s.evalInOrder(ctx, now, subjects, ops, res)
}

// oneCall reports whether the ops of every subject can go in one script
// call: one subject, a standalone client, or one cluster node for all.
func (s *RedisStore) oneCall(ctx context.Context, subjects []Subject, ops []op) bool {
	if sameSubject(subjects) || s.assumeOneNode {
		return true
	}
	switch c := s.client.(type) {
	case *redis.Client:
		return true
	case *redis.ClusterClient:
		var addr string
		for i := range subjects {
			if i > 0 && subjects[i] == subjects[i-1] {
				continue
			}
			node, err := c.MasterForKey(ctx, stateKey(subjects[i].Key(), ops[i].policy, ops[i].tag()))
			if err != nil {
				return false
			}
			if a := node.Options().Addr; i == 0 {
				addr = a
			} else if a != addr {
				return false
			}
		}
		return true
	}
	return false
}

func sameSubject(subjects []Subject) bool {
	for i := 1; i < len(subjects); i++ {
		if subjects[i] != subjects[0] {
			return false
		}
	}
	return true
}

// refundInfo is what one script call wrote, for a refund: the call's
// time and, per op, the five refund values of script.lua and whether the
// op wrote. Set, it also asks the script for them in full.
type refundInfo struct {
	nowUs int64
	r     [][5]int64
	wrote []bool
}

// maxKeyLen is the longest key a request string can carry (script.lua
// reads key lengths as two unsigned bytes).
const maxKeyLen = 1<<16 - 1

// maxOpsPerCall is the most ops one request string can carry (one byte).
const maxOpsPerCall = 255

// appendRequest appends the binary form of one request (its ops, of one
// or several subjects) to buf, as script.lua reads it: a header (whether
// a time is given, the time in µs, the number of ops, whether the state
// overwritten is reported for a refund), then per op its parameters and
// keys. It fails, naming what was wrong, for more ops or longer keys than
// the format holds.
//
// rk, when not nil, receives where the first state key (the call's
// route) is in buf.
func (s *RedisStore) appendRequest(buf []byte, now time.Time, subjects []Subject, ops []op, keep bool, rk *reqKeys) ([]byte, error) {
	if len(ops) > maxOpsPerCall {
		return buf, fmt.Errorf("limiter: redis store: %d policies in one request, at most %d", len(ops), maxOpsPerCall)
	}
	if s.passTime {
		buf = append(buf, 1)
		buf = binary.BigEndian.AppendUint64(buf, uint64(now.UnixMicro()))
	} else {
		buf = append(buf, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	}
	k := byte(0)
	if keep {
		k = 1
	}
	buf = append(buf, byte(len(ops)), k)
	// The subject's Key as two parts, appended one after the other: its
	// prefix and value as they are (no allocation), or all of an escaped
	// Key in subject.
	subject, value := "", ""
	for i := range ops {
		o := &ops[i]
		if i == 0 || subjects[i] != subjects[i-1] {
			prefix, plain := subjects[i].keyPrefix()
			if plain {
				subject, value = prefix, subjects[i].Value
			} else {
				subject, value = subjects[i].escapedKey(), ""
			}
		}
		flags := byte(0)
		if o.enforce {
			flags |= 1
		}
		if o.global {
			flags |= 2
		}
		buf = append(buf, byte(algoCode(o)), flags)
		for _, v := range [...]int64{o.cost, o.rate, o.burst, o.limit, o.windowMs} {
			buf = binary.BigEndian.AppendUint64(buf, uint64(v))
		}
		var err error
		at := len(buf) + 2
		if buf, err = appendKey(buf, subject, value, o.policy, o.tag()); err != nil {
			return buf, err
		}
		if i == 0 && rk != nil {
			rk.route = [2]int{at, len(buf)}
		}
		switch {
		case o.replicated():
			if len(o.region) > 255 {
				return buf, fmt.Errorf("limiter: redis store: region name of %d bytes, at most 255", len(o.region))
			}
			buf = append(buf, byte(len(o.region)))
			buf = append(buf, o.region...)
		case o.global:
			if buf, err = appendKey(buf, subject, value, o.policy, "share"); err != nil {
				return buf, err
			}
		}
	}
	return buf, nil
}

// reqKeys locates keys in a request string (appendRequest): byte
// ranges [from, to).
type reqKeys struct {
	route [2]int // the first state key: the node the request goes to
}

// appendKey appends "rl:{subject value}:policy:tag" (stateKey, shareKey;
// the subject's Key in two parts, subject then value) with its length in
// two bytes.
func appendKey(buf []byte, subject, value, policy, tag string) ([]byte, error) {
	n := len("rl:{}::") + len(subject) + len(value) + len(policy) + len(tag)
	if n > maxKeyLen {
		return buf, fmt.Errorf("limiter: redis store: key of %d bytes for subject %q, at most %d", n, subject+value, maxKeyLen)
	}
	buf = binary.BigEndian.AppendUint16(buf, uint16(n))
	buf = append(buf, "rl:{"...)
	buf = append(buf, subject...)
	buf = append(buf, value...)
	buf = append(buf, "}:"...)
	buf = append(buf, policy...)
	buf = append(buf, ':')
	return append(buf, tag...), nil
}

// reqBufs recycles the buffers request strings are built in.
var reqBufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// evalCall runs one request (ops of one or several subjects on one node)
// in a script call: alone, or with the requests of other callers when the
// store pipelines. When ri is not nil it receives what the call wrote.
func (s *RedisStore) evalCall(ctx context.Context, now time.Time, subjects []Subject, ops []op, res []result, ri *refundInfo) (bool, int64, error) {
	bp := reqBufs.Get().(*[]byte)
	var rk reqKeys
	buf, err := s.appendRequest((*bp)[:0], now, subjects, ops, ri != nil, &rk)
	if err != nil {
		reqBufs.Put(bp)
		return false, 0, err
	}
	reqStr := string(buf)
	*bp = buf
	reqBufs.Put(bp)
	route := reqStr[rk.route[0]:rk.route[1]] // a substring: no copy
	per := 5
	if ri != nil {
		per = 10
	}
	var nowUs int64
	var v []int64
	if s.pipe != nil {
		nowUs, v, err = s.pipe.do(ctx, route, reqStr, len(ops)*per)
	} else {
		nowUs, v, err = s.runRequest(ctx, route, reqStr, len(ops)*per)
	}
	if err != nil {
		s.cold.lost(err)
		return false, 0, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	if s.passTime {
		// The reply's time is the first request's of the call.
		nowUs = now.UnixMicro()
	}
	allowed := v[0] == 1
	for i := range ops {
		b := 1 + per*i
		res[i] = result{
			allowed:   v[b] == 1,
			remaining: v[b+1],
			resetMs:   v[b+2],
			retryMs:   v[b+3],
			delayMs:   v[b+4],
		}
		if ri != nil {
			copy(ri.r[i][:], v[b+5:b+10])
			ri.wrote[i] = allowed && res[i].allowed && ops[i].cost > 0
		}
	}
	if ri != nil {
		ri.nowUs = nowUs
	}
	return allowed, nowUs, nil
}

// runRequest runs one request alone (see evalCall) and returns the
// call's time and the request's status and values.
func (s *RedisStore) runRequest(ctx context.Context, route, req string, nvals int) (int64, []int64, error) {
	v, err := s.runScript(ctx, []string{route}, []any{req})
	if err != nil {
		return 0, nil, err
	}
	var out [1]reqReply
	nowUs, err := parseReply(v, []int{nvals}, out[:])
	if err != nil {
		return 0, nil, err
	}
	return nowUs, out[0].vals, out[0].err
}

// reqReply is one request's part of a script call's reply: its status
// (1 allowed, 0 rejected) then its values, or why the script failed it.
type reqReply struct {
	vals []int64
	err  error
}

// Errors of one request in a script call (script.lua's negative
// statuses). The first keeps the words of Redis's own error ("non local
// key") that eval looks for to decide a request in order.
var (
	errNonLocal     = errors.New("script found a key of another cluster node (non local key), nothing written")
	errBeforeWrite  = errors.New("script failed before writing, nothing written")
	errWhileWriting = errors.New("script failed while writing")
)

// scriptValues is the reply of a decision script call (script.lua): one
// string of signed big-endian 8-byte integers, as one slice.
func scriptValues(cmd *redis.Cmd) ([]int64, error) {
	s, err := cmd.Text()
	if err != nil {
		return nil, err
	}
	if len(s)%8 != 0 {
		return nil, fmt.Errorf("script returned %d bytes, not a multiple of 8", len(s))
	}
	v := make([]int64, len(s)/8)
	for i := range v {
		v[i] = int64(binary.BigEndian.Uint64([]byte(s[8*i : 8*i+8])))
	}
	return v, nil
}

// parseReply splits a script call's reply (script.lua) into the parts of
// its requests, nvals[i] values after the status of request i, into
// out[i] (slices of v), and returns the call's time. A request that
// failed in the script gets its error; an ill-formed reply is an error
// for all.
func parseReply(v []int64, nvals []int, out []reqReply) (int64, error) {
	if len(v) == 0 {
		return 0, errors.New("script returned an empty reply")
	}
	p := 1
	for r, n := range nvals {
		if p >= len(v) {
			return 0, fmt.Errorf("script returned %d values for %d requests", len(v), len(nvals))
		}
		switch st := v[p]; st {
		case -1:
			out[r] = reqReply{err: errNonLocal}
		case -2:
			out[r] = reqReply{err: errBeforeWrite}
		case -3:
			out[r] = reqReply{err: errWhileWriting}
		case 0, 1:
			if p+1+n > len(v) {
				return 0, fmt.Errorf("script returned %d values for %d requests", len(v), len(nvals))
			}
			out[r] = reqReply{vals: v[p : p+1+n : p+1+n]}
			p += n
		default:
			return 0, fmt.Errorf("script returned status %d", st)
		}
		p++
	}
	if p != len(v) {
		return 0, fmt.Errorf("script returned %d values, %d expected", len(v), p)
	}
	return v[0], nil
}

// SetShare writes this region's share of a global bucket policy for one
// subject, as the coordinator does: rateMilli in thousandths of a token per
// second, burstMilli in thousandths of a token, expiring after ttl (0: no
// expiry). The limiter reads it in the same script call as the bucket.
func (s *RedisStore) SetShare(ctx context.Context, subject Subject, policyID string, rateMilli, burstMilli int64, ttl time.Duration) error {
	key := ShareKey(subject, policyID)
	pipe := s.client.TxPipeline()
	pipe.HSet(ctx, key, "r", rateMilli, "b", burstMilli)
	if ttl > 0 {
		pipe.PExpire(ctx, key, ttl)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("%w: %v", ErrStoreUnavailable, err)
	}
	return nil
}
