package redistest

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// PipelineLog is a go-redis hook (client.AddHook) that records every
// pipeline the client sends, in order, with its commands; after a
// pipeline has run, each command holds its reply. Tests use it to assert
// how much work each round trip asks of the server (commands per
// pipeline, arguments, reply sizes), which unlike a measured time does not
// depend on how loaded the machine is. Single commands pass through
// unrecorded. It is safe for concurrent use; Rounds must be read only
// after the client's pipelines have returned.
type PipelineLog struct {
	mu     sync.Mutex
	rounds [][]redis.Cmder
}

// Rounds returns the recorded pipelines, in the order they were sent.
func (h *PipelineLog) Rounds() [][]redis.Cmder {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rounds
}

// DialHook implements redis.Hook.
func (h *PipelineLog) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h *PipelineLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

// ProcessPipelineHook implements redis.Hook.
func (h *PipelineLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.mu.Lock()
		h.rounds = append(h.rounds, append([]redis.Cmder(nil), cmds...))
		h.mu.Unlock()
		return err
	}
}

var _ redis.Hook = (*PipelineLog)(nil)
