package limiter

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
// one EVALSHA of one Lua script (loaded on first use, re-sent with EVAL when
// Redis has forgotten it), deciding with Redis server TIME so gateway clocks
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

// NewPipelinedRedisStore is NewRedisStore with automatic pipelining: the
// decisions of concurrent callers are sent together, in pipelines of up to
// cfg.MaxBatch script calls with cfg.Workers pipelines in flight, so Redis
// reads and answers many calls per system call. Decisions are the same as
// without it (each script call stays atomic); under load it raises the
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

// StateKey is the Redis key of one policy's state for one subject.
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

// evalCall runs one script call for ops (of one or several subjects on
// one node). When ri is not nil it receives what the call wrote.
func (s *RedisStore) evalCall(ctx context.Context, now time.Time, subjects []Subject, ops []op, res []result, ri *refundInfo) (bool, int64, error) {
	keys := make([]string, 0, len(ops)+1)
	args := make([]any, 0, 3+9*len(ops))
	if s.passTime {
		args = append(args, strconv.FormatInt(now.UnixMicro(), 10))
	} else {
		args = append(args, "")
	}
	args = append(args, len(ops))
	var extra []string
	subject := ""
	for i := range ops {
		o := &ops[i]
		if i == 0 || subjects[i] != subjects[i-1] {
			subject = subjects[i].Key()
		}
		// The first subject's keys are declared (one slot); the others
		// travel in ARGV (see script.lua).
		dst := &keys
		if subjects[i] != subjects[0] {
			dst = &extra
		}
		*dst = append(*dst, stateKey(subject, o.policy, o.tag()))
		flags := 0
		if o.enforce {
			flags |= 1
		}
		if o.global {
			flags |= 2
			if !o.replicated() {
				*dst = append(*dst, shareKey(subject, o.policy))
			}
		}
		args = append(args, algoCode(o), flags, o.cost, o.rate, o.burst, o.limit, o.windowMs, o.region)
	}
	if ri != nil {
		args = append(args, "1")
	} else {
		args = append(args, "0")
	}
	for _, k := range extra {
		args = append(args, k)
	}
	var v []int64
	var err error
	if s.pipe != nil {
		var cmd *redis.Cmd
		if cmd, err = s.pipe.do(ctx, evalScript, keys, args); err == nil {
			v, err = cmd.Int64Slice()
		}
	} else {
		v, err = s.runScript(ctx, keys, args)
	}
	if err != nil {
		s.cold.lost(err)
		return false, 0, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	if len(v) != 2+10*len(ops) {
		return false, 0, fmt.Errorf("%w: script returned %d values for %d policies", ErrStoreUnavailable, len(v), len(ops))
	}
	allowed := v[0] == 1
	for i := range ops {
		b := 2 + 10*i
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
		ri.nowUs = v[1]
	}
	return allowed, v[1], nil
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
