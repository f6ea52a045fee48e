package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mapOverrides is a fixed table of overrides, expiring at until.
type mapOverrides struct {
	byKey map[string]*Policy // subject key + "|" + policy id
	until time.Time
}

var _ Overrides = (*mapOverrides)(nil)

func (m *mapOverrides) Override(subject Subject, policyID string, now time.Time) (*Policy, bool) {
	p, ok := m.byKey[subject.Key()+"|"+policyID]
	if !ok || !now.Before(m.until) {
		return nil, false
	}
	return p, true
}

func TestOverridesReplaceAPolicyForOneSubject(t *testing.T) {
	base := mustPolicy(t, `{"id":"pro","algorithm":"token_bucket","rate_per_sec":1,"burst":2}`)
	raised := mustPolicy(t, `{"id":"pro","algorithm":"token_bucket","rate_per_sec":1,"burst":5}`)
	other := mustPolicy(t, `{"id":"elsewhere","algorithm":"token_bucket","rate_per_sec":1,"burst":50}`)
	ov := &mapOverrides{byKey: map[string]*Policy{
		"k:vip|pro":    raised,
		"k:broken|pro": other, // another id: ignored, it would count elsewhere
	}, until: at(60_000)}
	l, err := New(Config{Overrides: ov}, []*Policy{base})
	require.NoError(t, err)
	admitted := func(key string, ms int64) int {
		n := 0
		for range 10 {
			d, err := l.CheckAt(context.Background(), at(ms), Request{Identity: Identity{APIKey: key}, Method: "GET", Path: "/"})
			require.NoError(t, err)
			if d.Allowed {
				n++
			}
		}
		return n
	}
	assert.Equal(t, 5, admitted("vip", 0), "the override's burst")
	assert.Equal(t, 2, admitted("plain", 0), "the policy's burst")
	assert.Equal(t, 2, admitted("broken", 0), "an override with another id is not used")
	// After expiry the policy applies again (the bucket refilled meanwhile).
	assert.Equal(t, 2, admitted("vip", 120_000))
}
