package rebalancer

import (
	"math"

	"github.com/quotientlabs/quotient/shares"
)

// keyState is this region's state for one key, in Core.st at the key's
// index. It holds no pointer, so the garbage collector does not scan the
// states. It is 64 bytes: the epoch of the last write is held in 32 bits
// relative to Core.wbase and the six flags in one byte (a million keys
// spend 8 MB less than with an int64 and six bools).
type keyState struct {
	smoothed int64        // smoothed demand, milli cost units per second
	share    shares.Share // enforced now; valid when known
	claim    shares.Share // the claim of the last report (share when it was published); valid when known
	want     shares.Share // want published in the pending report
	written  int32        // epoch of the decision that last wrote it, minus Core.wbase; writtenLongAgo: before any epoch that matters
	flags    keyFlags
}

// keyFlags are a keyState's flags.
type keyFlags uint8

const (
	kfKnown  keyFlags = 1 << iota // share has been set (else it is the default)
	kfSynced                      // this Core wrote (or knows) the record
	kfRecord                      // a record (not the default) is written
	kfShort                       // the record is above the default (short lifetime)
	kfHeld                        // the Core holds state for the key (else the other fields are unused)
	kfListed                      // the index is in Core.order or Core.added
)

// is reports whether every flag of f is set.
func (s *keyState) is(f keyFlags) bool { return s.flags&f == f }

// set sets the flags of f when on, else clears them.
func (s *keyState) set(f keyFlags, on bool) {
	if on {
		s.flags |= f
	} else {
		s.flags &^= f
	}
}

// writtenLongAgo is keyState.written for a record written before any
// epoch a refresh compares with (an adopted record without expiry): due
// for a refresh at once.
const writtenLongAgo = math.MinInt32

// writtenAt returns the epoch of the decision that last wrote st's record
// (a very small number for writtenLongAgo). Valid when st has a record.
func (c *Core) writtenAt(st *keyState) int64 {
	if st.written == writtenLongAgo {
		return math.MinInt64 / 2
	}
	return c.wbase + int64(st.written)
}

// setWrittenAt notes epoch d as the one of the decision that last wrote
// st's record. An epoch before the range 32 bits hold around Core.wbase
// is long ago (a refresh is due at once, which only writes sooner); an
// epoch after it moves wbase to d, shifting every state's epoch (once per
// 2^31 epochs: 68 years of 1 s epochs, 25 days of 1 ms ones).
func (c *Core) setWrittenAt(st *keyState, d int64) {
	off := d - c.wbase
	if off > math.MaxInt32 {
		c.rebaseWritten(d)
		off = 0
	}
	if off <= writtenLongAgo {
		st.written = writtenLongAgo
		return
	}
	st.written = int32(off)
}

// rebaseWritten makes base the epoch keyState.written counts from.
func (c *Core) rebaseWritten(base int64) {
	for j := range c.st.n {
		st := c.st.at(int32(j))
		if st.written == writtenLongAgo {
			continue
		}
		off := c.wbase + int64(st.written) - base
		if off <= writtenLongAgo {
			st.written = writtenLongAgo
		} else {
			st.written = int32(off)
		}
	}
	c.wbase = base
}

// stateChunk is the number of states in each chunk of a stateTable
// after the first (256 KiB).
const (
	stateShift = 12
	stateChunk = 1 << stateShift
	stateMask  = stateChunk - 1
)

// stateTable holds the states by key index in chunks of stateChunk, so
// that growing it copies nothing and leaves no spare capacity past the
// last chunk (a slice grown by append kept about 12 % more than it held,
// 9 bytes a key, and copied every state when it grew). The first chunk
// grows by doubling up to stateChunk, so a Core of a few keys holds a few
// states. Not safe for concurrent use (the Core's).
type stateTable struct {
	chunks [][]keyState
	n      int // states held: indices below n are valid
}

// at returns the state of index j (< n). The pointer is valid until the
// table next grows (the first chunk moves while it doubles).
func (t *stateTable) at(j int32) *keyState {
	return &t.chunks[j>>stateShift][j&stateMask]
}

// grow makes every index below n valid; the new states are zero.
func (t *stateTable) grow(n int) {
	if n <= t.n {
		return
	}
	if len(t.chunks) == 0 {
		t.chunks = append(t.chunks, nil)
	}
	if c0 := t.chunks[0]; len(c0) < stateChunk {
		want := min(n, stateChunk)
		if want > cap(c0) {
			grown := make([]keyState, len(c0), min(max(want, 2*cap(c0), 16), stateChunk))
			copy(grown, c0)
			c0 = grown
		}
		if want > len(c0) {
			c0 = c0[:want]
		}
		t.chunks[0] = c0
	}
	for len(t.chunks)*stateChunk < n {
		t.chunks = append(t.chunks, make([]keyState, stateChunk))
	}
	t.n = n
}
