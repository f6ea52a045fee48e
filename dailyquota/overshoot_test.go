package dailyquota_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// runPartition drives three regions over one hourly quota of 20000 (the
// fixed-window-replicated scenario's policy and rates) at 8, 5 and 4
// requests per second, in 1 s steps, with 100 ms replication latency and a
// 1 s publish interval. From cutAt on,
// us-east is cut off from the others for the rest of the hour. It returns
// the total admitted and each region's part.
func runPartition(t *testing.T, split bool, cutAt time.Duration) (total int64, perRegion []int64) {
	start := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	h := newHarness(t, start, []string{"us-east", "eu-west", "ap-south"},
		`{"id":"hour","algorithm":"fixed_window","limit":20000,"window_s":3600,"scope":"global"}`, 100*time.Millisecond, split)
	rates := []int{8, 5, 4} // per second
	perRegion = make([]int64, 3)
	for tick := time.Duration(0); tick < time.Hour; tick += time.Second {
		h.now = start.Add(tick)
		if tick == cutAt {
			h.cut[0] = true
		}
		h.deliver()
		for i, n := range rates {
			for range n {
				if h.admit(i, 1) {
					perRegion[i]++
				}
			}
		}
		h.pass()
	}
	return perRegion[0] + perRegion[1] + perRegion[2], perRegion
}

// TestOvershootConnected: with every region connected, the overshoot stays
// within the documented bound, what the other regions admit during one lag
// (D = publish interval 1 s + latency 100 ms, within two 1 s steps): at
// most 17 x 2 units.
func TestOvershootConnected(t *testing.T) {
	for _, split := range []bool{false, true} {
		total, per := runPartition(t, split, 2*time.Hour) // never cut
		t.Logf("split=%v: admitted %d of 20000 %v", split, total, per)
		assert.LessOrEqual(t, total, int64(20000+17*2), "bound: the others' admissions in one lag")
		assert.GreaterOrEqual(t, total, int64(20000-17*2), "nothing is left unspent beyond one lag of demand")
	}
}

// TestOvershootPartitionSplit cuts us-east off once 85% of the quota is
// spent (after 1000 s at 17/s): without the split, us-east
// spends the whole remainder it saw while the others spend it too; with
// the split it stops at its part.
func TestOvershootPartitionSplit(t *testing.T) {
	cut := 1000 * time.Second
	plain, perPlain := runPartition(t, false, cut)
	split, perSplit := runPartition(t, true, cut)
	t.Logf("partition at %v: without split admitted %d %v (overshoot %d); with split %d %v (overshoot %d)",
		cut, plain, perPlain, plain-20000, split, perSplit, split-20000)
	remainderAtCut := int64(20000 - 17*1000)
	assert.Greater(t, plain-20000, remainderAtCut/2, "without the split the cut region re-spends the remainder")
	// With the split, the cut region spends at most its part of the
	// remainder (its weight, 8/17 of it) beyond what the others assumed,
	// plus the lag term.
	assert.LessOrEqual(t, split-20000, remainderAtCut*8/17+int64(17*2))
	assert.Less(t, split, plain)
}
