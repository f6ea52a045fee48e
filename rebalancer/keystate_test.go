package rebalancer

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKeyStateSize: a key's state is 64 bytes (the README's memory per
// key counts on it).
func TestKeyStateSize(t *testing.T) {
	assert.Equal(t, uintptr(64), unsafe.Sizeof(keyState{}))
}

// TestStateTableGrows: states written through at keep their values while
// the table grows past several chunks (the first one doubling), new ones
// are zero, and no chunk holds more than stateChunk states.
func TestStateTableGrows(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	var tab stateTable
	n := 0
	for n < 3*stateChunk+17 {
		next := n + 1 + r.IntN(700)
		tab.grow(next)
		require.Equal(t, next, tab.n)
		for j := n; j < next; j++ {
			st := tab.at(int32(j))
			require.Equal(t, keyState{}, *st, "new state %d", j)
			st.smoothed, st.written = int64(j), int32(-j)
			st.set(kfHeld, j%2 == 0)
		}
		n = next
		for j := range n {
			st := tab.at(int32(j))
			require.Equal(t, int64(j), st.smoothed)
			require.Equal(t, int32(-j), st.written)
			require.Equal(t, j%2 == 0, st.is(kfHeld))
		}
	}
	tab.grow(5) // never shrinks
	assert.Equal(t, n, tab.n)
	for i, c := range tab.chunks {
		assert.LessOrEqual(t, cap(c), stateChunk, "chunk %d", i)
	}

	var small stateTable
	small.grow(3)
	assert.Less(t, cap(small.chunks[0]), 64, "a Core of a few keys holds a few states")
}

// TestKeyFlags: each flag sets and clears alone.
func TestKeyFlags(t *testing.T) {
	all := []keyFlags{kfKnown, kfSynced, kfRecord, kfShort, kfHeld, kfListed}
	for _, f := range all {
		var st keyState
		st.set(f, true)
		for _, g := range all {
			assert.Equal(t, f == g, st.is(g))
		}
		st.set(kfKnown|kfSynced|kfRecord|kfShort|kfHeld|kfListed, true)
		st.set(f, false)
		for _, g := range all {
			assert.Equal(t, f != g, st.is(g))
		}
	}
}

// TestWrittenAt: the epoch of a write reads back as written, around
// wbase and after it moves (the 32-bit range passed), and an epoch too
// far before wbase reads as long ago.
func TestWrittenAt(t *testing.T) {
	c := &Core{}
	c.st.grow(4)
	a, b, z := c.st.at(0), c.st.at(1), c.st.at(2)
	c.setWrittenAt(a, 1_790_000_000_000) // 1 ms epochs of 2026: past 32 bits from 0
	assert.Equal(t, int64(1_790_000_000_000), c.writtenAt(a))
	c.setWrittenAt(b, 1_790_000_000_000-5)
	assert.Equal(t, int64(1_790_000_000_000-5), c.writtenAt(b))
	z.written = writtenLongAgo
	assert.Less(t, c.writtenAt(z), int64(math.MinInt64/4))

	// Another 2^31 epochs: wbase moves, the others shift with it.
	later := c.wbase + math.MaxInt32 + 10
	c.setWrittenAt(c.st.at(3), later)
	assert.Equal(t, later, c.writtenAt(c.st.at(3)))
	// a and b are now more than 2^31 epochs before wbase: long ago, so
	// a refresh comes at once (never later than it would have).
	assert.Less(t, c.writtenAt(a), later-math.MaxInt32)
	assert.Less(t, c.writtenAt(b), later-math.MaxInt32)
	assert.Less(t, c.writtenAt(z), int64(math.MinInt64/4))

	c.setWrittenAt(a, later-100)
	assert.Equal(t, later-100, c.writtenAt(a))
	c.setWrittenAt(b, c.wbase-math.MaxInt32-5)
	assert.Equal(t, int32(writtenLongAgo), b.written)
}
