package dailyquota

import (
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWindows(t *testing.T) {
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err)
		return v
	}
	for _, tc := range []struct {
		spec       Spec
		at         string
		start, end string
	}{
		{Fixed(Day), "2026-03-01T00:00:00Z", "2026-03-01T00:00:00Z", "2026-03-02T00:00:00Z"},
		{Fixed(Day), "2026-02-28T23:59:59.999Z", "2026-02-28T00:00:00Z", "2026-03-01T00:00:00Z"},
		{Fixed(Day), "2026-03-01T09:00:00+09:00", "2026-03-01T00:00:00Z", "2026-03-02T00:00:00Z"}, // 00:00 UTC
		{Fixed(Day), "1969-12-31T12:00:00Z", "1969-12-31T00:00:00Z", "1970-01-01T00:00:00Z"},
		{Fixed(time.Hour), "2026-03-01T10:30:00Z", "2026-03-01T10:00:00Z", "2026-03-01T11:00:00Z"},
		{Fixed(90 * time.Second), "1970-01-01T00:02:59Z", "1970-01-01T00:01:30Z", "1970-01-01T00:03:00Z"},
		{Month(), "2028-02-29T23:00:00Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"}, // leap year
		{Month(), "2026-12-31T23:59:59Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{Month(), "2027-01-01T00:30:00+01:00", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"}, // still Dec in UTC
	} {
		w := tc.spec.At(utc(tc.at))
		assert.Equal(t, utc(tc.start), w.Start(), "%v at %s", tc.spec, tc.at)
		assert.Equal(t, utc(tc.end), w.End(), "%v at %s", tc.spec, tc.at)
		assert.True(t, w.Contains(utc(tc.at)))
		assert.False(t, w.Contains(w.End()))
		assert.Equal(t, w.EndMs, tc.spec.Next(w).StartMs)
		assert.True(t, tc.spec.Aligned(w.StartMs, w.LengthMs()))
		assert.False(t, tc.spec.Aligned(w.StartMs+1, w.LengthMs()))
	}
	assert.ErrorIs(t, Spec{}.Validate(), ErrInvalid)
	assert.ErrorContains(t, Fixed(time.Microsecond).Validate(), "window length")
	assert.NoError(t, Month().Validate())
}

func count(region string, start, n int64) Count {
	return Count{Key: Key{Subject: "a:acme", Policy: "day", StartMs: start, Region: region}, WindowMs: 86_400_000, N: n}
}

func TestPublisher(t *testing.T) {
	day := int64(86_400_000)
	t0 := time.UnixMilli(100 * day)
	cfg := DefaultPublisherConfig("a")
	cfg.Refresh = time.Minute
	p, err := NewPublisher(cfg)
	require.NoError(t, err)
	start := 100 * day

	got := p.Pending(t0, []Count{count("a", start, 5), count("b", start, 9), count("a", start-day, 7)})
	require.Len(t, got, 1, "only this region's count of a live window")
	assert.Equal(t, int64(5), got[0].N)
	assert.Equal(t, t0.UnixMilli(), got[0].UpdatedMs)

	// Not acknowledged: offered again.
	assert.Len(t, p.Pending(t0.Add(time.Second), []Count{count("a", start, 5)}), 1)
	p.Acked(t0.Add(time.Second), []Count{count("a", start, 5)})
	assert.Empty(t, p.Pending(t0.Add(2*time.Second), []Count{count("a", start, 5)}), "unchanged")
	assert.Empty(t, p.Pending(t0.Add(2*time.Second), []Count{count("a", start, 4)}), "smaller (stale read)")
	got = p.Pending(t0.Add(3*time.Second), []Count{count("a", start, 6), count("a", start, 8)})
	require.Len(t, got, 1)
	assert.Equal(t, int64(8), got[0].N, "the larger of two observations")
	p.Acked(t0.Add(3*time.Second), got)
	p.Acked(t0.Add(3*time.Second), []Count{count("a", start, 2)})

	// Refresh after a minute without change, with the acknowledged count.
	got = p.Pending(t0.Add(64*time.Second), nil)
	require.Len(t, got, 1)
	assert.Equal(t, int64(8), got[0].N)
	assert.Equal(t, 1, p.Tracked())
	// The window ends: forgotten, nothing more to publish.
	assert.Empty(t, p.Pending(time.UnixMilli(start+day), nil))
	assert.Equal(t, 0, p.Tracked())

	_, err = NewPublisher(PublisherConfig{Region: "bad region"})
	assert.ErrorContains(t, err, "region")
}

