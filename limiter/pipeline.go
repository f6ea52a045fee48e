package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// PipelineConfig configures automatic pipelining of a RedisStore (see
// NewPipelinedRedisStore). Start from DefaultPipelineConfig.
type PipelineConfig struct {
	// Workers is the number of pipelines in flight at once. Default 2:
	// fewer workers make larger batches under load, and every batch costs
	// Redis and the client a script call's fixed work and a round trip's
	// system calls (64 callers on 2 cores: about 20 decisions a call with
	// 2 workers against 11 with 4, and 15-25 % less CPU per decision on
	// each side; README "Measured (limiter core)"). 1 leaves Redis idle
	// while the worker reads a reply.
	Workers int
	// MaxBatch is the largest number of decisions a worker takes at once:
	// they go out as one script call per Redis node (script.lua decides
	// them one after the other), all in one pipeline. Default 64.
	MaxBatch int
	// Timeout bounds one pipeline round trip, whatever the callers'
	// deadlines (a caller stops waiting at its own deadline; the pipeline
	// is abandoned at this one). Default 1 s.
	Timeout time.Duration
	// MaxQueue bounds the decisions waiting for a worker (not yet sent).
	// A decision that finds the queue full fails at once with
	// ErrPipelineFull (a store error: Check answers it from the fallback)
	// instead of waiting: under overload the store sheds load rather than
	// queueing it. Default 256 (DefaultPipelineConfig); zero is Workers x
	// MaxBatch.
	MaxQueue int
}

// DefaultPipelineConfig returns the defaults.
func DefaultPipelineConfig() PipelineConfig {
	return PipelineConfig{Workers: 2, MaxBatch: 64, Timeout: time.Second, MaxQueue: 256}
}

// ErrPipelineFull is returned (wrapped in ErrStoreUnavailable) by a
// pipelined store's decision that found PipelineConfig.MaxQueue decisions
// already waiting: it was not sent.
var ErrPipelineFull = errors.New("limiter: pipeline queue full")

func (c *PipelineConfig) validate() error {
	d := DefaultPipelineConfig()
	if c.Workers == 0 {
		c.Workers = d.Workers
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = d.MaxBatch
	}
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = c.Workers * c.MaxBatch
	}
	switch {
	case c.Workers < 1 || c.Workers > 256:
		return fmt.Errorf("limiter: pipeline config: Workers must be between 1 and 256, got %d", c.Workers)
	case c.MaxBatch < 1 || c.MaxBatch > 4096:
		return fmt.Errorf("limiter: pipeline config: MaxBatch must be between 1 and 4096, got %d", c.MaxBatch)
	case c.Timeout < 0:
		return fmt.Errorf("limiter: pipeline config: Timeout must be > 0, got %v", c.Timeout)
	case c.MaxQueue < 1 || c.MaxQueue > 1<<20:
		return fmt.Errorf("limiter: pipeline config: MaxQueue must be between 1 and 1048576, got %d", c.MaxQueue)
	}
	return nil
}

// pending is one decision waiting for its pipeline. The worker that
// takes it sets nowUs, vals and err, then sends on done exactly once
// (finish); done has room for that one value, so the worker never waits
// for a caller that has gone. A caller that received from done owns the
// pending again and returns it to pendings; one that left at its deadline
// abandons it to the worker (and the garbage collector).
type pending struct {
	ctx   context.Context // the caller's: once done, the call is not sent
	route string          // the request's first state key: its node
	req   string          // the request's string (script.lua's ARGV)
	nvals int             // the values its reply holds after the status
	done  chan struct{}   // one value once nowUs, vals and err are set
	nowUs int64
	vals  []int64
	err   error
}

// pendings recycles the pending of calls whose callers received their
// answer: one allocation (and its channel) fewer per decision.
var pendings = sync.Pool{New: func() any { return &pending{done: make(chan struct{}, 1)} }}

// finish hands req's answer to its caller. It never blocks.
func (req *pending) finish() { req.done <- struct{}{} }

// answer returns req's answer to its caller, which has received from
// done, and recycles req.
func (req *pending) answer() (int64, []int64, error) {
	nowUs, vals, err := req.nowUs, req.vals, req.err
	*req = pending{done: req.done}
	pendings.Put(req)
	return nowUs, vals, err
}

