package limiter

import (
	"context"
	"hash/maphash"
	"slices"
	"sync"
	"time"
)

// Store holds the state of every policy and subject and evaluates the
// policies of one request atomically. The implementations are [RedisStore]
// (shared by all gateways of a region, decides with Redis server time) and
// [MemoryStore] (one process, decides at the time it is given).
//
// Store is sealed: its one method is unexported, so no other package can
// implement it, and there is no Example of a custom store because none can
// be written. This is deliberate, for three reasons:
//
//   - A store is not a key-value interface but the algorithms themselves:
//     it receives each policy's parameters and cost and returns the
//     decision, remaining, reset, retry and delay, in integer nano-token
//     and millisecond arithmetic that the Lua script and the Go code
//     share bit for bit (see Arithmetic in the package documentation).
//     The argument and result types are unexported because they are
//     that arithmetic's internals (state encodings, share and replicated
//     window records); exporting them would freeze the algorithms.
//   - It must keep the all-or-nothing contract across subjects, with the
//     refunds of a split cluster (refund.go). The differential
//     tests hold both implementations to it against a real redis-server,
//     standalone and cluster; a store outside the package could not be
//     held to it, and gateways of one fleet that decide differently
//     enforce a wrong limit.
//   - Check adds the resilience layer (deadline, breaker, deny cache,
//     fallback) around every store but the MemoryStore, and knows the
//     RedisStore's warm-up, pipelining and metrics.
//
// What to do instead:
//
//   - one process, tests, or the simulator: [NewMemoryStore];
//   - a fleet of gateways: [NewRedisStore] or [NewPipelinedRedisStore] on
//     a go-redis UniversalClient, a *redis.Client (one server, or a
//     Sentinel failover client) or a *redis.ClusterClient, whose servers
//     run Redis 7 scripts (the script declares allow-cross-slot-keys); the
//     tests run redis-server 7.0, standalone and a three-node cluster;
//   - instrumentation, TLS, pools and timeouts of the connection: the
//     options and hooks (redis.Hook) of the go-redis client you pass;
//   - behaviour around the decision (timeouts, failure modes,
//     per-subject limits, observation): [Config] (Deadline, Breaker,
//     each policy's on_store_failure, [Overrides], [EventSink]).
type Store interface {
	// eval evaluates ops at now and writes the answers into res
	// (len(res) == len(ops)); subjects[i] is the subject of ops[i], and
	// the ops of one subject are consecutive. It returns whether every
	// enforced op admitted, and consumes (for every admitting op, shadow
	// ones included) only then: all or nothing across the subjects. A
	// store that cannot decide every subject in one atomic step decides
	// them in order, stops at the first rejection (the ops of later
	// subjects come back with skipped set) and refunds what earlier
	// subjects consumed (RedisStore on a cluster whose nodes split the
	// subjects). An error means nothing was decided; the store refunds
	// what it consumed before the error, as far as it can.
	eval(ctx context.Context, now time.Time, subjects []Subject, ops []op, res []result) (bool, error)
}

const memShards = 64

// MemoryStore is the in-process [Store]: the same five algorithms as the
// Redis script, deciding at the time passed to it (the simulator passes
// virtual time). It is safe for concurrent use; subjects are spread over 64
// mutex-guarded shards, and one decision holds the shards of all its
// subjects at once, so a request is all or nothing across its subjects.
// Expired entries are swept from a shard at most once every ten seconds of
// its time, on access, so memory follows active keys. A decision on
// states that exist allocates nothing (up to four policies per request;
// Limiter.CheckInto with a reused Decision, TestMemoryStoreCheckAllocatesNothing);
// a new subject costs one allocation of 176 bytes (its first state
// inline) and its map slot, and a subject's further states an array of
// 120 bytes per state, grown by append.
// The zero value is not usable; call NewMemoryStore.
type MemoryStore struct {
	// shards first: the store's allocation (over 4 KB, a size class of
	// multiples of 64 bytes) is cache-line aligned, and so is every shard.
	shards [memShards]memShard
	seed   maphash.Seed
	// keepExpired (tests only) makes expired state count as live, as a
	// Redis server whose clock has not reached the TTL would: the
	// differential test drives virtual time far ahead of Redis's clock.
	keepExpired bool
}

type memShard struct {
	mu sync.Mutex
	// kinds holds, for every subject kind with state in the shard, its
	// subjects by value: one map per kind, so that a lookup hashes and
	// compares the value alone, on the map's fast path for string keys,
	// after a scan of the few kinds (Identity has four, package rls adds
	// descriptors). A kind with no subject left is dropped by the sweep.
	kinds     []memKind
	nextSweep int64
	// One shard per 64-byte cache line: goroutines deciding on different
	// shards do not invalidate each other's lines (false sharing).
	_ [64 - 40]byte
}

type memKind struct {
	kind     SubjectKind
	subjects map[string]*memSubject
}

// get returns the state of subject, or nil.
func (sh *memShard) get(subject Subject) *memSubject {
	for i := range sh.kinds {
		if k := &sh.kinds[i]; k.kind == subject.Kind {
			return k.subjects[subject.Value]
		}
	}
	return nil
}

