package rebalancer

import "hash/maphash"

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
// the hashes match). The only pointers the table holds are the subjects'
// strings (one per index) and the policy ids' (one per policy): the rest
// is pointer-free, so the garbage collector does not scan it. An index
// released (the Core neither holds the key nor has a stored report
// mentioning it) is reused by the next key interned.
//
// The zero value is not usable; use newKeyTable. Not safe for concurrent
// use (the Core's calls are serialised).
type keyTable struct {
	seed   maphash.Seed
	pols   []string          // policy ids, by policy number
	polNum map[string]uint32 // policy number of each policy id in pols
	pol    []uint32          // by index: the key's policy number
	subj   []string          // by index: the key's subject ("" when released)
	slots  []uint64          // hash<<32 | index+1 of a key; 0: empty; len a power of two
	used   int               // keys in slots
	free   []int32           // released indices
}

func newKeyTable() *keyTable {
	return &keyTable{seed: maphash.MakeSeed(), polNum: map[string]uint32{}, slots: make([]uint64, 64)}
}

// size is the number of indices given out so far (held or released): every
// index is below it.
func (t *keyTable) size() int { return len(t.subj) }

// key returns the key of index i.
func (t *keyTable) key(i int32) Key { return Key{PolicyID: t.pols[t.pol[i]], Subject: t.subj[i]} }

// policy returns the policy id of index i.
func (t *keyTable) policy(i int32) string { return t.pols[t.pol[i]] }

// is reports whether index i is the index of k.
func (t *keyTable) is(i int32, k Key) bool {
	return t.subj[i] == k.Subject && t.pols[t.pol[i]] == k.PolicyID
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
		t.pol[i], t.subj[i] = pn, k.Subject
	} else {
		i = int32(len(t.subj))
		t.pol, t.subj = append(t.pol, pn), append(t.subj, k.Subject)
	}
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
	t.subj[i] = "" // let the subject's string go
	t.free = append(t.free, i)
}
