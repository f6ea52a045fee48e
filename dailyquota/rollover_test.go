package dailyquota_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/dailyquota"
)

// TestRolloverAtUTCMidnight runs two regions across a UTC midnight with
// injected time, then steps region clocks backwards across it: the day
// rolls over once, yesterday's counts never come back, late counts of
// yesterday are dropped, and the backwards clock neither reopens yesterday
// nor mints quota.
func TestRolloverAtUTCMidnight(t *testing.T) {
	midnight := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	h := newHarness(t, midnight.Add(-3*time.Second), []string{"a", "b"},
		`{"id":"day","algorithm":"fixed_window","limit":10,"window_s":86400,"scope":"global"}`, 200*time.Millisecond, false)
	step := func(d time.Duration) { h.now = h.now.Add(d); h.deliver() }

	// 23:59:57: a spends 6, b 3; replicated.
	for range 6 {
		require.True(t, h.admit(0, 1))
	}
	for range 3 {
		require.True(t, h.admit(1, 1))
	}
	h.pass()
	step(time.Second)
	assert.Equal(t, map[string]int64{"a": 6, "b": 3}, h.counts(0))
	assert.Equal(t, map[string]int64{"a": 6, "b": 3}, h.counts(1))
	// 23:59:58: b spends its last unit, a sees 10 of 10 only after replication.
	require.True(t, h.admit(1, 1))
	require.False(t, h.admit(1, 1), "the day is spent")
	h.pass() // b publishes 4, arriving at 23:59:58.2

	// 00:00:00.1: the day rolled. Yesterday's b=4 arrives after midnight
	// (within the grace) and must not resurrect yesterday in a.
	step(2*time.Second + 100*time.Millisecond)
	require.True(t, h.now.After(midnight))
	require.True(t, h.admit(0, 1), "a new day")
	wa := h.regions[0].store.WindowCounts(h.now, testSubject, "day")
	assert.Equal(t, midnight.UnixMilli(), wa.StartMs)
	assert.Equal(t, map[string]int64{"a": 1}, wa.Counts)
	h.pass()
	step(time.Second)
	assert.Equal(t, map[string]int64{"a": 1}, h.counts(1), "b rolled to today on a's count")

	// a's clock jumps back to 23:59:59 (NTP step): a keeps today's window
	// (the store never moves a window backwards), and b's late message of
	// yesterday, delivered now, is dropped.
	today := h.now
	h.now = midnight.Add(-time.Second)
	require.True(t, h.admit(0, 1))
	wa = h.regions[0].store.WindowCounts(h.now, testSubject, "day")
	assert.Equal(t, midnight.UnixMilli(), wa.StartMs, "the window stays today's")
	assert.Equal(t, map[string]int64{"a": 2}, wa.Counts)
	h.regions[0].driver.Deliver(countOf("b", midnight.Add(-24*time.Hour), 4))
	assert.Equal(t, map[string]int64{"a": 2}, h.counts(0), "yesterday's count is not merged")
	// While its clock is back in yesterday a publishes today's count (the
	// window it holds has not ended), and b merges it.
	h.pass()
	h.now = today.Add(time.Second)
	h.deliver()
	assert.Equal(t, map[string]int64{"a": 2}, h.counts(1))
	// Only 8 left today whatever the clocks did.
	for range 8 {
		require.True(t, h.admit(1, 1))
	}
	require.False(t, h.admit(1, 1))
	assert.Zero(t, h.regions[1].driver.Stats().Invalid)
}

// TestRolloverAtMonthEnd runs two regions on a monthly global quota across
// the end of a leap-year February with injected time: February's counts
// replicate with February's length (29 days), March starts once in both
// regions, a late count of February is dropped, and a clock stepped back
// into February neither reopens it nor mints quota.
func TestRolloverAtMonthEnd(t *testing.T) {
	march := time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC)
	feb := time.Date(2028, 2, 1, 0, 0, 0, 0, time.UTC)
	h := newHarness(t, march.Add(-3*time.Second), []string{"a", "b"},
		`{"id":"month","algorithm":"fixed_window","limit":10,"window":"month","scope":"global"}`, 200*time.Millisecond, false)
	step := func(d time.Duration) { h.now = h.now.Add(d); h.deliver() }

	// 2028-02-29 23:59:57: a spends 6, b 4, the whole month; replicated.
	for range 6 {
		require.True(t, h.admit(0, 1))
	}
	for range 4 {
		require.True(t, h.admit(1, 1))
	}
	h.pass()
	step(time.Second)
	assert.Equal(t, map[string]int64{"a": 6, "b": 4}, h.counts(0))
	assert.Equal(t, map[string]int64{"a": 6, "b": 4}, h.counts(1))
	require.False(t, h.admit(0, 1), "February is spent")
	wb := h.regions[1].store.WindowCounts(h.now, testSubject, "month")
	assert.Equal(t, feb.UnixMilli(), wb.StartMs)

	// 00:00:00.5 on March 1st: a new month in both regions.
	step(2*time.Second + 500*time.Millisecond)
	require.True(t, h.admit(0, 3), "a new month")
	h.pass()
	step(time.Second)
	wb = h.regions[1].store.WindowCounts(h.now, testSubject, "month")
	assert.Equal(t, march.UnixMilli(), wb.StartMs)
	assert.Equal(t, map[string]int64{"a": 3}, wb.Counts, "b rolled to March on a's count")

	// A late count of February (29 days long) is dropped; b's clock steps
	// back into February and still spends March's quota.
	h.regions[1].driver.Deliver(dailyquota.Count{Key: dailyquota.Key{Subject: testSubject.Key(), Policy: "month", StartMs: feb.UnixMilli(), Region: "a"}, WindowMs: 29 * 86_400_000, N: 9, UpdatedMs: feb.UnixMilli()})
	assert.Equal(t, map[string]int64{"a": 3}, h.counts(1))
	h.now = march.Add(-time.Second)
	for range 7 {
		require.True(t, h.admit(1, 1))
	}
	require.False(t, h.admit(1, 1), "only 7 left in March whatever the clocks did")
	assert.Equal(t, march.UnixMilli(), h.regions[1].store.WindowCounts(h.now, testSubject, "month").StartMs)
	assert.Zero(t, h.regions[0].driver.Stats().Invalid)
	assert.Zero(t, h.regions[1].driver.Stats().Invalid)
}