func TestAccept(t *testing.T) {
	day := int64(86_400_000)
	pols := map[string]Policy{"day": {ID: "day", Limit: 10, Window: Fixed(Day)}}
	now := time.UnixMilli(100*day + 500)
	assert.NoError(t, Accept(now, count("b", 100*day, 3), pols, time.Second))
	assert.NoError(t, Accept(now, count("b", 99*day, 3), pols, time.Second), "within the grace")
	assert.ErrorIs(t, Accept(now.Add(time.Second), count("b", 99*day, 3), pols, time.Second), ErrExpired)
	assert.ErrorIs(t, Accept(now, count("b", 100*day+1, 3), pols, time.Second), ErrInvalid)
	c := count("b", 100*day, 3)
	c.Policy = "other"
	assert.ErrorContains(t, Accept(now, c, pols, time.Second), `policy "other"`)
	c = count("b", 100*day, -1)
	assert.ErrorContains(t, Accept(now, c, pols, time.Second), "n -1")
}

// TestCapsAgainstRationals checks Caps against exact rational arithmetic:
// the caps sum to the limit, each part is its exact share rounded down or
// up by one, every cap is at least the region's count, and the result does
// not depend on map order or on the order of regions.
func TestCapsAgainstRationals(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	cfg := DefaultSplitConfig()
	names := []string{"a", "b", "c", "d", "e"}
	for trial := range 2000 {
		limit := 1 + rng.Int64N(1_000_000_000_000)
		n := 1 + rng.IntN(len(names))
		counts := map[string]int64{}
		var total int64
		for _, r := range names[:n] {
			if rng.IntN(4) > 0 {
				c := rng.Int64N(limit/int64(n) + 1)
				counts[r] = c
				total += c
			}
		}
		caps := Caps(limit, names[:n], counts, cfg)
		rem := limit - total
		if rem*1000 > cfg.BelowPermille*limit {
			assert.Nil(t, caps, "trial %d", trial)
			continue
		}
		require.NotNil(t, caps, "trial %d", trial)
		var sum int64
		quiet := max(1, total*cfg.QuietPermille/(1000*int64(n)))
		sumW := total + quiet*int64(n)
		for _, r := range names[:n] {
			sum += caps[r]
			part := caps[r] - counts[r]
			exact := new(big.Rat).SetFrac(big.NewInt(0).Mul(big.NewInt(rem), big.NewInt(counts[r]+quiet)), big.NewInt(sumW))
			lo, _ := new(big.Float).SetRat(exact).Int64()
			assert.True(t, part == lo || part == lo+1, "trial %d region %s: part %d, exact %s", trial, r, part, exact.FloatString(3))
		}
		assert.Equal(t, limit, sum, "trial %d", trial)
		rev := []string{}
		for i := n - 1; i >= 0; i-- {
			rev = append(rev, names[i])
		}
		assert.Equal(t, caps, Caps(limit, rev, counts, cfg), "trial %d", trial)
	}
	// Spent: every cap is the count.
	assert.Equal(t, map[string]int64{"a": 7, "b": 5}, Caps(10, []string{"a", "b"}, map[string]int64{"a": 7, "b": 5}, cfg))
	// A quiet region still gets a part.
	caps := Caps(1000, []string{"a", "b"}, map[string]int64{"a": 900}, cfg)
	assert.Positive(t, caps["b"])
	assert.Equal(t, int64(1000), caps["a"]+caps["b"])
}

func TestDriverConfigErrors(t *testing.T) {
	pols := []Policy{{ID: "day", Limit: 10, Window: Fixed(Day)}}
	for _, tc := range []struct {
		mut  func(*DriverConfig)
		want string
	}{
		{func(c *DriverConfig) { c.Regions = []string{"b"} }, "must include this region"},
		{func(c *DriverConfig) { c.Policies = nil }, "policies"},
		{func(c *DriverConfig) { c.Policies = append(c.Policies, c.Policies[0]) }, "duplicate id"},
		{func(c *DriverConfig) { c.Policies = []Policy{{ID: "x", Limit: 0, Window: Fixed(Day)}} }, "limit 0"},
		{func(c *DriverConfig) { c.Interval = -time.Second }, "interval"},
		{func(c *DriverConfig) { c.Split.BelowPermille = 2000 }, "below permille"},
	} {
		cfg := DefaultDriverConfig("a", []string{"a", "b"}, pols)
		tc.mut(&cfg)
		err := cfg.Validate()
		assert.ErrorIs(t, err, ErrInvalid)
		assert.ErrorContains(t, err, tc.want)
	}
}