// pipeliner sends the decisions of concurrent callers together: each worker
// takes one waiting decision, adds every other decision already waiting (up
// to MaxBatch) and sends them as one script call per Redis node (all the
// calls of a batch in one pipeline: one round trip). script.lua decides the
// requests of a call one after the other, each all or nothing on its own,
// so a batch decides exactly as the same requests sent one by one in that
// order. At low load a batch is one decision and nothing waits; under load
// the batches grow by themselves while the previous ones are in flight,
// and Redis parses, runs and answers one command for many decisions.
//
// A decision whose caller has gone (its context is done: the caller left
// at its deadline and the fallback answered it) is never sent: it is
// dropped when a worker takes it, so Redis never consumes for a request
// that was answered otherwise. Once sent, a call cannot be recalled: a
// caller that leaves while its call is in flight may still be counted by
// Redis (at most one batch per worker is in flight). At most MaxQueue
// decisions wait; more fail at once with ErrPipelineFull.
type pipeliner struct {
	client redis.UniversalClient
	cfg    PipelineConfig
	queue  chan *pending
	stop   chan struct{}
	wg     sync.WaitGroup
	// mu guards closed: senders hold it shared while they enqueue, close
	// holds it exclusively, so nothing is enqueued after close drains.
	mu     sync.RWMutex
	closed bool
	// inFlight is the number of decisions sent and not yet answered.
	inFlight atomic.Int64
	// shed counts calls refused because the queue was full.
	shed atomic.Int64
	// calls counts script calls sent, batches the decisions they carried
	// (tests and benchmarks: decisions per call).
	calls, batched atomic.Int64
	cold           *coldSignal // set before the first decision (warm.go)
}

func newPipeliner(client redis.UniversalClient, cfg PipelineConfig) *pipeliner {
	p := &pipeliner{client: client, cfg: cfg, queue: make(chan *pending, cfg.MaxQueue), stop: make(chan struct{})}
	for range cfg.Workers {
		p.wg.Add(1)
		go p.run()
	}
	return p
}

// do sends one request (route: its first state key; req: its string;
// nvals: the values of its reply after the status) and waits for its
// answer or ctx's end, whichever comes first. It never waits for room in
// the queue: a full queue fails the call at once with ErrPipelineFull.
func (p *pipeliner) do(ctx context.Context, route, reqStr string, nvals int) (int64, []int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	req := pendings.Get().(*pending)
	req.ctx, req.route, req.req, req.nvals = ctx, route, reqStr, nvals
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		pendings.Put(req)
		return 0, nil, errPipelineClosed
	}
	select {
	case p.queue <- req:
		p.mu.RUnlock()
	default:
		p.mu.RUnlock()
		pendings.Put(req)
		p.shed.Add(1)
		return 0, nil, ErrPipelineFull
	}
	cc, bounded := ctx.(*callCtx)
	if !bounded {
		select {
		case <-req.done:
			return req.answer()
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		}
	}
	t := waitTimers.Get().(*time.Timer)
	t.Reset(time.Until(cc.deadline))
	defer func() {
		t.Stop() // since Go 1.23 no stale tick stays in t.C after Stop
		waitTimers.Put(t)
	}()
	select {
	case <-req.done:
		return req.answer()
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	case <-t.C:
		return 0, nil, context.DeadlineExceeded
	}
}

// waitTimers are the timers that end callers' waits at their deadline.
var waitTimers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// callCtx is a caller's context bounded by the limiter's deadline for one
// store call, without a timer of its own: Err and Deadline report the
// deadline, but Done closes only with the caller's context. Only code
// that waits through the pipeline (which adds a pooled timer) or that
// reads Deadline (go-redis with ContextTimeoutEnabled, refunds) may
// receive it.
type callCtx struct {
	context.Context
	deadline time.Time
}

