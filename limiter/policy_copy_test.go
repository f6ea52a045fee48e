package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// copyPolicies has a field of every kind a caller could change behind the
// limiter's back: numbers, strings, mode, the Match slices and the Cost map
// (whose parsed form Validate rewrites in place).
const copyPolicies = `[
	{"id":"burst","algorithm":"token_bucket","rate_per_sec":1,"burst":3,
	 "match":{"tier":"pro","routes":["/v1/*"],"methods":["GET"]},
	 "cost":{"GET /v1/export":2}},
	{"id":"acct","subject":"account","algorithm":"fixed_window","limit":4,"window_s":60}]`

// TestPolicyChangedAfterNewChangesNothing: a caller that keeps the
// policies it gave New (and the slice) and changes every field, the Match
// slices and the Cost map, re-validating them, changes nothing the limiter
// decides: decision for decision it answers as a limiter given untouched
// copies of the same document, and it reports its own copies.
func TestPolicyChangedAfterNewChangesNothing(t *testing.T) {
	clock := newManualClock()
	ref, err := New(Config{Clock: clock}, mustPolicies(t, copyPolicies))
	require.NoError(t, err)
	mine := mustPolicies(t, copyPolicies)
	l, err := New(Config{Clock: clock}, mine)
	require.NoError(t, err)

	b, a := mine[0], mine[1]
	b.RatePerSec, b.Burst, b.Mode = 1000, 1000, Shadow
	b.Match.Tier = "free"
	b.Match.Routes[0] = "/elsewhere/*"
	b.Match.Methods[0] = "POST"
	b.Cost["GET /v1/export"] = 1
	b.Cost["GET /v1/items"] = 3
	a.Limit, a.Subject, a.Mode = 1000, SubjectUser, Shadow
	require.NoError(t, b.Validate())
	require.NoError(t, a.Validate())
	mine[0], mine[1] = mine[1], mine[0]

	ctx := context.Background()
	id := Identity{APIKey: "k", Account: "acme", Tier: "pro"}
	steps := []struct {
		path    string
		advance time.Duration
	}{
		{"/v1/export", 0}, {"/v1/export", 0}, {"/v1/items", 0}, {"/v1/items", 0},
		{"/v1/items", time.Second}, {"/v1/export", 2 * time.Second}, {"/v1/items", 0},
	}
	var allowed []bool
	for i, s := range steps {
		clock.Advance(s.advance)
		req := Request{Identity: id, Method: "GET", Path: s.path}
		want, err := ref.Check(ctx, req)
		require.NoError(t, err)
		got, err := l.Check(ctx, req)
		require.NoError(t, err)
		assert.Equal(t, want, got, "step %d: %s", i, s.path)
		allowed = append(allowed, got.Allowed)
	}
	// What the document says (burst of 3, exports cost 2, 1 token/s; 4 per
	// minute per account), so the comparison above compared real limits.
	assert.Equal(t, []bool{true, false, true, false, true, true, false}, allowed)

	ps := l.Policies()
	require.Len(t, ps, 2)
	assert.Equal(t, []string{"burst", "acct"}, []string{ps[0].ID, ps[1].ID})
	assert.NotSame(t, b, ps[0], "the limiter reports the caller's policy")
	assert.Equal(t, 3.0, ps[0].Burst)
	assert.Equal(t, []string{"/v1/*"}, ps[0].Match.Routes)
	assert.Equal(t, map[string]int64{"GET /v1/export": 2}, ps[0].Cost)
	d, err := l.Check(ctx, Request{Identity: id, Method: "GET", Path: "/v1/items", Peek: true})
	require.NoError(t, err)
	require.Len(t, d.Policies, 2)
	assert.Same(t, ps[0], d.Policies[0].Policy, "PolicyDecision.Policy is the limiter's copy")
	assert.Same(t, ps[1], d.Policies[1].Policy)
}

// TestSetPoliciesCopies: SetPolicies keeps its own copies too, and
// refuses, naming it, a policy changed into an invalid one after its
// Validate, keeping the old set.
func TestSetPoliciesCopies(t *testing.T) {
	l, err := New(Config{Clock: newManualClock()}, nil)
	require.NoError(t, err)
	ps := mustPolicies(t, copyPolicies)
	require.NoError(t, l.SetPolicies(ps))
	ps[1].Limit = 1
	id := Identity{APIKey: "k", Account: "acme"}
	for i := range 4 {
		d, err := l.Check(context.Background(), Request{Identity: id, Method: "GET", Path: "/v2/x"})
		require.NoError(t, err)
		assert.True(t, d.Allowed, "request %d of the account's 4", i)
	}

	bad := mustPolicies(t, copyPolicies)
	bad[1].WindowSec = -5
	err = l.SetPolicies(bad)
	require.ErrorIs(t, err, ErrInvalidPolicy)
	assert.ErrorContains(t, err, "policies[1].window_s")
	assert.Equal(t, int64(4), l.Policies()[1].Limit, "the old set stays")
}

// TestFallbackSharedByCopyAndCallersPolicy: the fallback limiter of a
// (policy, subject) is the same whether a request comes through Check
// (the limiter's copy of the policy) or through Allow with the caller's
// own *Policy: alternating them, the open fallback (burst 5 x 2) admits 10
// in all, not 10 per caller or a fresh limiter at every switch.
func TestFallbackSharedByCopyAndCallersPolicy(t *testing.T) {
	fs := newFlakyStore()
	fs.failing.Store(true)
	ps := mustPolicies(t, `[{"id":"b","algorithm":"token_bucket","rate_per_sec":0.01,"burst":5}]`)
	l, err := New(Config{Store: fs, Clock: newManualClock()}, ps)
	require.NoError(t, err)
	ctx := context.Background()
	admitted := 0
	for i := range 20 {
		var d Decision
		if i%2 == 0 {
			d, err = l.Check(ctx, Request{Identity: Identity{APIKey: "k"}})
		} else {
			d, err = l.Allow(ctx, Subject{Kind: SubjectAPIKey, Value: "k"}, ps[0])
		}
		require.NoError(t, err)
		require.Equal(t, SourceFallback, d.Source)
		if d.Allowed {
			admitted++
		}
	}
	assert.Equal(t, 10, admitted)
}

// BenchmarkFallbackDecide is one request of two policies (a key's bucket,
// an account's window) answered by the in-process fallback, the path every
// request takes while the store is down.
func BenchmarkFallbackDecide(b *testing.B) {
	ps := mustPolicies(b, copyPolicies)
	l, err := New(Config{Clock: newManualClock()}, ps)
	require.NoError(b, err)
	ps = l.Policies()
	now := l.Now()
	req := []SubjectPolicies{
		{Subject: Subject{Kind: SubjectAPIKey, Value: "k"}, Policies: ps[:1]},
		{Subject: Subject{Kind: SubjectAccount, Value: "acme"}, Policies: ps[1:]},
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := l.checkSubjectsFallbackAt(now.Add(time.Duration(i)*time.Second), req, 1); err != nil {
			b.Fatal(err)
		}
	}
}
