package rawcheck_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/rawcheck"
	"github.com/quotientlabs/quotient/limiter"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newLimiter(t *testing.T) (*limiter.Limiter, []*limiter.Policy) {
	t.Helper()
	ps, err := limiter.ParsePolicies([]byte(`[
		{"id":"key","algorithm":"token_bucket","rate_per_sec":1,"burst":2},
		{"id":"acct","subject":"account","algorithm":"fixed_window","limit":3,"window_s":60},
		{"id":"login","class":"security","algorithm":"fixed_window","limit":5,"window_s":60}
	]`))
	require.NoError(t, err)
	l, err := limiter.New(limiter.Config{}, ps)
	require.NoError(t, err)
	return l, l.Policies()
}

// TestRawPathsNotInPublicAPI: the limiter's raw paths are not methods of
// *limiter.Limiter any more (go doc lists exported methods, and so does
// reflection); this package is the only way to them.
func TestRawPathsNotInPublicAPI(t *testing.T) {
	typ := reflect.TypeFor[*limiter.Limiter]()
	for _, name := range []string{"CheckSubjectAt", "CheckSubjectsAt", "CheckSubjectFallbackAt", "CheckSubjectsFallbackAt"} {
		_, ok := typ.MethodByName(name)
		assert.False(t, ok, "(*limiter.Limiter).%s is exported", name)
	}
}

// TestCheckSubjectAt decides in the store at the given time: the bucket of
// 2 admits two at t0, refuses the third, and has refilled one a second
// later; a cost of 0 peeks.
func TestCheckSubjectAt(t *testing.T) {
	l, ps := newLimiter(t)
	ctx := context.Background()
	k := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "k"}
	var got []bool
	for _, now := range []time.Time{t0, t0, t0, t0.Add(time.Second), t0.Add(time.Second)} {
		d, err := rawcheck.CheckSubjectAt(l, ctx, now, k, ps[:1], 1)
		require.NoError(t, err)
		require.Len(t, d.Policies, 1)
		assert.Equal(t, limiter.SourceStore, d.Policies[0].Source)
		got = append(got, d.Allowed)
	}
	assert.Equal(t, []bool{true, true, false, true, false}, got)
	d, err := rawcheck.CheckSubjectAt(l, ctx, t0.Add(2*time.Second), k, ps[:1], 0)
	require.NoError(t, err)
	assert.Equal(t, int64(1), d.Policies[0].Remaining, "a peek consumed")

	_, err = rawcheck.CheckSubjectAt(l, ctx, t0, k, []*limiter.Policy{{ID: "raw", Algorithm: limiter.TokenBucket, RatePerSec: 1}}, 1)
	assert.ErrorIs(t, err, limiter.ErrNoPolicies)
}

// TestCheckSubjectsAt is all or nothing across subjects: once the
// account's window of 3 is spent, a fresh key is refused and its bucket
// keeps both tokens.
func TestCheckSubjectsAt(t *testing.T) {
	l, ps := newLimiter(t)
	ctx := context.Background()
	acct := limiter.Subject{Kind: limiter.SubjectAccount, Value: "acme"}
	req := func(key string) []limiter.SubjectPolicies {
		return []limiter.SubjectPolicies{{Subject: limiter.Subject{Kind: limiter.SubjectAPIKey, Value: key}, Policies: ps[:1]}, {Subject: acct, Policies: ps[1:2]}}
	}
	var got []bool
	for _, key := range []string{"a", "a", "b", "b"} {
		d, err := rawcheck.CheckSubjectsAt(l, ctx, t0, req(key), 1)
		require.NoError(t, err)
		got = append(got, d.Allowed)
	}
	assert.Equal(t, []bool{true, true, true, false}, got)
	d, err := rawcheck.CheckSubjectAt(l, ctx, t0, limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "b"}, ps[:1], 0)
	require.NoError(t, err)
	assert.Equal(t, int64(1), d.Policies[0].Remaining, "the refused request spent key b's bucket")

	_, err = rawcheck.CheckSubjectsAt(l, ctx, t0, []limiter.SubjectPolicies{{Subject: acct, Policies: ps[1:2]}, {Subject: acct, Policies: ps[1:2]}}, 1)
	assert.ErrorContains(t, err, "listed twice")
}

// TestCheckSubjectsFallbackAt answers as the store outage fallback does:
// the quota bucket fails open onto twice its burst, the security window
// fails closed.
func TestCheckSubjectsFallbackAt(t *testing.T) {
	l, ps := newLimiter(t)
	k := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "k"}
	admitted := 0
	for range 6 {
		d, err := rawcheck.CheckSubjectsFallbackAt(l, t0, []limiter.SubjectPolicies{{Subject: k, Policies: ps[:1]}}, 1)
		require.NoError(t, err)
		assert.Equal(t, limiter.SourceFallback, d.Source)
		if d.Allowed {
			admitted++
		}
	}
	assert.Equal(t, 4, admitted, "open fallback: twice the burst of 2")
	d, err := rawcheck.CheckSubjectsFallbackAt(l, t0, []limiter.SubjectPolicies{{Subject: k, Policies: ps[2:]}}, 1)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.True(t, d.FailedClosed())
}
