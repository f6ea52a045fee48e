package limiter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// PipelineConfig configures automatic pipelining of a RedisStore (see
// WithAutoPipeline). Start from DefaultPipelineConfig.
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
}

// DefaultPipelineConfig returns the defaults.
func DefaultPipelineConfig() PipelineConfig {
	return PipelineConfig{Workers: 4, MaxBatch: 64, Timeout: time.Second}
}

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
	switch {
	case c.Workers < 1 || c.Workers > 256:
		return fmt.Errorf("limiter: pipeline config: Workers must be between 1 and 256, got %d", c.Workers)
	case c.MaxBatch < 1 || c.MaxBatch > 4096:
		return fmt.Errorf("limiter: pipeline config: MaxBatch must be between 1 and 4096, got %d", c.MaxBatch)
	case c.Timeout < 0:
		return fmt.Errorf("limiter: pipeline config: Timeout must be > 0, got %v", c.Timeout)
	}
	return nil
}

// pending is one decision waiting for its pipeline.
type pending struct {
	keys []string
	args []any
	done chan struct{}
	vals []int64
	err  error
}

// pipeliner sends the decisions of concurrent callers together: each worker
// takes one waiting decision, adds every other decision already waiting (up
// to MaxBatch) and sends them as one pipeline of EVALSHA calls. At low load
// a batch is one decision and nothing waits; under load the batches grow by
// themselves while the previous pipelines are in flight, and Redis reads and
// answers many calls per system call. Each script call stays atomic; calls
// of one batch are independent.
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
	cold   *coldSignal // set before the first decision (warm.go)
}

func newPipeliner(client redis.UniversalClient, cfg PipelineConfig) *pipeliner {
	p := &pipeliner{client: client, cfg: cfg, queue: make(chan *pending, cfg.Workers*cfg.MaxBatch), stop: make(chan struct{})}
	for range cfg.Workers {
		p.wg.Add(1)
		go p.run()
	}
	return p
}

// do sends one decision and waits for its answer or ctx's end, whichever
// comes first.
func (p *pipeliner) do(ctx context.Context, keys []string, args []any) ([]int64, error) {
	req := &pending{keys: keys, args: args, done: make(chan struct{})}
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		return nil, errPipelineClosed
	}
	select {
	case p.queue <- req:
		p.mu.RUnlock()
	case <-ctx.Done():
		p.mu.RUnlock()
		return nil, ctx.Err()
	}
	select {
	case <-req.done:
		return req.vals, req.err
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
		p.send(batch)
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
		cmds[i] = evalScript.EvalSha(ctx, pipe, req.keys, req.args...)
	}
	_, _ = pipe.Exec(ctx)
	var retry []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		p.cold.notify()
		pipe := p.client.Pipeline()
		for _, i := range retry {
			cmds[i] = evalScript.Eval(ctx, pipe, batch[i].keys, batch[i].args...)
		}
		_, _ = pipe.Exec(ctx)
	}
	for i, req := range batch {
		req.vals, req.err = cmds[i].Int64Slice()
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
