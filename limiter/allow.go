package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The calls of this file are the common case of golang.org/x/time/rate
// and redis_rate users: one subject, the policies that limit it, no HTTP
// request. Each is one CheckSubjectsInto, so everything of Check applies:
// the store deadline, the breaker, each policy's fallback, the deny cache,
// overrides, usage counting of global policies, metrics and events.

// ErrRejected is returned by Wait when the policies will not admit the
// request before the context ends, or never can (a cost above a policy's
// capacity). It wraps nothing; the Decision that rejected is in the
// *WaitError it comes in.
var ErrRejected = errors.New("limiter: request rejected")

// ErrFailedClosed is returned by Wait when an enforced fail-closed policy
// could not be decided (the store was unavailable): a service error, not
// the caller's excess.
var ErrFailedClosed = errors.New("limiter: store unavailable and a policy fails closed")

// WaitError is the error of a Wait that did not admit: Err is ErrRejected,
// ErrFailedClosed, or ErrCanceled (wrapping the context's error), and
// Decision is the last decision made (zero when none was).
type WaitError struct {
	Err      error
	Decision Decision
}

func (e *WaitError) Error() string { return e.Err.Error() }

// Unwrap returns Err, for errors.Is.
func (e *WaitError) Unwrap() error { return e.Err }

// Allow decides one request of cost 1 of subject under policies, now. It
// is AllowN(ctx, subject, 1, policies...).
func (l *Limiter) Allow(ctx context.Context, subject Subject, policies ...*Policy) (Decision, error) {
	return l.AllowN(ctx, subject, 1, policies...)
}

// AllowN decides one request of n cost units of subject under policies
// (each validated: from ParsePolicies, ParsePolicy or Policy.Validate),
// now: admitted, it consumes n from every enforced policy; rejected, it
// consumes nothing (all or nothing, as Check). n = 0 peeks: every policy
// is evaluated and nothing is consumed. A shaping (leaky bucket) policy
// admits with Decision.Delay set: the caller must hold the work that long
// (Wait does). Policies with a Match still apply: the caller selected them.
//
// Errors: n < 0; ErrNoPolicies for a policy not validated; a policy listed
// twice; ErrCanceled when ctx ends first. A store failure is no error: the
// fallback answers (Decision.Source). Safe for concurrent use.
func (l *Limiter) AllowN(ctx context.Context, subject Subject, n int64, policies ...*Policy) (Decision, error) {
	var d Decision
	if n < 0 {
		return d, fmt.Errorf("limiter: AllowN: cost %d is negative", n)
	}
	req := Request{Cost: n, Peek: n == 0}
	err := l.CheckSubjectsInto(ctx, l.Now(), []SubjectPolicies{{Subject: subject, Policies: policies}}, req, &d)
	return d, err
}

// Wait blocks until one request of cost 1 of subject is admitted under
// policies and its shaping delay has passed, or ctx ends. It is
// WaitN(ctx, subject, 1, policies...).
func (l *Limiter) Wait(ctx context.Context, subject Subject, policies ...*Policy) error {
	_, err := l.WaitN(ctx, subject, 1, policies...)
	return err
}

// WaitN blocks until a request of n cost units of subject is admitted under
// policies and then for its shaping delay (Decision.Delay, set by leaky
// buckets), and returns the admitting decision. A rejection is retried at
// its retry time (Decision.RetryAfter); when that is past ctx's deadline
// WaitN returns at once, as golang.org/x/time/rate does, instead of
// sleeping into a certain failure. Errors are a *WaitError: ErrRejected
// (the deadline is too close, or a policy can never admit n), ErrFailedClosed
// (Redis down and a policy fails closed), or ErrCanceled when ctx ends
// while waiting. It sleeps on the wall clock (time.Timer), whatever
// Config.Clock says. Once admitted the units are consumed: if ctx ends during
// the shaping delay, WaitN returns ErrCanceled and the units stay spent
// (the queue of a leaky bucket already holds them). Bad arguments are
// AllowN's errors. Safe for concurrent use.
func (l *Limiter) WaitN(ctx context.Context, subject Subject, n int64, policies ...*Policy) (Decision, error) {
	for {
		d, err := l.AllowN(ctx, subject, n, policies...)
		if err != nil {
			if errors.Is(err, ErrCanceled) {
				return d, &WaitError{Err: err}
			}
			return d, err
		}
		if d.Allowed {
			if d.Delay <= 0 {
				return d, nil
			}
			if err := sleepCtx(ctx, d.Delay); err != nil {
				return d, &WaitError{Err: err, Decision: d}
			}
			return d, nil
		}
		if d.FailedClosed() {
			return d, &WaitError{Err: ErrFailedClosed, Decision: d}
		}
		retry := d.RetryAfter()
		for _, p := range d.Policies {
			if p.Never && !p.Allowed && p.Policy.Mode != Shadow {
				return d, &WaitError{Err: fmt.Errorf("%w: cost %d exceeds what policy %q can ever admit", ErrRejected, n, p.Policy.ID), Decision: d}
			}
		}
		retry = max(retry, time.Millisecond)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < retry {
			return d, &WaitError{Err: fmt.Errorf("%w: would be admitted in %v, past the context's deadline", ErrRejected, retry), Decision: d}
		}
		if err := sleepCtx(ctx, retry); err != nil {
			return d, &WaitError{Err: err, Decision: d}
		}
	}
}

// Reservation is what Reserve decided: when the caller may act.
type Reservation struct {
	// OK reports whether the request was admitted (its units consumed).
	OK bool
	// At is when to act: now plus the shaping delay when OK, otherwise the
	// earliest time a new attempt could be admitted (zero when it never
	// can, or when the store was unavailable and a policy fails closed).
	At time.Time
	// Decision is the full decision.
	Decision Decision
}

// Delay is how long from now until r.At (0 when At has passed or is zero).
func (r Reservation) Delay() time.Duration {
	if r.At.IsZero() {
		return 0
	}
	return max(0, time.Until(r.At))
}

// Reserve decides a request of n cost units of subject under policies now,
// for callers that schedule their work instead of blocking: an admitted
// request's units are consumed and it is to run at Reservation.At (after
// its shaping delay); a rejected one consumed nothing and At says when to
// try again. Unlike golang.org/x/time/rate, a reservation is not queued and
// cannot be cancelled: the decision is made in the shared store at once, as
// for AllowN (its errors too). Safe for concurrent use.
func (l *Limiter) Reserve(ctx context.Context, subject Subject, n int64, policies ...*Policy) (Reservation, error) {
	d, err := l.AllowN(ctx, subject, n, policies...)
	if err != nil {
		return Reservation{Decision: d}, err
	}
	now := time.Now()
	r := Reservation{OK: d.Allowed, Decision: d}
	switch {
	case d.Allowed:
		r.At = now.Add(d.Delay)
	case d.FailedClosed():
	default:
		never := false
		for _, p := range d.Policies {
			never = never || (p.Never && !p.Allowed && p.Policy.Mode != Shadow)
		}
		if !never {
			r.At = now.Add(d.RetryAfter())
		}
	}
	return r, nil
}

// sleepCtx sleeps for d or until ctx ends (ErrCanceled wrapping its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrCanceled, ctx.Err())
	}
}
