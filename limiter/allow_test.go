package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

func allowPolicies(t *testing.T, doc string) []*Policy {
	t.Helper()
	pols, err := ParsePolicies([]byte(doc))
	require.NoError(t, err)
	return pols
}

func TestAllowNConsumesAllOrNothingAndPeeks(t *testing.T) {
	pols := allowPolicies(t, `[{"id": "b", "algorithm": "token_bucket", "rate_per_sec": 0.001, "burst": 5},
		{"id": "w", "algorithm": "fixed_window", "limit": 3, "window_s": 3600}]`)
	l, err := New(Config{}, pols)
	require.NoError(t, err)
	key := Subject{Kind: SubjectAPIKey, Value: "k"}
	ctx := context.Background()

	d, err := l.AllowN(ctx, key, 2, pols...)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	assert.Equal(t, []int64{3, 1}, []int64{d.Policies[0].Remaining, d.Policies[1].Remaining})

	// 2 more would pass the bucket (3 left) but not the window (1 left):
	// rejected, and the bucket keeps its 3.
	d, err = l.AllowN(ctx, key, 2, pols...)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	d, err = l.AllowN(ctx, key, 0, pols...)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "a peek")
	assert.Equal(t, []int64{3, 1}, []int64{d.Policies[0].Remaining, d.Policies[1].Remaining}, "nothing consumed by the rejection or the peek")

	_, err = l.AllowN(ctx, key, -1, pols...)
	assert.ErrorContains(t, err, "cost -1 is negative")
	_, err = l.Allow(ctx, key, &Policy{ID: "raw", Algorithm: TokenBucket, RatePerSec: 1, Burst: 1})
	assert.ErrorIs(t, err, ErrNoPolicies)
}

func TestWaitNHonoursTheShapingDelay(t *testing.T) {
	pols := allowPolicies(t, `[{"id": "s", "algorithm": "leaky_bucket", "rate_per_sec": 20, "burst": 3}]`)
	l, err := New(Config{}, pols)
	require.NoError(t, err)
	key := Subject{Kind: SubjectAPIKey, Value: "k"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var delays []time.Duration
	for range 3 {
		start := time.Now()
		d, err := l.WaitN(ctx, key, 1, pols...)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		assert.GreaterOrEqual(t, time.Since(start), d.Delay, "Wait returned before the delay passed")
		delays = append(delays, d.Delay)
	}
	assert.Zero(t, delays[0])
	assert.Positive(t, delays[1]+delays[2], "later requests are shaped")
}

func TestWaitNRetriesUntilAdmittedOrTheDeadline(t *testing.T) {
	pols := allowPolicies(t, `[{"id": "b", "algorithm": "token_bucket", "rate_per_sec": 50, "burst": 1},
		{"id": "slow", "subject": "account", "algorithm": "token_bucket", "rate_per_sec": 0.01, "burst": 1}]`)
	l, err := New(Config{}, pols)
	require.NoError(t, err)
	ctx := context.Background()
	key := Subject{Kind: SubjectAPIKey, Value: "k"}

	// Rejected at first (the bucket is empty), admitted after its retry
	// time, within the deadline.
	_, err = l.WaitN(ctx, key, 1, pols[0])
	require.NoError(t, err)
	bounded, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	d, err := l.WaitN(bounded, key, 1, pols[0])
	require.NoError(t, err)
	assert.True(t, d.Allowed)

	// The next token is 100 s away, past a 1 s deadline: WaitN returns at
	// once with ErrRejected, before the context ends.
	acct := Subject{Kind: SubjectAccount, Value: "a"}
	_, err = l.WaitN(ctx, acct, 1, pols[1])
	require.NoError(t, err)
	short, cancel2 := context.WithTimeout(ctx, time.Second)
	defer cancel2()
	_, err = l.WaitN(short, acct, 1, pols[1])
	var we *WaitError
	require.ErrorAs(t, err, &we)
	assert.ErrorIs(t, err, ErrRejected)
	assert.NoError(t, short.Err(), "returned without sleeping into the deadline")
	assert.False(t, we.Decision.Allowed)

	// A cost no policy can ever admit fails at once too.
	_, err = l.WaitN(ctx, key, 5, pols[0])
	assert.ErrorIs(t, err, ErrRejected)
	assert.ErrorContains(t, err, `can ever admit`)
}

func TestWaitNFailsClosedWhenTheStoreIsDown(t *testing.T) {
	srv := redistest.StartServer(t)
	pols := allowPolicies(t, `[{"id": "login", "class": "security", "algorithm": "fixed_window", "limit": 5, "window_s": 60}]`)
	l, err := New(Config{Store: NewRedisStore(srv.Client()), Deadline: 50 * time.Millisecond}, pols)
	require.NoError(t, err)
	srv.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = l.Wait(ctx, Subject{Kind: SubjectAPIKey, Value: "k"}, pols...)
	assert.ErrorIs(t, err, ErrFailedClosed)
}

func TestReserveSaysWhenToAct(t *testing.T) {
	pols := allowPolicies(t, `[{"id": "s", "algorithm": "leaky_bucket", "rate_per_sec": 10, "burst": 2},
		{"id": "w", "subject": "account", "algorithm": "fixed_window", "limit": 1, "window_s": 3600}]`)
	l, err := New(Config{}, pols)
	require.NoError(t, err)
	ctx := context.Background()
	key := Subject{Kind: SubjectAPIKey, Value: "k"}
	before := time.Now()
	r1, err := l.Reserve(ctx, key, 1, pols[0])
	require.NoError(t, err)
	r2, err := l.Reserve(ctx, key, 1, pols[0])
	require.NoError(t, err)
	r3, err := l.Reserve(ctx, key, 1, pols[0])
	require.NoError(t, err)
	require.True(t, r1.OK && r2.OK)
	assert.Zero(t, r1.Decision.Delay)
	assert.False(t, r2.At.Before(before.Add(r2.Decision.Delay)))
	assert.Positive(t, r2.Decision.Delay)
	assert.False(t, r3.OK, "the queue of 2 is full")
	assert.True(t, r3.At.After(before), "when to try again")

	acct := Subject{Kind: SubjectAccount, Value: "a"}
	_, err = l.Reserve(ctx, acct, 1, pols[1])
	require.NoError(t, err)
	r, err := l.Reserve(ctx, acct, 1, pols[1])
	require.NoError(t, err)
	assert.False(t, r.OK)
	assert.Positive(t, r.Delay(), "until the hour's window ends")
	assert.LessOrEqual(t, r.Delay(), time.Hour)
	r, err = l.Reserve(ctx, acct, 2, pols[1])
	require.NoError(t, err)
	assert.True(t, r.At.IsZero(), "never: a cost above the limit")
}
