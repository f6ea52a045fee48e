package rebalancer

import (
	"hash/maphash"
	"strings"
)

// keyTable interns keys: each key the Core holds state for, or that a
// stored report mentions, has a dense index (an int32 from 0), so that the
// Core's per-key state and the stored reports' lines are slices indexed by
// it instead of maps of pointers keyed by two strings. It is a cache of the
// Core's representation, not protocol state: nothing decided depends on
// which index a key has.
//
// Lookups hash the key (maphash, a random seed per table, which changes
// only where keys sit in the table, never a result) into an open-addressing
// table with linear probing, at most half full, whose slots hold the key's
// index and 32 bits of its hash (so that a probe reads the key only when
// the hashes match). An index released (the Core neither holds the key nor
// has a stored report mentioning it) is reused by the next key interned.
//
// Subjects are copied into an arena of chunks (strings of up to chunkSize
// bytes, the first ones smaller) and each index holds its subject's place
// in it (8 bytes), instead of a string header and a string of its own (40
// bytes a key at a million keys, and a million objects for the garbage
// collector to mark). A chunk
// is never written once its bytes are given out, so a subject returned by
// key stays valid and unchanged for as long as its holder keeps it, across
// releases and compactions. Released subjects leave their bytes in the
// arena (dead); when the dead bytes pass both the live ones and minDead the
// live subjects are copied into new chunks and the old ones are left to the
// garbage collector. The only pointers the table holds are its chunks',
// the policy ids' and those of subjects too long for the arena (long): the
// rest is pointer-free, so the garbage collector does not scan it.
//
// The zero value is not usable; use newKeyTable. Not safe for concurrent
// use (the Core's calls are serialised).
type keyTable struct {
	seed   maphash.Seed
	pols   []string          // policy ids, by policy number
	polNum map[string]uint32 // policy number of each policy id in pols
	pol    []uint32          // by index: the key's policy number
	subj   []uint64          // by index: the subject's place (subjRef); 0 when released
	slots  []uint64          // hash<<32 | index+1 of a key; 0: empty; len a power of two
	used   int               // keys in slots
	free   []int32           // released indices

	chunks    []string         // the arena's full chunks
	cur       strings.Builder  // the chunk being filled (chunk number len(chunks))
	long      map[int32]string // subjects of maxArenaSubject bytes or more, by index
	live      int              // bytes of the subjects held in the arena
	dead      int              // bytes of released subjects still in the arena
	chunkSize int              // bytes per chunk (tests make it small)
	minDead   int              // dead bytes below which the arena is never compacted
}

// Arena defaults: chunks of 1 KiB doubling up to 1 MiB, compacted once 4
// MiB are dead (and more than are live).
const (
	arenaFirstChunk = 1 << 10
	arenaChunk      = 1 << 20
	arenaMinDead    = 4 << 20
	// maxArenaSubject is the length from which a subject is kept as a
	// string of its own (subjRef has 16 bits of length).
	maxArenaSubject = 1<<16 - 1
	// maxChunks is the arena's chunk limit (subjRef has 15 bits of chunk
	// number): at the default chunk size, 32 GiB of subjects live and dead,
	// so at least 16 GiB live, as the arena is compacted when half is dead;
	// beyond it intern panics.
	maxChunks = 1 << 15
)

// subjRef packs a subject's place in the arena: chunk number (15 bits),
// offset in the chunk (32), length (16); the length maxArenaSubject marks
// a subject kept in keyTable.long. Bit 63 is set so that 0 means none.
func subjRef(chunk, off, n int) uint64 {
	return 1<<63 | uint64(chunk)<<48 | uint64(off)<<16 | uint64(n)
}

func newKeyTable() *keyTable {
	return &keyTable{seed: maphash.MakeSeed(), polNum: map[string]uint32{}, slots: make([]uint64, 64),
		chunkSize: arenaChunk, minDead: arenaMinDead}
}

// subject returns the subject of index i (interned).
func (t *keyTable) subject(i int32) string {
	r := t.subj[i]
	n := int(uint16(r))
	if n == 0 {
		return ""
	}
	if n == maxArenaSubject {
		return t.long[i]
	}
	c, off := int(r>>48&0x7fff), int(uint32(r>>16))
	var chunk string
	if c < len(t.chunks) {
		chunk = t.chunks[c]
	} else {
		chunk = t.cur.String()
	}
	return chunk[off : off+n]
}

// place copies subject s of index i into the arena and returns its place.
func (t *keyTable) place(i int32, s string) uint64 {
	n := len(s)
	switch {
	case n == 0:
		return subjRef(0, 0, 0)
	case n >= maxArenaSubject:
		if t.long == nil {
			t.long = map[int32]string{}
		}
		t.long[i] = strings.Clone(s)
		return subjRef(0, 0, maxArenaSubject)
	}
	if t.cur.Len()+n > t.cur.Cap() {
		if t.cur.Len() > 0 {
			if len(t.chunks) >= maxChunks-1 {
				panic("rebalancer: key table: more distinct subjects than 32,767 arena chunks hold")
			}
			t.chunks = append(t.chunks, t.cur.String())
		}
		// Chunks start small and double up to chunkSize, so that a Core
		// of a few keys does not hold a whole chunk.
		next := min(t.chunkSize, max(arenaFirstChunk, 2*t.cur.Cap()))
		t.cur = strings.Builder{}
		t.cur.Grow(max(next, n))
	}
	off := t.cur.Len()
	t.cur.WriteString(s)
	t.live += n
	return subjRef(len(t.chunks), off, n)
}

