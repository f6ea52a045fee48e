package limiter

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// BreakerConfig configures the circuit breaker in front of a remote store
// (seed design 7.6). Zero fields take the defaults of DefaultBreakerConfig.
type BreakerConfig struct {
	// Window is the rolling window over which errors are counted.
	// Default 10 s.
	Window time.Duration
	// Buckets is the number of slots the window is divided into; counts
	// age out one slot (Window/Buckets) at a time. Default 10.
	Buckets int
	// FailureRatio opens the breaker when failures/calls over the window
	// reach it. Default 0.5.
	FailureRatio float64
	// MinCalls is the number of calls the window must hold before the
	// ratio is considered, so that one early error cannot open it.
	// Default 20.
	MinCalls int
	// OpenFor is how long the breaker stays open before it lets a probe
	// through (half-open). Default 5 s.
	OpenFor time.Duration
	// Disabled turns the breaker off: every call goes to the store.
	Disabled bool
}

// DefaultBreakerConfig is 50% errors over 10 s (at least 20 calls), open
// for 5 s, then half-open.
func DefaultBreakerConfig() BreakerConfig {
	return BreakerConfig{Window: 10 * time.Second, Buckets: 10, FailureRatio: 0.5, MinCalls: 20, OpenFor: 5 * time.Second}
}

func (c *BreakerConfig) validate() error {
	d := DefaultBreakerConfig()
	if c.Window == 0 {
		c.Window = d.Window
	}
	if c.Buckets == 0 {
		c.Buckets = d.Buckets
	}
	if c.FailureRatio == 0 {
		c.FailureRatio = d.FailureRatio
	}
	if c.MinCalls == 0 {
		c.MinCalls = d.MinCalls
	}
	if c.OpenFor == 0 {
		c.OpenFor = d.OpenFor
	}
	switch {
	case c.Window < 0 || c.Buckets < 1 || c.Buckets > 1000 || c.Window < time.Duration(c.Buckets)*time.Millisecond:
		return fmt.Errorf("limiter: config: Breaker.Window %v with Breaker.Buckets %d: want a positive window of at least 1 ms per bucket, 1 to 1000 buckets", c.Window, c.Buckets)
	case c.FailureRatio < 0 || c.FailureRatio > 1:
		return fmt.Errorf("limiter: config: Breaker.FailureRatio must be in (0, 1], got %v", c.FailureRatio)
	case c.MinCalls < 0:
		return fmt.Errorf("limiter: config: Breaker.MinCalls must be >= 1, got %d", c.MinCalls)
	case c.OpenFor < 0:
		return fmt.Errorf("limiter: config: Breaker.OpenFor must be > 0, got %v", c.OpenFor)
	}
	return nil
}

// BreakerState is the state of a circuit breaker.
type BreakerState int

// Breaker states; the numbers are the values of the breaker state gauge.
const (
	// BreakerClosed: calls go to the store.
	BreakerClosed BreakerState = 0
	// BreakerHalfOpen: one probe call at a time goes to the store; the
	// others are answered by the fallback. A successful probe closes the
	// breaker, a failed one opens it again.
	BreakerHalfOpen BreakerState = 1
	// BreakerOpen: no call goes to the store until OpenFor has passed.
	BreakerOpen BreakerState = 2
)

func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerHalfOpen:
		return "half_open"
	case BreakerOpen:
		return "open"
	}
	return fmt.Sprintf("BreakerState(%d)", int(s))
}

// Breaker is a circuit breaker over a rolling window of call outcomes. It is
// a pure state machine: every method takes the time as a value and it does
// no I/O, so tests drive it on a fixed timeline. It is safe for concurrent
// use. Time going backwards is treated as no time passing.
type Breaker struct {
	cfg BreakerConfig
	// onChange, if set, is called (under the lock; it must not block) with
	// every new state.
	onChange func(BreakerState)

	mu        sync.Mutex
	state     BreakerState
	slotLen   int64 // ns
	slots     []breakerSlot
	openUntil int64 // ns; BreakerOpen
	probing   bool  // BreakerHalfOpen: a probe is in flight
}