// Deadline is the earlier of the caller's deadline and the call's.
func (c *callCtx) Deadline() (time.Time, bool) {
	if d, ok := c.Context.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

// Err is the caller's context's error, or DeadlineExceeded once the
// call's deadline has passed.
func (c *callCtx) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if !time.Now().Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

var errPipelineClosed = errors.New("limiter: store closed")

func (p *pipeliner) run() {
	defer p.wg.Done()
	batch := make([]*pending, 0, p.cfg.MaxBatch)
	var b batcher
	for {
		select {
		case req := <-p.queue:
			batch = append(batch[:0], req)
		case <-p.stop:
			return
		}
	fill:
		for len(batch) < p.cfg.MaxBatch {
			select {
			case req := <-p.queue:
				batch = append(batch, req)
			default:
				break fill
			}
		}
		// Drop the calls whose callers have gone, just before sending.
		live := batch[:0]
		for _, req := range batch {
			if err := req.ctx.Err(); err != nil {
				req.err = err
				req.finish()
				continue
			}
			live = append(live, req)
		}
		if len(live) > 0 {
			p.send(&b, live)
		}
		clear(batch)
	}
}

// batcher holds a worker's buffers for building script calls.
type batcher struct {
	groups map[string][]*pending // cluster: the batch's requests by node
	order  []string              // the nodes in order of first request
	calls  [][]*pending
	nvals  []int
	out    []reqReply
	cmds   []*redis.Cmd
	args   []any    // every call's arguments, one after the other
	keys   []string // every call's one key
}

// group splits batch into script calls: one for a standalone client, one
// per node (by the client's slot map) for a cluster.
func (b *batcher) group(ctx context.Context, client redis.UniversalClient, batch []*pending) [][]*pending {
	b.calls = b.calls[:0]
	c, ok := client.(*redis.ClusterClient)
	if !ok {
		return append(b.calls, batch)
	}
	if b.groups == nil {
		b.groups = make(map[string][]*pending)
	}
	b.order = b.order[:0]
	for _, req := range batch {
		addr := req.route // unknown node: a call of its own, routed by its key
		if node, err := c.MasterForKey(ctx, req.route); err == nil {
			addr = node.Options().Addr
		}
		g, seen := b.groups[addr]
		if !seen {
			b.order = append(b.order, addr)
		}
		b.groups[addr] = append(g, req)
	}
	for _, addr := range b.order {
		b.calls = append(b.calls, b.groups[addr])
		delete(b.groups, addr)
	}
	return b.calls
}

// send runs one batch: one script call per node, all in one pipeline;
// calls that find the script missing (NOSCRIPT, after a restart or SCRIPT
// FLUSH) are sent again with EVAL.
func (p *pipeliner) send(b *batcher, batch []*pending) {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Timeout)
	defer cancel()
	calls := b.group(ctx, p.client, batch)
	cmds := slices.Grow(b.cmds[:0], len(calls))[:len(calls)]
	keys := slices.Grow(b.keys[:0], len(calls))[:len(calls)]
	all := slices.Grow(b.args[:0], len(batch))
	argss := make([][]any, 0, len(calls))
	pipe := p.client.Pipeline()
	for i, call := range calls {
		from := len(all)
		for _, req := range call {
			all = append(all, req.req)
		}
		args := all[from:len(all):len(all)]
		argss = append(argss, args)
		keys[i] = call[0].route
		cmds[i] = evalScript.EvalSha(ctx, pipe, keys[i:i+1:i+1], args...)
	}
	b.cmds, b.keys, b.args = cmds, keys, all
	defer func() { clear(b.cmds); clear(b.keys); clear(b.args) }()
	p.calls.Add(int64(len(calls)))
	p.batched.Add(int64(len(batch)))
	p.inFlight.Add(int64(len(batch)))
	defer p.inFlight.Add(-int64(len(batch)))
	_, _ = pipe.Exec(ctx)
	var retry []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")) {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		p.cold.notify()
		pipe := p.client.Pipeline()
		for _, i := range retry {
			cmds[i] = evalScript.Eval(ctx, pipe, []string{calls[i][0].route}, argss[i]...)
		}
		_, _ = pipe.Exec(ctx)
	}
	for i, call := range calls {
		v, err := scriptValues(cmds[i])
		var nowUs int64
		if err == nil {
			b.nvals = b.nvals[:0]
			for _, req := range call {
				b.nvals = append(b.nvals, req.nvals)
			}
			b.out = slices.Grow(b.out[:0], len(call))[:len(call)]
			nowUs, err = parseReply(v, b.nvals, b.out)
		}
		for j, req := range call {
			if err != nil {
				req.err = err
			} else {
				req.nowUs, req.vals, req.err = nowUs, b.out[j].vals, b.out[j].err
			}
			req.finish()
		}
		clear(b.out)
	}
	b.calls = b.calls[:0]
}

// close stops the workers and fails the decisions still queued.
func (p *pipeliner) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	close(p.stop)
	p.wg.Wait()
	for {
		select {
		case req := <-p.queue:
			req.err = errPipelineClosed
			req.finish()
		default:
			return
		}
	}
}
