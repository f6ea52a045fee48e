package limiter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// PipelineConfig configures automatic pipelining of a RedisStore (see
// NewPipelinedRedisStore). Start from DefaultPipelineConfig.
type PipelineConfig struct {
	// Workers is the number of pipelines in flight at once. Default 4.
	Workers int
	// MaxBatch is the largest number of decisions sent in one pipeline.
	// Default 64.
	MaxBatch int
	// Timeout bounds one pipeline round trip, whatever the callers'
	// deadlines (a caller stops waiting at its own deadline; the pipeline
	// is abandoned at this one). Default 1 s.
	Timeout time.Duration
	// MaxQueue bounds the decisions waiting for a worker (not yet sent).
	// A decision that finds the queue full fails at once with
	// ErrPipelineFull (a store error: Check answers it from the fallback)
	// instead of waiting: under overload the store sheds load rather than
	// queueing it. Default Workers x MaxBatch (256).
	MaxQueue int
}

// DefaultPipelineConfig returns the defaults.
func DefaultPipelineConfig() PipelineConfig {
	return PipelineConfig{Workers: 4, MaxBatch: 64, Timeout: time.Second, MaxQueue: 4 * 64}
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

// pending is one decision waiting for its pipeline.
type pending struct {
	ctx    context.Context // the caller's: once done, the call is not sent
	script *redis.Script
	keys   []string
	args   []any
	done   chan struct{}
	cmd    *redis.Cmd
	err    error
}

// pipeliner sends the decisions of concurrent callers together: each worker
// takes one waiting decision, adds every other decision already waiting (up
// to MaxBatch) and sends them as one pipeline of EVALSHA calls. At low load
// a batch is one decision and nothing waits; under load the batches grow by
// themselves while the previous pipelines are in flight, and Redis reads and
// answers many calls per system call. Each script call stays atomic; calls
// of one batch are independent.
//
// A decision whose caller has gone (its context is done: the caller left
// at its deadline and the fallback answered it) is never sent: it is
// dropped when a worker takes it, so Redis never consumes for a request
// that was answered otherwise. Once sent, a call cannot be recalled: a
// caller that leaves while its call is in flight may still be counted by
// Redis (at most one pipeline per worker is in flight). At most MaxQueue
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
	// inFlight is the number of calls sent and not yet answered.
	inFlight atomic.Int64
	// shed counts calls refused because the queue was full.
	shed atomic.Int64
}

func newPipeliner(client redis.UniversalClient, cfg PipelineConfig) *pipeliner {
	p := &pipeliner{client: client, cfg: cfg, queue: make(chan *pending, cfg.MaxQueue), stop: make(chan struct{})}
	for range cfg.Workers {
		p.wg.Add(1)
		go p.run()
	}
	return p
}

// do sends one call of script and waits for its answer or ctx's end,
// whichever comes first. It never waits for room in the queue: a full
// queue fails the call at once with ErrPipelineFull.
func (p *pipeliner) do(ctx context.Context, script *redis.Script, keys []string, args []any) (*redis.Cmd, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	req := &pending{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		return nil, errPipelineClosed
	}
	select {
	case p.queue <- req:
		p.mu.RUnlock()
	default:
		p.mu.RUnlock()
		p.shed.Add(1)
		return nil, ErrPipelineFull
	}
	select {
	case <-req.done:
		return req.cmd, req.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

var errPipelineClosed = errors.New("limiter: store closed")

func (p *pipeliner) run() {
	defer p.wg.Done()
	batch := make([]*pending, 0, p.cfg.MaxBatch)
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
				close(req.done)
				continue
			}
			live = append(live, req)
		}
		if len(live) > 0 {
			p.send(live)
		}
		clear(batch)
	}
}

// send runs one batch as a pipeline; calls that find the script missing
// (NOSCRIPT, after a restart or SCRIPT FLUSH) are sent again with EVAL.
func (p *pipeliner) send(batch []*pending) {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Timeout)
	defer cancel()
	cmds := make([]*redis.Cmd, len(batch))
	pipe := p.client.Pipeline()
	for i, req := range batch {
		cmds[i] = req.script.EvalSha(ctx, pipe, req.keys, req.args...)
	}
	p.inFlight.Add(int64(len(batch)))
	defer p.inFlight.Add(-int64(len(batch)))
	_, _ = pipe.Exec(ctx)
	var retry []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		pipe := p.client.Pipeline()
		for _, i := range retry {
			cmds[i] = batch[i].script.Eval(ctx, pipe, batch[i].keys, batch[i].args...)
		}
		_, _ = pipe.Exec(ctx)
	}
	for i, req := range batch {
		req.cmd = cmds[i]
		close(req.done)
	}
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
			close(req.done)
		default:
			return
		}
	}
}