// getOrCreate returns the state of subject, made empty if it has none.
func (sh *memShard) getOrCreate(subject Subject) *memSubject {
	m := sh.kindMap(subject.Kind)
	subj := m[subject.Value]
	if subj == nil {
		subj = newMemSubject()
		m[subject.Value] = subj
	}
	return subj
}

// kindMap returns the subjects of kind, made if there are none.
func (sh *memShard) kindMap(kind SubjectKind) map[string]*memSubject {
	for i := range sh.kinds {
		if sh.kinds[i].kind == kind {
			return sh.kinds[i].subjects
		}
	}
	m := make(map[string]*memSubject)
	sh.kinds = append(sh.kinds, memKind{kind: kind, subjects: m})
	return m
}

// put sets the state of subject (tests: copies of a store).
func (sh *memShard) put(subject Subject, subj *memSubject) {
	sh.kindMap(subject.Kind)[subject.Value] = subj
}

// each calls fn for every subject with state in the shard.
func (sh *memShard) each(fn func(Subject, *memSubject)) {
	for i := range sh.kinds {
		k := &sh.kinds[i]
		for v, subj := range k.subjects {
			fn(Subject{Kind: k.kind, Value: v}, subj)
		}
	}
}

type memEntry struct {
	policy string
	tag    string
	st     state
}

type memShare struct {
	policy      string
	rate, burst int64
	expireMs    int64
	hasExpiry   bool
}

type memSubject struct {
	entries []memEntry
	shares  []memShare
	// first holds entries while the subject has one state (most have one
	// policy per subject kind): the entry sits in the subject's own
	// allocation, one cache miss fewer per decision than an array of its
	// own. With more states, entries moves to an array and first is
	// unused (120 bytes).
	first [1]memEntry
}

// newMemSubject returns an empty subject whose first entry is inline.
func newMemSubject() *memSubject {
	s := &memSubject{}
	s.entries = s.first[:0]
	return s
}

// NewMemoryStore returns an empty store.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{seed: maphash.MakeSeed()}
}

func (m *MemoryStore) shard(subject Subject) *memShard {
	return &m.shards[m.shardIndex(subject)]
}

func (m *MemoryStore) shardIndex(subject Subject) uint64 {
	// The value's hash alone (cheaper than hashing the struct): subjects
	// of different kinds with one value share a shard, which only
	// matters for contention.
	return maphash.String(m.seed, subject.Value) % memShards
}

const sweepEveryMs = 10_000

// memOp is the scratch state of one op during eval.
type memOp struct {
	st          state       // advanced, then final
	rate, burst int64       // effective bucket parameters
	subj        *memSubject // nil: the subject has no state yet
	entry       int         // index of the op's entry in subj.entries; -1: none
	shard       int         // shard of the op's subject
}

// eval implements Store: one atomic step across every subject of the
// request. The shards of the request's subjects are locked together, in
// ascending shard order (so two requests never wait on each other in a
// cycle), for the whole decision. It allocates nothing for up to four ops
// of states that exist (a new subject or policy state allocates it).
func (m *MemoryStore) eval(_ context.Context, now time.Time, subjects []Subject, ops []op, res []result) (bool, error) {
	nowUs := now.UnixMicro()
	nowMs := nowUs / 1000
	var scBuf [4]memOp
	sc := scBuf[:]
	if len(ops) > len(scBuf) {
		sc = make([]memOp, len(ops))
	}
	sc = sc[:len(ops)]
	// The shard of each distinct subject, hashed once; idx is the
	// distinct shards, ascending. The ops of one subject are consecutive,
	// so a request of one subject (the common case) hashes and locks once.
	var idxBuf [maxSubjects]int
	idx := idxBuf[:0]
	for i := range subjects {
		if i > 0 && subjects[i] == subjects[i-1] {
			sc[i].shard = sc[i-1].shard
			continue
		}
		j := int(m.shardIndex(subjects[i]))
		sc[i].shard = j
		idx = append(idx, j)
	}
	if len(idx) > 1 {
		slices.Sort(idx)
		idx = slices.Compact(idx)
	}
	for _, j := range idx {
		sh := &m.shards[j]
		sh.mu.Lock()
		if nowMs >= sh.nextSweep && !m.keepExpired {
			sh.sweep(nowMs)
			sh.nextSweep = nowMs + sweepEveryMs
		}
	}
	defer m.unlock(idx)

	allowed := true
	for i := range ops {
		o, x := &ops[i], &sc[i]
		if i > 0 && subjects[i] == subjects[i-1] {
			x.subj = sc[i-1].subj
		} else {
			x.subj = m.shards[x.shard].get(subjects[i])
		}
		x.rate, x.burst, x.entry = o.rate, o.burst, -1
		var cur *state
		if x.subj != nil {
			if o.global && !o.replicated() {
				if s := x.subj.share(o.policy, nowMs); s != nil {
					x.rate, x.burst = s.rate, s.burst
				}
			}
			x.entry = x.subj.find(o.policy, o.tag())
			if x.entry >= 0 {
				if e := &x.subj.entries[x.entry]; e.st.expireMs > nowMs || m.keepExpired {
					cur = &e.st
				}
			}
		}
		advanceTo(&x.st, o, cur, nowUs, x.rate, x.burst)
		r := &res[i]
		r.allowed = decideTo(r, o, &x.st, nowUs, x.rate, x.burst)
		if !r.allowed && o.enforce {
			allowed = false
		}
	}
	for i := range ops {
		o, x, r := &ops[i], &sc[i], &res[i]
		if allowed && r.allowed && o.cost > 0 {
			consumeTo(o, &x.st, nowUs, x.rate)
			ttl := report(o, &x.st, nowUs, x.rate, x.burst, r)
			x.st.expireMs = nowMs + ttl
			if x.subj == nil {
				x.subj = m.shards[x.shard].getOrCreate(subjects[i])
				// Later ops of this subject see it (none of them
				// looked it up: they had none either).
				for k := i + 1; k < len(ops) && subjects[k] == subjects[i]; k++ {
					sc[k].subj = x.subj
				}
			}
			// By index, not by a pointer kept from the lookup: an
			// earlier op's append may have moved the entries.
			if x.entry >= 0 {
				x.subj.entries[x.entry].st = x.st
			} else {
				x.subj.store(o.policy, o.tag(), x.st)
			}
		} else {
			report(o, &x.st, nowUs, x.rate, x.burst, r)
		}
		if !allowed || !r.allowed {
			r.delayMs = 0
		}
		if allowed && r.allowed {
			r.retryMs = 0
		}
	}
	return allowed, nil
}

