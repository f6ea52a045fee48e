package rebalancer

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/shares"
)

// TestShareColumn checks the sparse column against a dense one: every
// line reads back what was pushed, for lengths around the 64-line words
// and densities from none to every line.
func TestShareColumn(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 63, 64, 65, 127, 128, 129, 1000} {
		for _, density := range []float64{0, 0.01, 0.5, 1} {
			t.Run(fmt.Sprintf("n=%d/density=%v", n, density), func(t *testing.T) {
				dense := make([]shares.Share, n)
				col := makeShareColumn(n)
				nonZero := 0
				for l := range dense {
					if rng.Float64() < density {
						dense[l] = shares.Share{RateMilli: rng.Int64N(1 << 46), BurstMilli: rng.Int64N(3)}
						if dense[l] != (shares.Share{}) {
							nonZero++
						}
					}
					col.push(dense[l])
				}
				for l, want := range dense {
					require.Equal(t, want, col.get(l), "line %d", l)
				}
				assert.Len(t, col.vals, nonZero, "only the non-zero values are stored")
				assert.Equal(t, (n+63)/64, len(col.bits))
			})
		}
	}
}

// TestStoredWants receives a full report and a delta whose lines want
// growth on some keys only (over several 64-line words) and reads every
// key's line back through lineOf, with its want: from the full report,
// from the delta's own lines, and through the delta to its base.
func TestStoredWants(t *testing.T) {
	_, b, _ := deltaPair(t, nil)
	const n = 200
	rng := rand.New(rand.NewPCG(3, 4))
	mkLine := func(i int, want bool) KeyReport {
		k := KeyReport{Key: Key{"p", fmt.Sprintf("k%03d", i)}, Demand: int64(i), Admitted: int64(i), SmoothedDemandMilli: int64(1000 * i),
			Share: shares.Share{RateMilli: int64(10 + i), BurstMilli: int64(20 + i)}}
		if want {
			k.Want = shares.Share{RateMilli: 1 + rng.Int64N(1000), BurstMilli: rng.Int64N(1000)}
		}
		return k
	}
	e := EpochOf(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Second)
	full := &Report{Region: "a", Epoch: e, Seq: e, AcceptsDelta: true}
	for i := range n {
		full.Keys = append(full.Keys, mkLine(i, rng.IntN(10) == 0))
	}
	rc, err := b.Receive(full)
	require.NoError(t, err)
	require.Equal(t, Accepted, rc)
	// The delta changes the wants of some keys (set, cleared, new) and
	// lists nothing else.
	delta := &Report{Region: "a", Epoch: e + 1, Seq: e + 1, Base: e, AcceptsDelta: true}
	expect := map[Key]KeyReport{}
	for _, k := range full.Keys {
		expect[k.Key] = k
	}
	for i := 0; i < n; i += 7 {
		k := mkLine(i, expect[full.Keys[i].Key].Want == (shares.Share{}))
		delta.Keys = append(delta.Keys, k)
		expect[k.Key] = k
	}
	rc, err = b.Receive(delta)
	require.NoError(t, err)
	require.Equal(t, Accepted, rc)

	q := &b.remote[b.index["a"]]
	for _, tc := range []struct {
		epoch int64
		lines map[Key]KeyReport
	}{{e, nil}, {e + 1, expect}} {
		s := q.reports[tc.epoch]
		require.NotNil(t, s)
		for i, k := range full.Keys {
			if tc.lines != nil {
				k = tc.lines[k.Key]
			}
			j, ok := b.tab.find(k.Key)
			require.True(t, ok)
			got, ok := b.lineOf(s, j)
			require.True(t, ok, "epoch %d line %d", tc.epoch, i)
			assert.Equal(t, lineView{smoothed: k.SmoothedDemandMilli, share: k.Share, want: k.Want}, got, "epoch %d line %d", tc.epoch, i)
		}
	}
}

// TestLineIndex checks the sparse index of a delta's lines against a map:
// every listed key index answers its line, every other (below, between,
// beyond the largest listed, negative) answers -1.
func TestLineIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 1, 2, 63, 64, 65, 500} {
		for _, spread := range []int{1, 3, 100} {
			idx := make([]int32, 0, n)
			want := map[int32]int{}
			for len(idx) < n {
				j := rng.Int32N(int32(n*spread + 1))
				if _, dup := want[j]; dup {
					continue
				}
				want[j] = len(idx)
				idx = append(idx, j)
			}
			x := makeLineIndex(idx)
			for j := int32(-1); j <= int32(n*spread+130); j++ {
				l, ok := want[j]
				if !ok {
					l = -1
				}
				require.Equal(t, l, x.get(j), "n %d spread %d key index %d", n, spread, j)
			}
		}
	}
}