// unplace gives up the subject of index i (its bytes become dead).
func (t *keyTable) unplace(i int32) {
	n := int(uint16(t.subj[i]))
	if n == maxArenaSubject {
		delete(t.long, i)
	} else {
		t.live -= n
		t.dead += n
	}
	t.subj[i] = 0
}

// compact copies the subjects held into new chunks, once the arena holds
// more dead bytes than live ones (and at least minDead): the old chunks
// stay valid for whoever still holds a subject of them.
func (t *keyTable) compact() {
	held := make([]string, len(t.subj))
	for _, e := range t.slots {
		if e != 0 {
			i := int32(uint32(e)) - 1
			if n := int(uint16(t.subj[i])); n > 0 && n < maxArenaSubject {
				held[i] = t.subject(i)
			}
		}
	}
	t.chunks, t.cur, t.live, t.dead = nil, strings.Builder{}, 0, 0
	for i, s := range held {
		if s != "" {
			t.subj[i] = t.place(int32(i), s)
		}
	}
}

// size is the number of indices given out so far (held or released): every
// index is below it.
func (t *keyTable) size() int { return len(t.subj) }

// key returns the key of index i.
func (t *keyTable) key(i int32) Key { return Key{PolicyID: t.pols[t.pol[i]], Subject: t.subject(i)} }

// policy returns the policy id of index i.
func (t *keyTable) policy(i int32) string { return t.pols[t.pol[i]] }

// is reports whether index i is the index of k.
func (t *keyTable) is(i int32, k Key) bool {
	return t.subject(i) == k.Subject && t.pols[t.pol[i]] == k.PolicyID
}

func (t *keyTable) hashOf(k Key) uint32 {
	h := maphash.String(t.seed, k.Subject) ^ maphash.String(t.seed, k.PolicyID)*0x9e3779b97f4a7c15
	return uint32(h ^ h>>32)
}

// probe returns the slot of k (hash h), or the empty slot where it would
// go.
func (t *keyTable) probe(k Key, h uint32) int {
	mask := len(t.slots) - 1
	p := int(h) & mask
	for {
		e := t.slots[p]
		if e == 0 || uint32(e>>32) == h && t.is(int32(uint32(e))-1, k) {
			return p
		}
		p = (p + 1) & mask
	}
}

// find returns the index of k, if interned.
func (t *keyTable) find(k Key) (int32, bool) {
	e := t.slots[t.probe(k, t.hashOf(k))]
	return int32(uint32(e)) - 1, e != 0
}

// intern returns the index of k, giving it one if it has none (added).
func (t *keyTable) intern(k Key) (i int32, added bool) {
	h := t.hashOf(k)
	p := t.probe(k, h)
	if e := t.slots[p]; e != 0 {
		return int32(uint32(e)) - 1, false
	}
	pn, ok := t.polNum[k.PolicyID]
	if !ok {
		pn = uint32(len(t.pols))
		t.pols = append(t.pols, k.PolicyID)
		t.polNum[k.PolicyID] = pn
	}
	if n := len(t.free); n > 0 {
		i = t.free[n-1]
		t.free = t.free[:n-1]
		t.pol[i] = pn
	} else {
		i = int32(len(t.subj))
		t.pol, t.subj = append(t.pol, pn), append(t.subj, 0)
	}
	if t.dead > t.live && t.dead >= t.minDead {
		t.compact()
	}
	t.subj[i] = t.place(i, k.Subject)
	t.slots[p] = uint64(h)<<32 | uint64(uint32(i+1))
	t.used++
	if 2*t.used > len(t.slots) {
		t.grow()
	}
	return i, true
}

// grow doubles the slots and places every key again.
func (t *keyTable) grow() {
	slots := make([]uint64, 2*len(t.slots))
	mask := len(slots) - 1
	for _, e := range t.slots {
		if e == 0 {
			continue
		}
		p := int(e>>32) & mask
		for slots[p] != 0 {
			p = (p + 1) & mask
		}
		slots[p] = e
	}
	t.slots = slots
}

// release forgets index i (its key must be interned): the next key
// interned may take it.
func (t *keyTable) release(i int32) {
	mask := len(t.slots) - 1
	p := t.probe(t.key(i), t.hashOf(t.key(i)))
	// Backward-shift deletion: move up every following key of the probe
	// run that may sit at p (its home slot is not in (p, q]).
	for q := (p + 1) & mask; ; q = (q + 1) & mask {
		e := t.slots[q]
		if e == 0 {
			break
		}
		home := int(e>>32) & mask
		if (q-home)&mask >= (q-p)&mask {
			t.slots[p] = e
			p = q
		}
	}
	t.slots[p] = 0
	t.used--
	t.unplace(i)
	t.free = append(t.free, i)
}
