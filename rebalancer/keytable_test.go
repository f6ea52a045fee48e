package rebalancer

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestKeyTableAgainstMap: random interns and releases (enough to grow the
// table several times and to wrap probe runs around its end) find exactly
// the keys a map holds, each at the index it was given, and a released
// index is given again before a new one.
func TestKeyTableAgainstMap(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint("seed-", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 11))
			tab := newKeyTable()
			ref := map[Key]int32{}
			free := 0
			key := func() Key {
				return Key{PolicyID: []string{"g", "h", "i"}[r.IntN(3)], Subject: fmt.Sprint("s:", r.IntN(3000))}
			}
			for range 20_000 {
				k := key()
				if j, ok := ref[k]; ok && r.IntN(3) == 0 {
					tab.release(j)
					delete(ref, k)
					free++
					continue
				}
				size := tab.size()
				j, added := tab.intern(k)
				want, had := ref[k]
				require.Equal(t, !had, added, "key %v", k)
				if had {
					require.Equal(t, want, j)
					continue
				}
				if free > 0 {
					require.Equal(t, size, tab.size(), "a released index is reused")
					free--
				} else {
					require.Equal(t, size+1, tab.size())
				}
				require.Equal(t, k, tab.key(j))
				ref[k] = j
			}
			require.Equal(t, len(ref), tab.used)
			require.LessOrEqual(t, 2*tab.used, len(tab.slots))
			seen := map[int32]bool{}
			for k, j := range ref {
				got, ok := tab.find(k)
				require.True(t, ok, "key %v", k)
				require.Equal(t, j, got, "key %v", k)
				require.False(t, seen[j], "index %d twice", j)
				seen[j] = true
			}
			for range 1000 {
				k := key()
				_, ok := tab.find(k)
				_, want := ref[k]
				require.Equal(t, want, ok, "key %v", k)
			}
		})
	}
}

// TestKeyTableArena: with small chunks and a low compaction threshold, a
// random mix of interns and releases (empty, short and over-long
// subjects) rolls and compacts the subject arena many times; every key
// held reads back as interned, every subject handed out earlier is
// unchanged after the compactions, and the dead bytes stay bounded by the
// live ones.
func TestKeyTableArena(t *testing.T) {
	for seed := range uint64(10) {
		t.Run(fmt.Sprint("seed-", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 12))
			tab := newKeyTable()
			tab.chunkSize, tab.minDead = 64, 128
			ref := map[Key]int32{}
			type given struct{ got, want string }
			var out []given
			subject := func() string {
				switch r.IntN(50) {
				case 0:
					return ""
				case 1:
					return strings.Repeat(fmt.Sprint(r.IntN(4)), maxArenaSubject+r.IntN(3)-1)
				}
				return fmt.Sprint("subject:", r.IntN(500), strings.Repeat("x", r.IntN(40)))
			}
			compactions := 0
			for range 20_000 {
				k := Key{PolicyID: "g", Subject: subject()}
				if j, ok := ref[k]; ok && r.IntN(2) == 0 {
					tab.release(j)
					delete(ref, k)
					continue
				}
				chunks := len(tab.chunks)
				j, added := tab.intern(k)
				if len(tab.chunks) < chunks {
					compactions++
				}
				ref[k] = j
				if r.IntN(10) == 0 {
					out = append(out, given{got: tab.key(j).Subject, want: strings.Clone(k.Subject)})
				}
				if added {
					// (Compaction is checked when a key is added.)
					require.LessOrEqual(t, tab.dead, max(tab.live, tab.minDead), "dead bytes bounded")
				}
			}
			require.Positive(t, compactions, "the arena was compacted")
			for k, j := range ref {
				require.Equal(t, k, tab.key(j))
				got, ok := tab.find(k)
				require.True(t, ok)
				require.Equal(t, j, got)
			}
			for _, g := range out {
				require.Equal(t, g.want, g.got, "a subject handed out before is unchanged")
			}
		})
	}
}

// TestKeyTableArenaStartsSmall: a table of a few keys holds a small
// chunk, not a whole arenaChunk; chunks double as subjects come.
func TestKeyTableArenaStartsSmall(t *testing.T) {
	tab := newKeyTable()
	for i := range 3 {
		tab.intern(Key{PolicyID: "g", Subject: fmt.Sprint("k", i)})
	}
	require.Less(t, tab.cur.Cap(), 2*arenaFirstChunk, "one first chunk")
	for i := range 100_000 {
		tab.intern(Key{PolicyID: "g", Subject: fmt.Sprintf("subject-%06d", i)})
	}
	require.GreaterOrEqual(t, tab.cur.Cap(), arenaChunk, "grown to the full chunk size")
	require.Less(t, tab.cur.Cap(), 2*arenaChunk)
	require.Less(t, len(tab.chunks), 12, "doubling: few chunks")
	for i := range 100_000 {
		k := Key{PolicyID: "g", Subject: fmt.Sprintf("subject-%06d", i)}
		j, ok := tab.find(k)
		require.True(t, ok)
		require.Equal(t, k, tab.key(j))
	}
}

// TestReceiveRejectedReleasesKeys: a report rejected (a key twice) or
// stale interns no key for good, and a report dropped after its decision
// gives back the indices of keys no one holds.
func TestReceiveRejectedReleasesKeys(t *testing.T) {
	cfg := testConfig("a", "a", "b")
	c, err := New(cfg, PolicyMap{"g": {RateMilli: 1000, BurstMilli: 1000, Regions: 2}})
	require.NoError(t, err)
	k := func(s string) KeyReport { return KeyReport{Key: Key{PolicyID: "g", Subject: s}} }
	_, err = c.Receive(&Report{Region: "b", Epoch: 5, Seq: 5, Keys: []KeyReport{k("k:1"), k("k:2"), k("k:2")}})
	require.ErrorIs(t, err, ErrReport)
	require.Zero(t, c.tab.used, "a rejected report leaves no key interned")
	_, err = c.Receive(&Report{Region: "b", Epoch: 5, Seq: 5, Keys: []KeyReport{{Key: Key{PolicyID: "nope", Subject: "x"}}}})
	require.NoError(t, err)
	require.Equal(t, 1, c.tab.used)
	_, err = c.Receive(&Report{Region: "b", Epoch: 6, Seq: 6, Keys: []KeyReport{k("k:3")}})
	require.NoError(t, err)
	require.Equal(t, 2, c.tab.used)
	// Epoch 6 collected and decided: b's report of 5 is dropped, and its
	// key (of an unknown policy, never held) with it; k:3 is held.
	now := EpochStart(7, cfg.Epoch)
	_, err = c.Collect(now, nil)
	require.NoError(t, err)
	_, err = c.Decide(now.Add(cfg.MaxWait))
	require.NoError(t, err)
	_, ok := c.tab.find(Key{PolicyID: "nope", Subject: "x"})
	require.False(t, ok, "a key only a dropped report mentioned keeps no index")
	_, ok = c.tab.find(Key{PolicyID: "g", Subject: "k:3"})
	require.True(t, ok)
}
