package limiter

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// Refunds: all or nothing across Redis Cluster nodes.
//
// When the subjects of one request live on different cluster nodes, no
// script can see them all, so RedisStore.eval decides them in order (the
// request's subject order: the policy set's order of subject kinds), one
// script call each. The first subject that rejects stops the sequence:
// the subjects after it are not called (their ops come back skipped, and
// the Decision does not list them). What the subjects before it consumed
// is given back by one refund.lua call per subject, before eval returns.
//
// What a concurrent observer can see: between a subject's consuming call
// and its refund, that subject's quota shows the request's cost as spent.
// The window is the round trips to the later subjects' nodes plus the
// refund's, so at most twice the store deadline (the refund runs on a
// context detached from the caller's, with the same time budget). In that
// window other requests of the subject may be rejected that would have
// been admitted; none is ever admitted that would not have been (the
// refund only gives back, and never more than was taken). If the refund
// itself fails (node down, deadline), the cost stays consumed: the
// request's subject is over-charged once, never under-charged.
//
// Exactness, per algorithm (what the refund gives back):
//
//   - fixed_window, sliding_window_counter: the cost, from the window the
//     request counted in (from the previous window's count when the
//     counter has moved on by one window; nothing when the window has
//     ended, since it no longer counts). Exact.
//   - sliding_window_log: the request's own entry ("ms:cost", LREM).
//     Exact.
//   - global fixed window (replicated): the cost, from this region's count
//     in the same window. Exact here; another region that received the
//     higher count by replication in between keeps it (receivers keep the
//     maximum count they have seen, a grow-only counter), so it over-counts
//     this region by at most the cost until this region's count grows past
//     it again: safe (it can only reject more).
//   - token and leaky buckets (and global shares, which are buckets at the
//     share's rate): the state is the tokens held at a millisecond. When
//     no other request has written the bucket since (its 12 bytes are
//     still what the request wrote), the state before the request is put
//     back byte for byte (or the key deleted, if there was none): exact,
//     rate and burst changes after it included. Otherwise an exact
//     refund is impossible from the state alone: while the request's
//     tokens were out, refill that a full bucket would have wasted may
//     have gone in and been used by others. The refund then keeps back
//     min(cost, time since the consuming call x rate), the most refill
//     that can have been absorbed this way, so it never mints tokens; the
//     cost of the rule is at most (refund window x rate) tokens withheld,
//     about 0.02 tokens for a 10/s bucket and a 2 ms window.
//
// All of this assumes the node's clock (Redis TIME) does not step back
// between the consuming call and later decisions. The consuming call may
// have moved a state on to its own time (a bucket's time when full to at
// least then, a window to the window of then, a sliding log with the
// entries then out of the window dropped); the refund keeps that move.
// Decisions at times after the consuming call are the same as if the
// request had never consumed; a clock stepping back behind it sees the
// state of then (the limiter never lets a state go back in time), as it
// would after any admitted request.
//
// Rejected requests report the refunded policies' quota as it was before
// the request (remaining plus the cost); their reset time is the one the
// consuming call gave, an upper bound.

// evalInOrder is eval for subjects on different nodes (see above).
func (s *RedisStore) evalInOrder(ctx context.Context, now time.Time, subjects []Subject, ops []op, res []result) (bool, error) {
	budget := time.Second
	if dl, ok := ctx.Deadline(); ok {
		budget = time.Until(dl)
	}
	ri := refundInfo{r: make([][5]int64, len(ops)), wrote: make([]bool, len(ops))}
	type seg struct {
		from, to int
		nowUs    int64
	}
	var done []seg
	refundAll := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget)
		defer cancel()
		for _, sg := range done {
			if err := s.refund(rctx, now, subjects[sg.from], ops[sg.from:sg.to], &ri, sg.from, sg.nowUs); err != nil {
				s.refundFailures.Add(1)
			}
		}
	}
	for from := 0; from < len(ops); {
		to := from + 1
		for to < len(ops) && subjects[to] == subjects[from] {
			to++
		}
		sub := refundInfo{r: ri.r[from:to], wrote: ri.wrote[from:to]}
		allowed, nowUs, err := s.evalCall(ctx, now, subjects[from:to], ops[from:to], res[from:to], &sub)
		if err != nil {
			refundAll()
			return false, err
		}
		if !allowed {
			for i := to; i < len(ops); i++ {
				res[i] = result{skipped: true}
			}
			refundAll()
			for _, sg := range done {
				for i := sg.from; i < sg.to; i++ {
					if ri.wrote[i] {
						res[i].remaining += ops[i].cost
					}
					res[i].delayMs = 0
				}
			}
			return false, nil
		}
		done = append(done, seg{from, to, nowUs})
		from = to
	}
	return true, nil
}

// refund gives back what one subject's call wrote (ops with ri.wrote set,
// at offset off in ri), in one refund.lua call.
func (s *RedisStore) refund(ctx context.Context, now time.Time, subj Subject, ops []op, ri *refundInfo, off int, thenUs int64) error {
	subject := subj.Key()
	var keys []string
	args := make([]any, 0, 3+9*len(ops))
	if s.passTime {
		args = append(args, strconv.FormatInt(now.UnixMicro(), 10))
	} else {
		args = append(args, "")
	}
	args = append(args, thenUs, 0)
	n := 0
	for i := range ops {
		if !ri.wrote[off+i] {
			continue
		}
		o := &ops[i]
		keys = append(keys, stateKey(subject, o.policy, o.tag()))
		r := &ri.r[off+i]
		args = append(args, algoCode(o), o.cost, o.windowMs, o.region, r[0], r[1], r[2], r[3], r[4])
		n++
	}
	if n == 0 {
		return nil
	}
	args[2] = n
	// Straight to the client, never through the pipeline's queue, which
	// may be full (a refund is never shed).
	if err := refundScript.Run(ctx, s.client, keys, args...).Err(); err != nil {
		return fmt.Errorf("%w: refund: %v", ErrStoreUnavailable, err)
	}
	return nil
}

// RefundFailures is the number of refunds (see refund.go) that failed
// since the store was made: each left one subject of a rejected request
// over-charged by the request's cost. Safe for concurrent use.
func (s *RedisStore) RefundFailures() int64 { return s.refundFailures.Load() }
