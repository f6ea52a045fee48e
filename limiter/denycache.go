package limiter

import (
	"hash/maphash"
	"sync"
	"time"
)

// denyKey names one (policy, subject) pair without building the subject's
// store key, so a lookup allocates nothing.
type denyKey struct {
	policy string
	kind   SubjectKind
	value  string
}

// denyEntry is what the store said when it rejected the subject.
type denyEntry struct {
	until     int64 // ns: the entry answers until then (at most retryAt)
	retryAt   int64 // ns: the store's retry time for cost (0: until)
	resetAt   int64 // ns: the store's reset time
	cost      int64 // the rejected cost
	remaining int64 // remaining when rejected
}

const denyShards = 16

// denyCache is the local deny cache (seed design 7.4): after the store
// rejects a subject for an enforced policy, requests of that subject that
// would hit that policy with at least the rejected cost are rejected
// locally until the store's retry time, without a store call.
//
// Cost-awareness: every algorithm is monotone in cost, so a rejection of
// cost c at time t implies that any cost >= c is rejected until the retry
// time of c (other requests can only consume more). A smaller cost may fit
// and goes to the store. Peeks (cost 0) never read or fill the cache.
//
// Memory is bounded by maxKeys entries (spread over 16 shards); a full
// shard first drops expired entries, then refuses new ones (the store keeps
// deciding them, so a full cache costs speed, never correctness). The
// cache can only err towards rejecting until a retry time the store itself
// gave, so over-admission is unaffected and over-rejection is bounded by
// that retry time; a share or policy change may make the store's answer
// earlier, which the cache learns when its entry expires (SetPolicies
// clears it). While the store cannot answer, an entry rejects until the
// store's retry time (lookupStale), the fallback deciding only the
// requests the store had not rejected.
type denyCache struct {
	seed     maphash.Seed
	perShard int
	shards   [denyShards]denyShard
}

type denyShard struct {
	mu      sync.RWMutex
	entries map[denyKey]denyEntry
}

func newDenyCache(maxKeys int) *denyCache {
	c := &denyCache{seed: maphash.MakeSeed(), perShard: max(1, maxKeys/denyShards)}
	for i := range c.shards {
		c.shards[i].entries = make(map[denyKey]denyEntry)
	}
	return c
}

func (c *denyCache) shard(k *denyKey) *denyShard {
	h := maphash.String(c.seed, k.value) ^ maphash.String(c.seed, k.policy)
	return &c.shards[h%denyShards]
}

// lookup returns the live entry for k that rejects cost at now.
func (c *denyCache) lookup(k denyKey, cost int64, now int64) (denyEntry, bool) {
	sh := c.shard(&k)
	sh.mu.RLock()
	e, ok := sh.entries[k]
	sh.mu.RUnlock()
	if !ok || now >= e.until || cost < e.cost {
		return denyEntry{}, false
	}
	return e, true
}

// lookupStale is lookup for a request the store cannot decide (it
// failed, timed out, or the breaker is open): an entry answers until the
// store's retry time, not only until its until. A global policy's entry
// answers for at most a tenth of the usage epoch while the store is up,
// because the region's share may grow behind the gateway's back; while the
// store is down nothing newer than the store's own rejection is known, and
// admitting from an empty in-process fallback would forget it: a global
// daily quota the store had found spent would be spent again, up to the
// fallback's limit per gateway instance.
func (c *denyCache) lookupStale(k denyKey, cost int64, now int64) (denyEntry, bool) {
	sh := c.shard(&k)
	sh.mu.RLock()
	e, ok := sh.entries[k]
	sh.mu.RUnlock()
	if !ok || now >= e.horizon() || cost < e.cost {
		return denyEntry{}, false
	}
	return e, true
}

// horizon is the last instant e answers for: its until with a store, its
// retry time without (lookupStale).
func (e denyEntry) horizon() int64 { return max(e.until, e.retryAt) }

// add records a store rejection. A later, smaller rejected cost replaces a
// larger one (it rejects more requests); an entry is kept at its longest
// retry time for the same cost.
func (c *denyCache) add(k denyKey, e denyEntry, now int64) {
	if e.until <= now {
		return
	}
	sh := c.shard(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	old, ok := sh.entries[k]
	if ok && old.until > now && old.cost <= e.cost && old.until >= e.until {
		return
	}
	if !ok && len(sh.entries) >= c.perShard {
		for key, v := range sh.entries {
			if v.horizon() <= now {
				delete(sh.entries, key)
			}
		}
		if len(sh.entries) >= c.perShard {
			return
		}
	}
	sh.entries[k] = e
}

// clear drops every entry (the policy set changed).
func (c *denyCache) clear() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		clear(sh.entries)
		sh.mu.Unlock()
	}
}

// len is the number of entries held, live or not.
func (c *denyCache) len() int {
	n := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.RLock()
		n += len(sh.entries)
		sh.mu.RUnlock()
	}
	return n
}

// ceilMs rounds d up to a whole millisecond, so that a retry time derived
// from the cache is never earlier than the store's.
func ceilMs(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d
}
