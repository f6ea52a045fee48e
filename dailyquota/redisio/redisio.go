// Package redisio is the Redis adapter of daily-quota replication: Store
// reads and merges replicated windows and sets caps through the limiter's
// own RedisStore methods (WindowCounts, MergeWindowCount, SetWindowCap, so
// the layout and the merge script stay the limiter's), and Active finds the
// keys the gateways recently admitted on from their usage counts
// (limiter.CollectUsage) instead of scanning Redis. Both work on a
// standalone Redis and on a Redis Cluster.
//
// What it does not do: it decides nothing, keeps no state, starts no
// goroutines beyond the bounded workers of one call, and logs nothing.
//
// Invariants: every write is the limiter's idempotent script (max-merge, or
// setting a cap), so a failed call may be retried with the same values.
package redisio

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/dailyquota"
	"github.com/quotientlabs/quotient/limiter"
)

// ErrStore is wrapped by every failed call.
var ErrStore = errors.New("redisio: store call failed")

// Workers is how many Redis calls one Read, Merge or SetCaps runs at once.
const Workers = 16

// Store adapts a limiter.RedisStore to dailyquota.Store. It is safe for
// concurrent use.
type Store struct {
	rs *limiter.RedisStore
}

var _ dailyquota.Store = (*Store)(nil)

// NewStore returns a Store on rs, which the caller owns.
func NewStore(rs *limiter.RedisStore) *Store { return &Store{rs: rs} }

// each runs fn(i) for i in [0, n) on up to Workers goroutines and returns
// the indexes that failed with the first error.
func each(n int, fn func(i int) error) ([]int, error) {
	var mu sync.Mutex
	var failed []int
	var first error
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(n, Workers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := fn(i); err != nil {
					mu.Lock()
					failed = append(failed, i)
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	return failed, first
}

// Read implements dailyquota.Store.
func (s *Store) Read(ctx context.Context, keys []dailyquota.PolicySubject) ([]dailyquota.Stored, error) {
	out := make([]dailyquota.Stored, len(keys))
	failed, err := each(len(keys), func(i int) error {
		subj, err := limiter.ParseSubjectKey(keys[i].Subject)
		if err != nil {
			return err
		}
		wc, err := s.rs.WindowCounts(ctx, subj, keys[i].Policy)
		if err != nil {
			return err
		}
		out[i] = dailyquota.Stored{StartMs: wc.StartMs, Counts: wc.Counts, Cap: wc.Cap}
		return nil
	})
	if len(failed) > 0 {
		return nil, fmt.Errorf("%w: read %d of %d windows: %w", ErrStore, len(failed), len(keys), err)
	}
	return out, nil
}

// Merge implements dailyquota.Store.
func (s *Store) Merge(ctx context.Context, counts []dailyquota.Count) ([]dailyquota.Count, error) {
	failed, err := each(len(counts), func(i int) error {
		c := counts[i]
		subj, err := limiter.ParseSubjectKey(c.Subject)
		if err != nil {
			return err
		}
		return s.rs.MergeWindowCount(ctx, subj, c.Policy, c.StartMs, c.WindowMs, c.Region, c.N)
	})
	if len(failed) == 0 {
		return nil, nil
	}
	out := make([]dailyquota.Count, len(failed))
	for i, j := range failed {
		out[i] = counts[j]
	}
	return out, fmt.Errorf("%w: merge %d of %d counts: %w", ErrStore, len(failed), len(counts), err)
}

// SetCaps implements dailyquota.Store.
func (s *Store) SetCaps(ctx context.Context, caps []dailyquota.CapUpdate) ([]dailyquota.CapUpdate, error) {
	failed, err := each(len(caps), func(i int) error {
		c := caps[i]
		subj, err := limiter.ParseSubjectKey(c.Subject)
		if err != nil {
			return err
		}
		return s.rs.SetWindowCap(ctx, subj, c.Policy, c.StartMs, c.WindowMs, c.Cap)
	})
	if len(failed) == 0 {
		return nil, nil
	}
	out := make([]dailyquota.CapUpdate, len(failed))
	for i, j := range failed {
		out[i] = caps[j]
	}
	return out, fmt.Errorf("%w: set %d of %d caps: %w", ErrStore, len(failed), len(caps), err)
}

// Active finds recently admitted keys in the gateways' usage counts: the
// (policy, subject) pairs with admitted cost in the current usage epoch or
// the one before (gateways flush about every second, so the previous epoch
// still receives counts just after it ends). It is safe for concurrent use.
type Active struct {
	client  redis.UniversalClient
	epochMs int64
	layout  limiter.UsageLayout
}

var _ dailyquota.ActiveKeys = (*Active)(nil)

// NewActive returns an Active on client (owned by the caller) for usage
// epochs of epoch (the gateways' limiter.Config.UsageEpoch, default 10 s)
// in shards hashes (their usage shards; <= 0 means the default).
func NewActive(client redis.UniversalClient, epoch time.Duration, shards int) *Active {
	return NewActiveLayout(client, epoch, limiter.UsageLayout{Shards: shards})
}

// NewActiveLayout is NewActive over the usage hashes of layout: with
// layout.SplitShards > 0 it also reads the split layout that gateways of
// the previous release write, so that their keys stay active during a
// rolling upgrade.
func NewActiveLayout(client redis.UniversalClient, epoch time.Duration, layout limiter.UsageLayout) *Active {
	if epoch <= 0 {
		epoch = 10 * time.Second
	}
	return &Active{client: client, epochMs: epoch.Milliseconds(), layout: layout}
}

// Active implements dailyquota.ActiveKeys.
func (a *Active) Active(ctx context.Context, now time.Time) ([]dailyquota.PolicySubject, error) {
	e := now.UnixMilli() / a.epochMs
	seen := map[dailyquota.PolicySubject]bool{}
	var out []dailyquota.PolicySubject
	var errs []error
	for _, epoch := range []int64{e - 1, e} {
		totals, err := limiter.CollectUsageLayout(ctx, a.client, epoch, a.layout)
		if err != nil {
			errs = append(errs, err)
		}
		for _, u := range totals {
			k := dailyquota.PolicySubject{Policy: u.PolicyID, Subject: u.SubjectKey}
			if u.Admitted > 0 && !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("%w: %w", ErrStore, err)
	}
	return out, nil
}

// Policies returns the replicated window policies among ps: fixed_window
// with scope global, as dailyquota.Policy (window_s seconds aligned to the
// Unix epoch, or UTC calendar months for window "month").
func Policies(ps []*limiter.Policy) []dailyquota.Policy {
	var out []dailyquota.Policy
	for _, p := range ps {
		if p.Algorithm == limiter.FixedWindow && p.Scope == limiter.ScopeGlobal {
			w := dailyquota.Fixed(time.Duration(p.WindowSec) * time.Second)
			if p.Monthly() {
				w = dailyquota.Month()
			}
			out = append(out, dailyquota.Policy{ID: p.ID, Limit: p.Limit, Window: w})
		}
	}
	return out
}
