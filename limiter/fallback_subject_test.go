package limiter

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckSubjectFallbackAt(t *testing.T) {
	ps, err := ParsePolicies([]byte(`[
		{"id":"q","algorithm":"token_bucket","rate_per_sec":10,"burst":5},
		{"id":"login","class":"security","algorithm":"sliding_window_log","limit":5,"window_s":60}
	]`))
	require.NoError(t, err)
	l, err := New(Config{}, ps)
	require.NoError(t, err)
	subj := Subject{Kind: SubjectAPIKey, Value: "k"}

	// quota fails open onto twice the burst: 10 at once, then refused.
	admitted := 0
	for range 12 {
		d, err := l.checkSubjectFallbackAt(at(0), subj, ps[:1], 1)
		require.NoError(t, err)
		assert.Equal(t, SourceFallback, d.Source)
		if d.Allowed {
			admitted++
		}
	}
	assert.Equal(t, 10, admitted)
	// 100 ms later twice the rate (20/s) has refilled 2.
	d, err := l.checkSubjectFallbackAt(at(100), subj, ps[:1], 2)
	require.NoError(t, err)
	assert.True(t, d.Allowed)

	// security fails closed.
	d, err = l.checkSubjectFallbackAt(at(100), subj, ps[1:], 1)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.True(t, d.FailedClosed())
}
