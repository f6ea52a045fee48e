package calendar

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCivilEveryDay checks Civil against the standard library for every day
// from 1600 to 2500 (both sides of the epoch, every kind of leap year).
func TestCivilEveryDay(t *testing.T) {
	from := time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC)
	to := time.Date(2500, 1, 1, 0, 0, 0, 0, time.UTC)
	for d := from; d.Before(to); d = d.AddDate(0, 0, 1) {
		days := d.Unix() / 86400
		y, m, dd := Civil(days)
		if y != int64(d.Year()) || m != int64(d.Month()) || dd != int64(d.Day()) {
			require.Failf(t, "civil date", "day %d: got %d-%02d-%02d, want %s", days, y, m, dd, d.Format(time.DateOnly))
		}
	}
}

// TestMonthAtMatchesTime compares MonthAt with time.Date on random
// milliseconds, and on the last and first millisecond of every month from
// 1900 to 2200.
func TestMonthAtMatchesTime(t *testing.T) {
	want := func(ms int64) (int64, int64) {
		u := time.UnixMilli(ms).UTC()
		s := time.Date(u.Year(), u.Month(), 1, 0, 0, 0, 0, time.UTC)
		return s.UnixMilli(), s.AddDate(0, 1, 0).UnixMilli()
	}
	check := func(ms int64) {
		s, e := MonthAt(ms)
		ws, we := want(ms)
		if s != ws || e != we {
			require.Failf(t, "month", "ms %d (%s): got [%d, %d), want [%d, %d)", ms, time.UnixMilli(ms).UTC(), s, e, ws, we)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		check(rng.Int64N(20_000_000_000_000) - 5_000_000_000_000) // 1811 .. 2603
	}
	for m := time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC); m.Year() < 2200; m = m.AddDate(0, 1, 0) {
		check(m.UnixMilli())
		check(m.UnixMilli() - 1)
	}
}

func TestMonthAtExamples(t *testing.T) {
	ms := func(s string) int64 {
		tm, err := time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err)
		return tm.UnixMilli()
	}
	for _, c := range []struct{ at, start, end string }{
		{"2028-02-29T23:59:59.999Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"}, // leap year
		{"2026-02-28T23:59:59.999Z", "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"},
		{"2100-02-15T00:00:00Z", "2100-02-01T00:00:00Z", "2100-03-01T00:00:00Z"}, // not leap
		{"2000-02-29T12:00:00Z", "2000-02-01T00:00:00Z", "2000-03-01T00:00:00Z"}, // leap (400)
		{"2026-12-31T23:59:59.999Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"2027-01-01T00:00:00Z", "2027-01-01T00:00:00Z", "2027-02-01T00:00:00Z"},
		{"1970-01-01T00:00:00Z", "1970-01-01T00:00:00Z", "1970-02-01T00:00:00Z"},
		{"1969-12-31T23:59:59.999Z", "1969-12-01T00:00:00Z", "1970-01-01T00:00:00Z"},
	} {
		s, e := MonthAt(ms(c.at))
		assert.Equal(t, ms(c.start), s, c.at)
		assert.Equal(t, ms(c.end), e, c.at)
	}
	assert.Equal(t, int64(29), DaysIn(2024, 2))
	assert.Equal(t, int64(28), DaysIn(1900, 2))
	assert.Equal(t, int64(30), DaysIn(2026, 11))
}

func BenchmarkMonthAt(b *testing.B) {
	ms := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC).UnixMilli()
	var sink int64
	for i := range b.N {
		s, e := MonthAt(ms + int64(i)*1_000_003)
		sink += s ^ e
	}
	_ = sink
}
