package limiter

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReplicatedWindowDecidesOnTheSum(t *testing.T) {
	p := mustPolicy(t, `{"id":"day","algorithm":"fixed_window","limit":100,"window_s":86400,"scope":"global"}`)
	store := NewMemoryStore()
	l, err := New(Config{Store: store, Region: "us-east", Regions: 3}, []*Policy{p})
	require.NoError(t, err)
	subj := Subject{Kind: SubjectAPIKey, Value: "k"}
	ctx := context.Background()
	check := func(ms, cost int64) PolicyDecision {
		d, err := l.checkSubjectAt(ctx, at(ms), subj, []*Policy{p}, cost)
		require.NoError(t, err)
		return d.Policies[0]
	}
	day := int64(86_400_000)
	base := t0.UnixMilli() // t0 is a UTC midnight
	require.True(t, check(1_000, 30).Allowed)
	store.MergeWindowCount(at(1_000), subj, "day", base, day, "eu-west", 50)
	store.MergeWindowCount(at(1_000), subj, "day", base, day, "eu-west", 40) // older news: max wins
	store.MergeWindowCount(at(1_000), subj, "day", base, day, "eu-west", 50) // duplicate: no change
	assert.Equal(t, int64(20), check(2_000, 0).Remaining, "100 - 30 here - 50 in eu-west")
	assert.False(t, check(2_000, 21).Allowed)
	r := check(2_000, 20)
	assert.True(t, r.Allowed)
	assert.Equal(t, int64(0), r.Remaining)
	wc := store.WindowCounts(at(2_000), subj, "day")
	assert.Equal(t, map[string]int64{"us-east": 50, "eu-west": 50}, wc.Counts)

	// A count for yesterday is dropped; one for tomorrow starts tomorrow.
	store.MergeWindowCount(at(3_000), subj, "day", base-day, day, "ap-south", 99)
	assert.Equal(t, int64(0), store.WindowCounts(at(3_000), subj, "day").Counts["ap-south"])
	store.MergeWindowCount(at(3_000), subj, "day", base+day, day, "ap-south", 10)
	d := check(day+1_000, 5)
	assert.True(t, d.Allowed)
	assert.Equal(t, int64(85), d.Remaining, "tomorrow: 10 in ap-south, 5 here")

	// The coordinator's cap bounds this region whatever the others left.
	store.SetWindowCap(at(day+2_000), subj, "day", base+day, day, 8)
	assert.Equal(t, int64(3), check(day+2_000, 0).Remaining)
	assert.False(t, check(day+2_000, 4).Allowed)
	assert.True(t, check(day+2_000, 3).Allowed)
	store.SetWindowCap(at(day+3_000), subj, "day", base+day, day, -1)
	assert.Equal(t, int64(82), check(day+3_000, 0).Remaining)
}

// TestReplicatedMergeIsOrderIndependent applies the same counts in random
// orders, with duplicates, and requires the same state.
func TestReplicatedMergeIsOrderIndependent(t *testing.T) {
	type msg struct {
		ws     int64
		region string
		count  int64
	}
	rng := rand.New(rand.NewPCG(7, 7))
	var msgs []msg
	for range 200 {
		msgs = append(msgs, msg{ws: t0.UnixMilli() + int64(rng.IntN(3))*60_000, region: []string{"a", "b", "c"}[rng.IntN(3)], count: int64(rng.IntN(1000))})
	}
	subj := Subject{Kind: SubjectAccount, Value: "acme"}
	var want WindowCounts
	for trial := range 20 {
		store := NewMemoryStore()
		order := rng.Perm(len(msgs))
		for _, i := range order {
			m := msgs[i]
			store.MergeWindowCount(at(0), subj, "q", m.ws, 60_000, m.region, m.count)
			if rng.IntN(4) == 0 {
				store.MergeWindowCount(at(0), subj, "q", m.ws, 60_000, m.region, m.count)
			}
		}
		got := store.WindowCounts(at(0), subj, "q")
		if trial == 0 {
			want = got
			// The newest window wins, with each region's maximum in it.
			assert.Equal(t, t0.UnixMilli()+120_000, got.StartMs)
			for _, r := range []string{"a", "b", "c"} {
				var max int64
				for _, m := range msgs {
					if m.ws == t0.UnixMilli()+120_000 && m.region == r && m.count > max {
						max = m.count
					}
				}
				assert.Equal(t, max, got.Counts[r], r)
			}
			continue
		}
		assert.Equal(t, want, got, "trial %d", trial)
	}
}
