package limiter

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Replicated fixed windows (daily quotas). A fixed-window policy with scope
// global keeps one hash per subject and policy, beside its other keys in
// the subject's slot:
//
//	rl:{<subject>}:<policy>:fg   w = window start (Unix ms)
//	                             n:<region> = that region's admitted count
//	                             cap = this region's cap (optional)
//
// The limiter's script increments this region's field and admits when the
// sum over every region's field, plus the cost, stays within the limit (and
// this region's count within its cap, when the coordinator set one). Other
// regions' fields arrive by replication: MergeWindowCount keeps, per region,
// the largest count seen for the current window (a grow-only counter per
// region), so replication is idempotent, order-independent and replay-safe.
// A count for an older window is dropped; one for a newer window starts it.
//
// Windows are those of the policy: window_s aligned to the Unix epoch, or
// UTC calendar months (Policy.WindowAt gives both). A merge names its
// window by start and length, and the length is the window's own: for a
// monthly policy that month's length (28 to 31 days in ms), which only sets
// the key's expiry. Windows compare by start, so months merge and roll over
// exactly like fixed lengths. Changing the window of a policy (its length,
// or to or from months) under the same id mixes two shapes of window in one
// hash: this region keeps counting in the stored window until a window of
// the new shape starts after it, and a count of the new shape that starts
// before the stored window is dropped as older. Give a new window a new
// policy id.

//go:embed merge.lua
var mergeSource string

var mergeScript = redis.NewScript(mergeSource)

// WindowCounts is the state of one replicated window.
type WindowCounts struct {
	// StartMs is the window start (Unix ms); 0 when there is no window.
	StartMs int64
	// Counts maps region to admitted cost units in the window.
	Counts map[string]int64
	// Cap is this region's cap, -1 when none.
	Cap int64
}

// MergeWindowCount records that region had admitted count cost units in
// the window starting at windowStartMs (length windowMs, the window's own:
// for monthly policies that month's length) of a global fixed window
// policy for subject: the stored count becomes the larger of the two.
// A count for a window older than the stored one is ignored; a newer window
// replaces the stored one. The key expires one second after the window
// ends, by Redis time. Applying the same count twice, or counts in any
// order, gives the same state.
func (s *RedisStore) MergeWindowCount(ctx context.Context, subject Subject, policyID string, windowStartMs, windowMs int64, region string, count int64) error {
	return s.merge(ctx, subject, policyID, windowStartMs, windowMs, "n", region, count)
}

// SetWindowCap sets (cap >= 0) or removes (cap < 0) this region's cap in the
// window starting at windowStartMs: while set, this region admits only while
// its own count stays within cap, whatever the other regions have left.
func (s *RedisStore) SetWindowCap(ctx context.Context, subject Subject, policyID string, windowStartMs, windowMs, capUnits int64) error {
	return s.merge(ctx, subject, policyID, windowStartMs, windowMs, "cap", "", capUnits)
}

func (s *RedisStore) merge(ctx context.Context, subject Subject, policyID string, windowStartMs, windowMs int64, what, region string, v int64) error {
	if windowMs <= 0 || windowStartMs < 0 {
		return fmt.Errorf("limiter: merge: window start %d and length %d must be >= 0 and > 0", windowStartMs, windowMs)
	}
	if what == "n" && !idPattern.MatchString(region) {
		return fmt.Errorf("limiter: merge: region %q must be 1 to 64 characters of A-Z a-z 0-9 . _ -", region)
	}
	key := stateKey(subject.Key(), policyID, "fg")
	if err := mergeScript.Run(ctx, s.client, []string{key}, what, windowStartMs, windowMs, region, v).Err(); err != nil {
		return fmt.Errorf("%w: %v", ErrStoreUnavailable, err)
	}
	return nil
}

// WindowCounts reads the replicated window of a global fixed-window policy
// for subject.
func (s *RedisStore) WindowCounts(ctx context.Context, subject Subject, policyID string) (WindowCounts, error) {
	raw, err := s.client.HGetAll(ctx, stateKey(subject.Key(), policyID, "fg")).Result()
	if err != nil {
		return WindowCounts{}, fmt.Errorf("%w: %v", ErrStoreUnavailable, err)
	}
	wc := WindowCounts{Counts: map[string]int64{}, Cap: -1}
	for f, v := range raw {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return WindowCounts{}, fmt.Errorf("limiter: window counts: field %q: %v", f, err)
		}
		switch {
		case f == "w":
			wc.StartMs = n
		case f == "cap":
			wc.Cap = n
		case strings.HasPrefix(f, "n:"):
			wc.Counts[f[2:]] = n
		}
	}
	return wc, nil
}

// MergeWindowCount is RedisStore.MergeWindowCount for the in-memory store,
// with expiry by the time now.
func (m *MemoryStore) MergeWindowCount(now time.Time, subject Subject, policyID string, windowStartMs, windowMs int64, region string, count int64) {
	m.mergeWindow(now, subject, policyID, windowStartMs, windowMs, func(st *state) {
		if count > st.countOf(region) {
			st.counts = withCount(st.counts, region, count)
		}
	})
}

// SetWindowCap is RedisStore.SetWindowCap for the in-memory store.
func (m *MemoryStore) SetWindowCap(now time.Time, subject Subject, policyID string, windowStartMs, windowMs, capUnits int64) {
	m.mergeWindow(now, subject, policyID, windowStartMs, windowMs, func(st *state) {
		st.capv = max(-1, capUnits)
	})
}

// WindowCounts is RedisStore.WindowCounts for the in-memory store.
func (m *MemoryStore) WindowCounts(now time.Time, subject Subject, policyID string) WindowCounts {
	sh := m.shard(subject)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	wc := WindowCounts{Counts: map[string]int64{}, Cap: -1}
	if subj := sh.get(subject); subj != nil {
		if st := subj.lookup(policyID, "fg", now.UnixMilli(), m.keepExpired); st != nil {
			wc.StartMs, wc.Cap = st.a, st.capv
			for _, rc := range st.counts {
				wc.Counts[rc.region] = rc.count
			}
		}
	}
	return wc
}

func (m *MemoryStore) mergeWindow(now time.Time, subject Subject, policyID string, windowStartMs, windowMs int64, apply func(*state)) {
	nowMs := now.UnixMilli()
	sh := m.shard(subject)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	subj := sh.getOrCreate(subject)
	st := state{a: windowStartMs, capv: -1}
	if cur := subj.lookup(policyID, "fg", nowMs, m.keepExpired); cur != nil {
		if windowStartMs < cur.a {
			return
		}
		if windowStartMs == cur.a {
			st = *cur
		}
	}
	apply(&st)
	st.expireMs = windowStartMs + windowMs + 1000
	subj.store(policyID, "fg", st)
}