func (m *MemoryStore) unlock(idx []int) {
	for _, j := range idx {
		m.shards[j].mu.Unlock()
	}
}

// find returns the index in s.entries of a policy's state (by its key
// suffix and algorithm), expired or not, or -1.
func (s *memSubject) find(policy, tag string) int {
	for i := range s.entries {
		e := &s.entries[i]
		if e.policy == policy && e.tag == tag {
			return i
		}
	}
	return -1
}

// lookup returns the live state of a policy (by its key suffix and
// algorithm), or nil.
func (s *memSubject) lookup(policy, tag string, nowMs int64, keepExpired bool) *state {
	if i := s.find(policy, tag); i >= 0 {
		if e := &s.entries[i]; e.st.expireMs > nowMs || keepExpired {
			return &e.st
		}
	}
	return nil
}

func (s *memSubject) store(policy, tag string, st state) {
	for i := range s.entries {
		e := &s.entries[i]
		if e.policy == policy && e.tag == tag {
			e.st = st
			return
		}
	}
	s.entries = append(s.entries, memEntry{policy: policy, tag: tag, st: st})
}

func (s *memSubject) share(policy string, nowMs int64) *memShare {
	for i := range s.shares {
		sh := &s.shares[i]
		if sh.policy == policy {
			if sh.hasExpiry && sh.expireMs <= nowMs {
				return nil
			}
			return sh
		}
	}
	return nil
}

func (sh *memShard) sweep(nowMs int64) {
	for ki := range sh.kinds {
		sh.kinds[ki].sweep(nowMs)
	}
	sh.kinds = slices.DeleteFunc(sh.kinds, func(k memKind) bool { return len(k.subjects) == 0 })
}

func (mk *memKind) sweep(nowMs int64) {
	for k, subj := range mk.subjects {
		live := subj.entries[:0]
		for _, e := range subj.entries {
			if e.st.expireMs > nowMs {
				live = append(live, e)
			}
		}
		clear(subj.entries[len(live):])
		subj.entries = live
		shares := subj.shares[:0]
		for _, s := range subj.shares {
			if !s.hasExpiry || s.expireMs > nowMs {
				shares = append(shares, s)
			}
		}
		clear(subj.shares[len(shares):])
		subj.shares = shares
		if len(subj.entries) == 0 && len(subj.shares) == 0 {
			delete(mk.subjects, k)
		}
	}
}

// SetShare sets this region's share of a global bucket policy for one
// subject: rateMilli in thousandths of a token per second, burstMilli in
// thousandths of a token, valid until now+ttl (ttl <= 0: no expiry). The
// next decision uses it; tokens above the new burst are clamped. Safe for
// concurrent use.
func (m *MemoryStore) SetShare(now time.Time, subject Subject, policyID string, rateMilli, burstMilli int64, ttl time.Duration) {
	nowMs := now.UnixMilli()
	sh := m.shard(subject)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	subj := sh.getOrCreate(subject)
	val := memShare{policy: policyID, rate: rateMilli, burst: burstMilli, hasExpiry: ttl > 0, expireMs: nowMs + ttl.Milliseconds()}
	for i := range subj.shares {
		if subj.shares[i].policy == policyID {
			subj.shares[i] = val
			return
		}
	}
	subj.shares = append(subj.shares, val)
}

// Len is the number of policy states held (expired ones not yet swept
// included): what the store's memory grows with. Safe for concurrent use.
func (m *MemoryStore) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		sh.each(func(_ Subject, s *memSubject) { n += len(s.entries) })
		sh.mu.Unlock()
	}
	return n
}