type breakerSlot struct {
	index    int64 // absolute slot number (time / slotLen)
	calls    int64
	failures int64
}

// NewBreaker returns a closed breaker. cfg must have passed validation (zero
// fields take their defaults).
func NewBreaker(cfg BreakerConfig) (*Breaker, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Breaker{cfg: cfg, slotLen: int64(cfg.Window) / int64(cfg.Buckets), slots: make([]breakerSlot, cfg.Buckets)}, nil
}

// State returns the state at now (an open breaker whose time is up reads
// as half-open).
func (b *Breaker) State(now time.Time) BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == BreakerOpen && now.UnixNano() >= b.openUntil {
		return BreakerHalfOpen
	}
	return b.state
}

// Allow reports whether a call may go to the store at now. probe is true
// when the call is the half-open probe; its outcome must be reported with
// Record like any other. A disabled breaker always allows.
func (b *Breaker) Allow(now time.Time) (ok, probe bool) {
	if b.cfg.Disabled {
		return true, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return true, false
	case BreakerOpen:
		if now.UnixNano() < b.openUntil {
			return false, false
		}
		b.setState(BreakerHalfOpen)
		fallthrough
	default: // half-open
		if b.probing {
			return false, false
		}
		b.probing = true
		return true, true
	}
}

// RetryAfter is how long until the breaker lets a call through again at
// now: 0 unless it is open.
func (b *Breaker) RetryAfter(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != BreakerOpen {
		return 0
	}
	return max(0, time.Duration(b.openUntil-now.UnixNano()))
}

// Record reports the outcome of a call that Allow let through.
func (b *Breaker) Record(now time.Time, probe, success bool) {
	if b.cfg.Disabled {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	ns := now.UnixNano()
	if probe {
		b.probing = false
		if success {
			clear(b.slots)
			b.setState(BreakerClosed)
		} else {
			b.open(ns)
		}
		return
	}
	if b.state != BreakerClosed {
		// A call that started before the breaker opened: its outcome is
		// already reflected in the decision to open.
		return
	}
	idx := ns / b.slotLen
	s := &b.slots[int(idx%int64(len(b.slots)))]
	if s.index != idx {
		if idx < s.index {
			idx = s.index // time went backwards: count it in the newest slot
		} else {
			*s = breakerSlot{index: idx}
		}
	}
	s.calls++
	if !success {
		s.failures++
	}
	if success {
		return
	}
	var calls, failures int64
	oldest := idx - int64(len(b.slots)) + 1
	for i := range b.slots {
		if b.slots[i].index >= oldest && b.slots[i].index <= idx {
			calls += b.slots[i].calls
			failures += b.slots[i].failures
		}
	}
	if calls >= int64(b.cfg.MinCalls) && float64(failures) >= b.cfg.FailureRatio*float64(calls) {
		b.open(ns)
	}
}

func (b *Breaker) open(ns int64) {
	b.openUntil = ns + int64(b.cfg.OpenFor)
	clear(b.slots)
	b.setState(BreakerOpen)
}

func (b *Breaker) setState(s BreakerState) {
	if b.state == s {
		return
	}
	b.state = s
	if b.onChange != nil {
		b.onChange(s)
	}
}

// recordStoreErr records a store call that failed with err, except one
// that never reached the store (errStoreDown: the Warmer bypasses a Redis
// it knows is down until it is warm again), which is no evidence about
// the store and is not counted: a half-open probe that met it only lets
// the next call probe.
func (b *Breaker) recordStoreErr(now time.Time, probe bool, err error) {
	if !errors.Is(err, errStoreDown) {
		b.Record(now, probe, false)
		return
	}
	if probe && !b.cfg.Disabled {
		b.mu.Lock()
		b.probing = false
		b.mu.Unlock()
	}
}
