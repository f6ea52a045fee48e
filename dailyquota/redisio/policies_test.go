package redisio_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/dailyquota"
	"github.com/quotientlabs/quotient/dailyquota/redisio"
	"github.com/quotientlabs/quotient/limiter"
)

// TestPoliciesCutTheLimitersWindows: the replicated policies are the global
// fixed windows, and dailyquota cuts exactly the windows the limiter counts
// in (months included), so every count a region publishes is aligned for
// every receiver.
func TestPoliciesCutTheLimitersWindows(t *testing.T) {
	ps, err := limiter.ParsePolicies([]byte(`[
		{"id":"month","algorithm":"fixed_window","limit":100000,"window":"month","scope":"global"},
		{"id":"day","algorithm":"fixed_window","limit":10000,"window_s":86400,"scope":"global"},
		{"id":"local-month","algorithm":"fixed_window","limit":5,"window":"month"},
		{"id":"rate","algorithm":"token_bucket","rate_per_sec":5,"scope":"global"}
	]`))
	require.NoError(t, err)
	got := redisio.Policies(ps)
	assert.Equal(t, []dailyquota.Policy{
		{ID: "month", Limit: 100000, Window: dailyquota.Month()},
		{ID: "day", Limit: 10000, Window: dailyquota.Fixed(dailyquota.Day)},
	}, got)

	rng := rand.New(rand.NewPCG(3, 4))
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for range 20_000 {
		at := base.Add(time.Duration(rng.Int64N(int64(12 * 366 * 24 * time.Hour))))
		for i, dq := range got {
			start, end := ps[i].WindowAt(at)
			w := dq.Window.At(at)
			if w.Start() != start || w.End() != end || !dq.Window.Aligned(start.UnixMilli(), end.Sub(start).Milliseconds()) {
				require.Failf(t, "windows differ", "%s at %s: limiter [%s, %s), dailyquota [%s, %s)", dq.ID, at, start, end, w.Start(), w.End())
			}
		}
	}
}
