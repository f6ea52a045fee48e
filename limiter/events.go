package limiter

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// Event is one sampled decision (seed design 5.2, 9.3): what support
// dashboards ("top limited keys") and shadow-mode analysis read.
type Event struct {
	// Time is the decision's time (the limiter's clock).
	Time time.Time
	// Method and Path of the request.
	Method, Path string
	// Tier of the caller.
	Tier string
	// Allowed, Source and Delay as in the Decision.
	Allowed bool
	Source  Source
	Delay   time.Duration
	// Policies evaluated.
	Policies []EventPolicy
}

// EventPolicy is one policy's part of an Event.
type EventPolicy struct {
	ID         string
	Mode       Mode
	Class      Class
	SubjectKey string // Subject.Key()
	Allowed    bool
	Cost       int64
	Remaining  int64
	RetryAfter time.Duration
	Source     Source
}

// EventSink receives sampled decision events. Emit is called on the request
// path of the sampled requests: it must not block for long (buffer or drop
// if its destination is slow). It owns the Event it is given. It must be
// safe for concurrent use.
type EventSink interface {
	Emit(Event)
}

// SlogSink is the default EventSink: one Info record per event on Logger
// (message "limiter decision"). A nil Logger discards. While Logger drops
// Info records (the default discard logger), the Limiter neither samples
// nor builds events for it.
type SlogSink struct {
	Logger *slog.Logger
}

// Emit implements EventSink.
func (s SlogSink) Emit(e Event) {
	if s.Logger == nil {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs,
		slog.Time("time", e.Time),
		slog.String("method", e.Method),
		slog.String("path", e.Path),
		slog.String("tier", e.Tier),
		slog.Bool("allowed", e.Allowed),
		slog.String("source", string(e.Source)),
		slog.Duration("delay", e.Delay),
	)
	pols := make([]any, 0, len(e.Policies))
	for _, p := range e.Policies {
		pols = append(pols, slog.Group(p.ID,
			slog.String("mode", string(p.Mode)),
			slog.String("class", string(p.Class)),
			slog.String("subject", p.SubjectKey),
			slog.Bool("allowed", p.Allowed),
			slog.Int64("cost", p.Cost),
			slog.Int64("remaining", p.Remaining),
			slog.Duration("retry_after", p.RetryAfter),
			slog.String("source", string(p.Source)),
		))
	}
	attrs = append(attrs, slog.Group("policies", pols...))
	s.Logger.LogAttrs(context.Background(), slog.LevelInfo, "limiter decision", attrs...)
}

// sampler picks a pseudo-random fraction of decisions without locks or a
// global random source: a splitmix64 hash of a per-limiter counter
// compared with a threshold. The sequence is deterministic from the seed.
type sampler struct {
	n         atomic.Uint64
	seed      uint64
	threshold uint64 // sample when hash < threshold
	off       bool
}

func newSampler(rate float64, seed uint64) *sampler {
	s := &sampler{seed: seed}
	switch {
	case rate <= 0:
		s.off = true
	case rate >= 1:
		s.threshold = ^uint64(0)
	default:
		s.threshold = uint64(rate * float64(1<<63) * 2)
	}
	return s
}

func (s *sampler) sample() bool {
	if s.off {
		return false
	}
	z := s.n.Add(1) + s.seed
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return z < s.threshold || s.threshold == ^uint64(0)
}

func newEvent(now time.Time, req *Request, d *Decision) Event {
	e := Event{Time: now, Method: req.Method, Path: req.Path, Tier: req.Identity.Tier, Allowed: d.Allowed, Source: d.Source, Delay: d.Delay}
	e.Policies = make([]EventPolicy, len(d.Policies))
	for i := range d.Policies {
		p := &d.Policies[i]
		e.Policies[i] = EventPolicy{ID: p.Policy.ID, Mode: p.Policy.Mode, Class: p.Policy.Class, SubjectKey: p.Subject.Key(), Allowed: p.Allowed, Cost: p.Cost, Remaining: p.Remaining, RetryAfter: p.RetryAfter, Source: p.Source}
	}
	return e
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
