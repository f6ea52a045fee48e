package rebalancer

import (
	"math/bits"
	"slices"

	"github.com/quotientlabs/quotient/shares"
)

// shareColumn is one Share per line of a report, stored for the lines
// whose Share is not zero only: a bit per line says which, a count per 64
// lines ranks them, and the non-zero values sit in line order. A line's
// value is found in constant time (a word, a popcount and a load).
//
// It holds the wants of stored reports and of the sending side's base: a
// region wants nothing for a key unless it would grow (shares.Want), so
// in a steady state nearly every line's want is zero, and a dense column
// would cost 16 bytes a line for nothing (32 of the ~315 a key took at a
// million keys with two other regions, 16 more on the sending side). When
// every line wants, it costs 1.5 bits a line more than a dense column.
//
// Lines are added in order (push); get reads any line pushed. The zero
// value is an empty column. Not safe for concurrent use.
type shareColumn struct {
	bits []uint64       // bit l%64 of word l/64: line l's value is not zero
	rank []int32        // by word: values of the lines before it
	vals []shares.Share // the non-zero values, in line order
	n    int            // lines pushed
}

// makeShareColumn returns an empty column with room for n lines' bits.
func makeShareColumn(n int) shareColumn {
	words := (n + 63) / 64
	return shareColumn{bits: make([]uint64, 0, words), rank: make([]int32, 0, words)}
}

// push adds the next line's value.
func (c *shareColumn) push(v shares.Share) {
	if c.n%64 == 0 {
		c.bits = append(c.bits, 0)
		c.rank = append(c.rank, int32(len(c.vals)))
	}
	if v != (shares.Share{}) {
		c.bits[c.n/64] |= 1 << (c.n % 64)
		c.vals = append(c.vals, v)
	}
	c.n++
}

// get returns line l's value (l < lines pushed).
func (c *shareColumn) get(l int) shares.Share {
	w := c.bits[l/64]
	b := uint64(1) << (l % 64)
	if w&b == 0 {
		return shares.Share{}
	}
	return c.vals[int(c.rank[l/64])+bits.OnesCount64(w&(b-1))]
}

// lineIndex maps key indices to lines for a delta's own lines, which are
// few: a bit per key index up to the largest listed, a count per 64 key
// indices, and the line of each listed key in key-index order. A dense
// index by key index (stored.pos) costs 4 bytes a key of the table for
// every stored delta that lists a line; this costs about 0.2 bytes a key
// and 4 a listed line, and answers in constant time.
//
// The zero value lists nothing. Not safe for concurrent use.
type lineIndex struct {
	bits  []uint64 // bit j%64 of word j/64: key index j has a line
	rank  []int32  // by word: listed key indices before it
	lines []int32  // by listed key index, in key-index order: its line
}

// makeLineIndex returns the index of lines whose key indices are idx (by
// line, distinct).
func makeLineIndex(idx []int32) lineIndex {
	if len(idx) == 0 {
		return lineIndex{}
	}
	words := int(slices.Max(idx))/64 + 1
	x := lineIndex{bits: make([]uint64, words), rank: make([]int32, words), lines: make([]int32, len(idx))}
	for _, j := range idx {
		x.bits[j/64] |= 1 << (j % 64)
	}
	n := int32(0)
	for w, b := range x.bits {
		x.rank[w] = n
		n += int32(bits.OnesCount64(b))
	}
	for l, j := range idx {
		x.lines[x.at(j)] = int32(l)
	}
	return x
}

// at returns the place in lines of key index j, which is listed.
func (x *lineIndex) at(j int32) int {
	w := x.bits[j/64]
	return int(x.rank[j/64]) + bits.OnesCount64(w&(uint64(1)<<(j%64)-1))
}

// get returns the line of key index j, or -1 when it has none.
func (x *lineIndex) get(j int32) int {
	if j < 0 || int(j/64) >= len(x.bits) || x.bits[j/64]&(1<<(j%64)) == 0 {
		return -1
	}
	return int(x.lines[x.at(j)])
}
