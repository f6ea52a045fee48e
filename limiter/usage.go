package limiter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// UsageCount is the usage of one global policy by one subject in one epoch:
// what the gateways flush and what CollectUsage returns.
type UsageCount struct {
	// Epoch is floor(unix_ms / epoch_ms).
	Epoch int64
	// PolicyID is the global policy counted.
	PolicyID string
	// Subject is the subject counted.
	Subject Subject
	// Demand is the cost of every attempt, admitted or not, including
	// answers from the deny cache and the fallback, in cost units.
	Demand int64
	// Admitted is the cost admitted, in cost units.
	Admitted int64
}

type usageKey struct {
	epoch  int64
	policy string
	kind   SubjectKind
	value  string
}

type usageVal struct{ demand, admitted int64 }

// usageCounter counts, in memory, the demand and admitted cost of every
// global policy per subject and epoch, until a flusher takes them. It holds
// at most maxKeys (epoch, policy, subject) entries, pending ones included;
// counts for new keys beyond that are dropped, counted (onDrop: the
// quotient_limiter_usage_overflow_* and quotient_limiter_usage_dropped_total
// metrics) and remembered per epoch as an overflow, which the flusher
// writes beside the counts (UsageOverflow) so that the coordinator knows
// the epoch's totals are a lower bound.
type usageCounter struct {
	epochMs int64
	maxKeys int

	mu       sync.Mutex
	counts   map[usageKey]usageVal
	overflow map[int64]*overflowState // by epoch; pruned to recent epochs
	dropped  int64
	onDrop   func(keys, requests int)
}

// overflowState is what the counter dropped at the bound in one epoch.
type overflowState struct {
	// seen holds a 64-bit hash of every key dropped in the epoch, up to
	// usageOverflowTrack of them, so that a key counts once per epoch.
	seen map[uint64]struct{}
	// pending is what the flusher has not taken yet; dirty says there is
	// something to write (a key dropped again writes the marker again
	// with zero increments, which is idempotent).
	pending UsageOverflow
	dirty   bool
}

// usageOverflowTrack bounds the keys an epoch's overflow remembers (for
// the keys counter only: beyond it, a key dropped again counts again):
// 16,384 hashes of 8 bytes plus the map's overhead, per epoch, for at most
// usageOverflowEpochs epochs.
const usageOverflowTrack = 1 << 14

// usageOverflowEpochs is how many epochs' overflow state is kept.
const usageOverflowEpochs = 4

func newUsageCounter(epoch time.Duration, maxKeys int) *usageCounter {
	return &usageCounter{epochMs: epoch.Milliseconds(), maxKeys: maxKeys, counts: make(map[usageKey]usageVal), overflow: make(map[int64]*overflowState)}
}

// epochOf is the epoch number of a time.
func (u *usageCounter) epochOf(now time.Time) int64 {
	ms := now.UnixMilli()
	e := ms / u.epochMs
	if ms < 0 && ms%u.epochMs != 0 {
		e--
	}
	return e
}

func (u *usageCounter) add(now time.Time, policy string, subj Subject, demand, admitted int64) {
	if demand <= 0 && admitted <= 0 {
		return
	}
	k := usageKey{epoch: u.epochOf(now), policy: policy, kind: subj.Kind, value: subj.Value}
	u.mu.Lock()
	v, ok := u.counts[k]
	if !ok && len(u.counts) >= u.maxKeys {
		u.dropped++
		keys := u.noteOverflow(k, 1)
		u.mu.Unlock()
		if u.onDrop != nil {
			u.onDrop(keys, 1)
		}
		return
	}
	v.demand += demand
	v.admitted += admitted
	u.counts[k] = v
	u.mu.Unlock()
}

// noteOverflow records that k's usage (requests attempts of it) was
// dropped at the bound and returns 1 if k is new to its epoch's overflow,
// else 0. u.mu must be held.
func (u *usageCounter) noteOverflow(k usageKey, requests int) int {
	st := u.overflow[k.epoch]
	if st == nil {
		for e := range u.overflow {
			if e <= k.epoch-usageOverflowEpochs {
				delete(u.overflow, e)
			}
		}
		st = &overflowState{seen: make(map[uint64]struct{}), pending: UsageOverflow{Epoch: k.epoch}}
		u.overflow[k.epoch] = st
	}
	h := uint64(14695981039346656037)
	for i := 0; i < len(k.policy); i++ {
		h = (h ^ uint64(k.policy[i])) * 1099511628211
	}
	h = (h ^ ':') * 1099511628211
	for i := 0; i < len(k.kind); i++ {
		h = (h ^ uint64(k.kind[i])) * 1099511628211
	}
	h = (h ^ ':') * 1099511628211
	for i := 0; i < len(k.value); i++ {
		h = (h ^ uint64(k.value[i])) * 1099511628211
	}
	st.dirty = true
	st.pending.Requests += int64(requests)
	if _, dup := st.seen[h]; dup {
		return 0
	}
	if len(st.seen) < usageOverflowTrack {
		st.seen[h] = struct{}{}
	}
	st.pending.Keys++
	return 1
}

// takeOverflow removes and returns the overflows not yet taken, sorted by
// epoch. The keys already dropped stay remembered.
func (u *usageCounter) takeOverflow() []UsageOverflow {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []UsageOverflow
	for _, st := range u.overflow {
		if st.dirty {
			out = append(out, st.pending)
			st.pending = UsageOverflow{Epoch: st.pending.Epoch}
			st.dirty = false
		}
	}
	slices.SortFunc(out, func(a, b UsageOverflow) int { return cmp.Compare(a.Epoch, b.Epoch) })
	return out
}

// putBackOverflow merges overflows that could not be written back in,
// dropping those of epochs before minEpoch (no coordinator reads them any
// more).
func (u *usageCounter) putBackOverflow(ovf []UsageOverflow, minEpoch int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, o := range ovf {
		st := u.overflow[o.Epoch]
		if o.Epoch < minEpoch || st == nil {
			continue
		}
		st.pending.Keys += o.Keys
		st.pending.Requests += o.Requests
		st.dirty = true
	}
}

// take removes and returns every count, sorted by epoch, policy, subject.
func (u *usageCounter) take() []UsageCount {
	u.mu.Lock()
	counts := u.counts
	u.counts = make(map[usageKey]usageVal, len(counts))
	u.mu.Unlock()
	out := make([]UsageCount, 0, len(counts))
	for k, v := range counts {
		out = append(out, UsageCount{Epoch: k.epoch, PolicyID: k.policy, Subject: Subject{Kind: k.kind, Value: k.value}, Demand: v.demand, Admitted: v.admitted})
	}
	sortUsage(out)
	return out
}

// putBack merges counts that could not be written back in, dropping those
// of epochs before minEpoch (too late for any coordinator) and any beyond
// the key bound. It returns how many were dropped.
func (u *usageCounter) putBack(counts []UsageCount, minEpoch int64) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	dropped, overflowKeys := 0, 0
	for _, c := range counts {
		k := usageKey{epoch: c.Epoch, policy: c.PolicyID, kind: c.Subject.Kind, value: c.Subject.Value}
		v, ok := u.counts[k]
		if c.Epoch < minEpoch {
			dropped++
			continue
		}
		if !ok && len(u.counts) >= u.maxKeys {
			// The coordinator has not collected this epoch yet: mark it
			// incomplete, as add does.
			dropped++
			overflowKeys += u.noteOverflow(k, 0)
			continue
		}
		v.demand += c.Demand
		v.admitted += c.Admitted
		u.counts[k] = v
	}
	u.dropped += int64(dropped)
	if overflowKeys > 0 && u.onDrop != nil {
		u.onDrop(overflowKeys, 0) // the attempts are in dropped (the caller counts them)
	}
	return dropped
}

func sortUsage(out []UsageCount) {
	slices.SortFunc(out, func(a, b UsageCount) int {
		return cmp.Or(cmp.Compare(a.Epoch, b.Epoch), strings.Compare(a.PolicyID, b.PolicyID),
			cmp.Compare(a.Subject.Kind, b.Subject.Kind), strings.Compare(a.Subject.Value, b.Subject.Value))
	})
}

// UsageSink receives flushed usage counts. WriteUsage adds counts to what
// the sink holds (it is not idempotent); it returns the counts it could not
// confirm as written, which the flusher keeps and retries on its next tick,
// and an error saying why. The caller owns counts; the sink must not keep
// it. It must honour ctx.
type UsageSink interface {
	WriteUsage(ctx context.Context, counts []UsageCount) (failed []UsageCount, err error)
}

// UsageOverflow says that a gateway dropped usage of epoch Epoch because
// it held Config.UsageMaxKeys counts already: the usage flushed for that
// epoch is a lower bound, and a key may be missing from it although it was
// used. A flusher writes it (UsageOverflowSink) before the counts, so the
// coordinator collects such an epoch as incomplete and holds the shares
// instead of shrinking the keys it cannot see.
type UsageOverflow struct {
	// Epoch is floor(unix_ms / epoch_ms) of the usage dropped.
	Epoch int64
	// Keys is how many (policy, subject) keys had usage dropped, each
	// counted once per epoch and gateway while the gateway remembers it
	// (16,384 keys per epoch; beyond, a key dropped again counts again).
	Keys int64
	// Requests is how many attempts (one per global policy counted) were
	// dropped.
	Requests int64
}

// UsageOverflowSink is a UsageSink that also records overflows.
// WriteUsageOverflow adds ovf to what the sink holds; an error means some
// may not be written, and the flusher retries all of them (adding the same
// overflow twice only inflates its counts, never the fact). It must honour
// ctx; the caller owns ovf.
type UsageOverflowSink interface {
	UsageSink
	WriteUsageOverflow(ctx context.Context, ovf []UsageOverflow) error
}

// UsageOverflowKey is the Redis key that marks epoch's usage as
// incomplete: "qo:{<epoch>}", a hash with fields k (keys) and r
// (requests), summed over the region's gateways (HINCRBY). See
// RedisUsageSink.
func UsageOverflowKey(epoch int64) string {
	return "qo:{" + strconv.FormatInt(epoch, 10) + "}"
}

// UsageKey is the Redis key of one usage hash of one epoch in the packed
// layout: "qv:{<epoch>:<shard>}". See RedisUsageSink for the layout.
func UsageKey(epoch int64, shard int) string {
	return "qv:{" + strconv.FormatInt(epoch, 10) + ":" + strconv.Itoa(shard) + "}"
}

// SplitUsageKey is the Redis key of one usage shard of one epoch in the
// split layout of the previous release: "qu:{<epoch>:<shard>}", fields
// d:<policy id>:<subject key> (demand) and a:<policy id>:<subject key>
// (admitted). Gateways of that release write it (NewSplitUsageSink writes
// it too, for a coordinator of that release); CollectUsageLayout reads it
// beside the packed layout during a rolling upgrade.
func SplitUsageKey(epoch int64, shard int) string {
	return "qu:{" + strconv.FormatInt(epoch, 10) + ":" + strconv.Itoa(shard) + "}"
}

// usageShard is the packed layout's hash of a (policy, subject key) pair:
// FNV-1a (64 bit) of "<policy>:<subject key>", mixed by MurmurHash3's
// 64-bit finalizer, modulo shards; the same in every gateway. The mixing
// matters: the low bits of FNV-1a depend only on the low bits of the
// bytes, so keys that differ in a few digits ("key-0000001", ...) filled
// only 2,136 of 16,384 hashes at 10,000 keys, and 15,900 at 100,000, and
// the fuller hashes passed the listpack limit.
func usageShard(policy, subjectKey string, shards int) int {
	h := usageFNV(policy, subjectKey)
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return int(h % uint64(shards))
}

// usageSplitShard is the split layout's shard of a (policy, subject key)
// pair, as the previous release computes it: FNV-1a (64 bit) of
// "<policy>:<subject key>" modulo shards.
func usageSplitShard(policy, subjectKey string, shards int) int {
	return int(usageFNV(policy, subjectKey) % uint64(shards))
}

// usageFNV is FNV-1a (64 bit) of "<policy>:<subject key>".
func usageFNV(policy, subjectKey string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(policy); i++ {
		h = (h ^ uint64(policy[i])) * 1099511628211
	}
	h = (h ^ ':') * 1099511628211
	for i := 0; i < len(subjectKey); i++ {
		h = (h ^ uint64(subjectKey[i])) * 1099511628211
	}
	return h
}

// The packed encoding of a usage field: value = demand<<usagePackShift +
// admitted, so that one HINCRBY adds both. Bounds (see RedisUsageSink):
//
//   - a count is written packed only when its demand and admitted are each
//     in [0, usagePackIncMax); otherwise, and once the key's field in that
//     epoch is known to be near its bounds, it goes to the wide fields;
//   - a sink stops adding packed increments to a field (for its epoch) once
//     an increment's reply shows demand >= usagePackDemandStop or admitted
//     >= usagePackAdmittedStop, or once a packed increment's outcome is
//     unknown (any error).
const (
	usagePackShift        = 32
	usagePackMask         = 1<<usagePackShift - 1
	usagePackIncMax       = 1 << 18
	usagePackDemandStop   = 1 << 30
	usagePackAdmittedStop = 1 << 31
)

// usageWidePrefixDemand and usageWidePrefixAdmitted begin the wide fields
// of the packed layout. '#' is not a policy id byte, so a wide field never
// reads as a packed one.
const (
	usageWidePrefixDemand   = "#d:"
	usageWidePrefixAdmitted = "#a:"
)

// usageWideTrack bounds the fields per epoch a sink remembers as wide;
// beyond it, every count of that epoch is written wide (correct, larger).
const usageWideTrack = 1 << 14

// RedisUsageSink writes usage counts to the region's Redis (standalone or
// cluster), where the coordinator collects one epoch's totals with
// CollectUsage. The packed layout (NewRedisUsageSink), per epoch E
// (floor(unix_ms / epoch_ms)) and shard S in [0, Shards):
//
//	key   qv:{E:S}                 a hash; the hash tag spreads the shards
//	                               of one epoch over cluster slots
//	field <policy id>:<subject key>
//	                               demand<<32 + admitted, cost units
//	                               (one HINCRBY adds both)
//	field #d:<policy id>:<subject key>, #a:<policy id>:<subject key>
//	                               wide fields: demand and admitted of the
//	                               counts too big to pack (rare; below)
//
// The subject key is Subject.Key() (kind prefix and escaped value; decode
// it with ParseSubjectKey); policy ids never contain ':' or '#', so a
// field splits at its first ':' and a wide field is told by its '#'. The
// shard of a pair is FNV-1a-64("<policy>:<subject key>"), mixed by
// MurmurHash3's finalizer, mod Shards, so every field of a key is in one hash (usageShard). Every gateway of the region adds to
// the same fields, so a field holds the region's total. Memory: a hash of
// at most hash-max-listpack-entries (128 by default in Redis 7) fields of
// at most hash-max-listpack-value (64) bytes stays listpack-encoded, some
// 27 bytes a key with a 15-byte field (a 10-byte integer entry); Shards
// should be about the active keys per epoch over 64 (DefaultUsageShards,
// 16,384, fits 100,000 to about 1.5 million keys; see the README's
// coordinator scaling section). A hash past either limit (more keys, or a
// subject key longer than about 60 bytes) is hashtable-encoded, about 80
// bytes a field: still correct, and read in pages all the same.
//
// Packing bounds. A count is packed only with demand and admitted each in
// [0, 2^18); a bigger one is written to the wide fields (two HINCRBY). A
// sink remembers, per epoch, the fields whose packed increment replied
// demand >= 2^30 or admitted >= 2^31, or failed (outcome unknown), and
// writes their later counts wide. Since a UsageFlusher has one WriteUsage
// in flight at a time and a flush holds one count per key, each of the G
// sinks writing a region's epoch (a restarted gateway's is another) adds
// at most one packed increment to a field after the field crosses a stop
// value: the field's packed demand stays below 2^30 + (G+1)*2^18 and its
// admitted below 2^31 + (G+1)*2^18. So with G <= 8,190 the admitted half
// never carries into the demand half, and with G <= 4,094 the value stays
// below 2^63. Past those: HINCRBY refuses an increment that would pass
// 2^63-1 (the count fails, and its retry goes wide: no demand lost), and a
// carry out of the admitted half moves 2^32 of admitted into one unit of
// demand (demand over-reported by one, never under-reported; the
// coordinator raises demand to admitted). A flush that fails leaves the
// fields it could not confirm written wide for the rest of their epoch.
//
// Each write sets the hash to expire at the end of epoch E+TTLEpochs
// (PEXPIREAT). The same pipeline marks the keys whose global policy
// rejected some of the flushed cost (demand > admitted) in the epoch's
// pressure hash (UsagePressureKey). One flush is one pipeline (go-redis
// splits it per cluster node); commands that failed are returned and
// retried on the next tick. A command that timed out after Redis applied
// it is counted twice on retry: usage is at-least-once, which demand
// estimates tolerate.
//
// It is safe for concurrent use.
type RedisUsageSink struct {
	client    redis.UniversalClient
	shards    int
	split     bool // the split layout (NewSplitUsageSink)
	epochMs   int64
	ttlEpochs int64
	marks     pressureMarks // the last flush's pressure marks (pressure.go)

	mu      sync.Mutex
	wide    map[int64]map[string]struct{} // by epoch: fields written wide from now on
	wideAll map[int64]bool                // epochs whose every count is written wide
}

// DefaultUsageShards is the default number of usage hashes per epoch of
// the packed layout: listpack-encoded hashes (at most 128 fields each)
// from about 100,000 to 1.5 million active keys.
const DefaultUsageShards = 16384

// DefaultSplitUsageShards is the shard count of the split layout of the
// previous release (its --usage-shards default).
const DefaultSplitUsageShards = 16

// NewRedisUsageSink returns a sink of the packed layout on client (owned
// by the caller) with shards hashes per epoch (DefaultUsageShards when <=
// 0), epochs of epoch (the limiter's UsageEpoch) and keys living ttlEpochs
// epochs after theirs ends (3 when <= 0).
func NewRedisUsageSink(client redis.UniversalClient, shards int, epoch time.Duration, ttlEpochs int) *RedisUsageSink {
	if shards <= 0 {
		shards = DefaultUsageShards
	}
	if ttlEpochs <= 0 {
		ttlEpochs = 3
	}
	return &RedisUsageSink{client: client, shards: shards, epochMs: max(1, epoch.Milliseconds()), ttlEpochs: int64(ttlEpochs),
		wide: map[int64]map[string]struct{}{}, wideAll: map[int64]bool{}}
}

// NewSplitUsageSink is NewRedisUsageSink for the split layout of the
// previous release (SplitUsageKey; shards DefaultSplitUsageShards when <=
// 0), which a coordinator of that release reads: a gateway writes it
// while its region's coordinator has not announced the packed layout
// (RegionSet.UsageShards 0).
func NewSplitUsageSink(client redis.UniversalClient, shards int, epoch time.Duration, ttlEpochs int) *RedisUsageSink {
	if shards <= 0 {
		shards = DefaultSplitUsageShards
	}
	s := NewRedisUsageSink(client, shards, epoch, ttlEpochs)
	s.split = true
	return s
}

// isWide reports whether field's counts of epoch are written wide.
func (s *RedisUsageSink) isWide(epoch int64, field string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wideAll[epoch] {
		return true
	}
	_, ok := s.wide[epoch][field]
	return ok
}

// markWide makes field's later counts of epoch go wide.
func (s *RedisUsageSink) markWide(epoch int64, field string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.wide[epoch]
	if m == nil {
		for e := range s.wide {
			if e <= epoch-usageOverflowEpochs {
				delete(s.wide, e)
			}
		}
		for e := range s.wideAll {
			if e <= epoch-usageOverflowEpochs {
				delete(s.wideAll, e)
			}
		}
		m = map[string]struct{}{}
		s.wide[epoch] = m
	}
	if len(m) >= usageWideTrack {
		s.wideAll[epoch] = true
		return
	}
	m[field] = struct{}{}
}

// WriteUsage implements UsageSink.
func (s *RedisUsageSink) WriteUsage(ctx context.Context, counts []UsageCount) ([]UsageCount, error) {
	if len(counts) == 0 {
		return nil, nil
	}
	type pending struct {
		count  UsageCount
		field  string        // "<policy>:<subject key>"
		packed *redis.IntCmd // the packed increment, or nil
		d, a   *redis.IntCmd // the wide (or split) increments, when not packed
		expire *redis.BoolCmd
	}
	pipe := s.client.Pipeline()
	items := make([]pending, len(counts))
	expired := map[string]bool{}
	// The pressure marks ride in the same pipeline: no extra round trip.
	// Their failures are not retried (a mark is a hint for the next
	// second, see UsagePressureKey).
	// Each count's subject key and field, built once for the marks and
	// the counts.
	sks, fields := make([]string, len(counts)), make([]string, len(counts))
	for i, c := range counts {
		sks[i] = c.Subject.Key()
		fields[i] = c.PolicyID + ":" + sks[i]
	}
	s.markPressure(ctx, pipe, counts, fields)
	for i, c := range counts {
		sk := sks[i]
		sh := usageShard(c.PolicyID, sk, s.shards)
		it := pending{count: c, field: fields[i]}
		var key, dField, aField string
		switch {
		case s.split:
			sh = usageSplitShard(c.PolicyID, sk, s.shards)
			key, dField, aField = SplitUsageKey(c.Epoch, sh), "d:"+it.field, "a:"+it.field
		case c.Demand >= 0 && c.Demand < usagePackIncMax && c.Admitted >= 0 && c.Admitted < usagePackIncMax && !s.isWide(c.Epoch, it.field):
			key = UsageKey(c.Epoch, sh)
			it.packed = pipe.HIncrBy(ctx, key, it.field, c.Demand<<usagePackShift+c.Admitted)
		default:
			key, dField, aField = UsageKey(c.Epoch, sh), usageWidePrefixDemand+it.field, usageWidePrefixAdmitted+it.field
		}
		if it.packed == nil {
			if c.Demand != 0 {
				it.d = pipe.HIncrBy(ctx, key, dField, c.Demand)
			}
			if c.Admitted != 0 {
				it.a = pipe.HIncrBy(ctx, key, aField, c.Admitted)
			}
		}
		if !expired[key] {
			expired[key] = true
			at := time.UnixMilli((c.Epoch + 1 + s.ttlEpochs) * s.epochMs)
			it.expire = pipe.PExpireAt(ctx, key, at)
		}
		items[i] = it
	}
	_, execErr := pipe.Exec(ctx)
	var failed []UsageCount
	var firstErr error
	for _, it := range items {
		c := it.count
		if it.packed != nil {
			v, err := it.packed.Result()
			switch {
			case err != nil:
				// The outcome is unknown (or the field is full): the
				// retry, and every later count of the field in this
				// epoch, goes wide.
				s.markWide(c.Epoch, it.field)
				failed = append(failed, c)
				firstErr = firstOf(firstErr, err)
			case v>>usagePackShift >= usagePackDemandStop || v&usagePackMask >= usagePackAdmittedStop:
				s.markWide(c.Epoch, it.field)
			}
		} else if execErr != nil {
			// Retry only the halves that failed, so a success is not repeated.
			c.Demand, c.Admitted = 0, 0
			if it.d != nil {
				if err := it.d.Err(); err != nil {
					c.Demand = it.count.Demand
					firstErr = firstOf(firstErr, err)
				}
			}
			if it.a != nil {
				if err := it.a.Err(); err != nil {
					c.Admitted = it.count.Admitted
					firstErr = firstOf(firstErr, err)
				}
			}
			if c.Demand != 0 || c.Admitted != 0 {
				failed = append(failed, c)
			}
		}
		if it.expire != nil {
			if err := it.expire.Err(); err != nil {
				firstErr = firstOf(firstErr, err)
			}
		}
	}
	if firstErr == nil {
		// Nothing failed, or only pressure marks: the counts are written.
		return nil, nil
	}
	return failed, fmt.Errorf("%w: usage flush: %v", ErrStoreUnavailable, firstErr)
}

// WriteUsageOverflow implements UsageOverflowSink: one pipeline of
// HINCRBY qo:{E} k, HINCRBY qo:{E} r and PEXPIREAT per overflow. A marker
// with zero counts still marks the epoch (the hash exists).
func (s *RedisUsageSink) WriteUsageOverflow(ctx context.Context, ovf []UsageOverflow) error {
	if len(ovf) == 0 {
		return nil
	}
	pipe := s.client.Pipeline()
	for _, o := range ovf {
		key := UsageOverflowKey(o.Epoch)
		pipe.HIncrBy(ctx, key, "k", o.Keys)
		pipe.HIncrBy(ctx, key, "r", o.Requests)
		pipe.PExpireAt(ctx, key, time.UnixMilli((o.Epoch+1+s.ttlEpochs)*s.epochMs))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("%w: usage overflow marker: %v", ErrStoreUnavailable, err)
	}
	return nil
}

// CollectUsageOverflow reads the overflow marker of epoch (see
// RedisUsageSink): whether some gateway of the region dropped usage of
// that epoch (the totals CollectUsageTotals reads are then a lower bound),
// with the keys and requests dropped, summed over the gateways. An
// unreachable Redis is an error wrapping ErrStoreUnavailable: the caller
// does not know whether the epoch is complete. A marker whose fields do not
// parse is an overflow with the counts that did, and an error wrapping
// ErrBadUsage. Safe for concurrent use.
func CollectUsageOverflow(ctx context.Context, client redis.UniversalClient, epoch int64) (UsageOverflow, bool, error) {
	fields, err := client.HGetAll(ctx, UsageOverflowKey(epoch)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return UsageOverflow{}, false, fmt.Errorf("%w: usage overflow of epoch %d: %v", ErrStoreUnavailable, epoch, err)
	}
	if len(fields) == 0 {
		return UsageOverflow{}, false, nil
	}
	o := UsageOverflow{Epoch: epoch}
	var bad error
	for f, v := range fields {
		n, err := strconv.ParseInt(v, 10, 64)
		switch {
		case err == nil && f == "k":
			o.Keys = n
		case err == nil && f == "r":
			o.Requests = n
		default:
			bad = fmt.Errorf("%w: usage overflow of epoch %d: field %q = %q", ErrBadUsage, epoch, f, v)
		}
	}
	return o, true, bad
}

func firstOf(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// CollectUsage reads one epoch's usage totals from the region's Redis, as
// the gateways' RedisUsageSink wrote them in the packed layout with the
// same shard count: every hash qv:{epoch:S} for S in [0, shards), merged
// per (policy, subject), sorted by policy then subject. Fields it cannot
// parse are skipped and reported in the error (wrapping ErrBadUsage) along
// with the totals it could read. It does not delete anything: keys expire
// on their own. Safe for concurrent use. CollectUsageTotals does the same
// without decoding subjects, for callers that only need the subject key.
func CollectUsage(ctx context.Context, client redis.UniversalClient, epoch int64, shards int) ([]UsageCount, error) {
	totals, err := CollectUsageTotals(ctx, client, epoch, shards)
	if totals == nil {
		return nil, err
	}
	out := make([]UsageCount, len(totals))
	for i, t := range totals {
		subj, _ := ParseSubjectKey(t.SubjectKey) // checked by CollectUsageTotals
		out[i] = UsageCount{Epoch: epoch, PolicyID: t.PolicyID, Subject: subj, Demand: t.Demand, Admitted: t.Admitted}
	}
	sortUsage(out)
	return out, err
}

// UsageTotal is the usage of one global policy by one subject in one
// epoch, as CollectUsageTotals returns it: UsageCount with the subject in
// its key form.
type UsageTotal struct {
	// PolicyID is the global policy counted.
	PolicyID string
	// SubjectKey is the subject counted, as Subject.Key (a valid key:
	// ParseSubjectKey accepts it).
	SubjectKey string
	// Demand is the cost of every attempt, admitted or not, in cost units.
	Demand int64
	// Admitted is the cost admitted, in cost units.
	Admitted int64
}

// UsageLayout names the usage hashes of a region that a collection reads.
type UsageLayout struct {
	// Shards is the packed layout's hashes per epoch (UsageKey; the
	// gateways' RedisUsageSink shards). DefaultUsageShards when <= 0.
	Shards int
	// SplitShards, when > 0, is the split layout's shards per epoch
	// (SplitUsageKey), also read and added in: the gateways of the
	// previous release write it, and the coordinator reads both layouts
	// for one release so that gateways and coordinators can be upgraded
	// in any order.
	SplitShards int
	// Parts and Part, with Parts > 1, restrict a collection to one part of
	// the key space (a coordinator replica's; see UsagePart): only the
	// packed hashes S with S mod Parts == Part are read, which hold
	// exactly the keys of that part when Shards is a multiple of Parts.
	// Parts > 1 requires SplitShards 0 (the split layout hashes keys
	// differently) and Shards a multiple of Parts; CollectUsageRead
	// refuses other combinations. Default 0: the whole key space.
	Parts, Part int
}

// UsagePart is the part, in [0, parts), of a (policy, subject key) pair
// when a region's coordinator replicas split the key space into parts
// parts: its packed usage shard modulo parts, the same in every gateway,
// coordinator and region. With any shard count that is a multiple of
// parts, a key's part does not depend on the shard count (the shard is
// the key's hash modulo the shard count). 0 when parts <= 1.
func UsagePart(policy, subjectKey string, parts int) int {
	if parts <= 1 {
		return 0
	}
	return usageShard(policy, subjectKey, parts)
}

// CollectUsageTotals is CollectUsage without decoding subjects or
// sorting: the totals of one epoch per (policy, subject key), in no
// particular order (sorting 100,000 totals costs more than reading them),
// every subject key checked as ParseSubjectKey checks it. Entries of one
// policy share one PolicyID string. Fields it cannot parse are skipped and
// reported in the error (wrapping ErrBadUsage) along with the totals it
// could read; an unreachable Redis is an error wrapping
// ErrStoreUnavailable and no totals. Safe for concurrent use. It reads the
// packed layout only: CollectUsageLayout(ctx, client, epoch,
// UsageLayout{Shards: shards}).
func CollectUsageTotals(ctx context.Context, client redis.UniversalClient, epoch int64, shards int) ([]UsageTotal, error) {
	return CollectUsageLayout(ctx, client, epoch, UsageLayout{Shards: shards})
}

// CollectUsageLayout is CollectUsageTotals over the hashes of layout: the
// packed layout's, and the split layout's when layout.SplitShards > 0; a
// key found in both is one total, their sum.
//
// Every hash is read with HSCAN of COUNT UsageScanCount: a listpack-encoded
// hash (at most 128 fields) whole in one call, a hashtable-encoded one in
// pages. The calls of one round trip (one pipeline) are sized to ask for
// about UsageScanRoundFields fields (from the fields per hash of the
// hashes read so far; a hash still being paged counts UsageScanCount) and
// at most UsageScanRoundCommands calls: no command and no round runs long
// on redis-server (an HGETALL of a 125,000-field hash held it for about 50
// ms, every gateway of the region missing its deadline meanwhile; and
// redis-server runs the commands of one pipeline that arrive in one read
// back to back). HSCAN may return a field twice (a rehash between calls);
// values are totals, so a repeated field is taken once.
func CollectUsageLayout(ctx context.Context, client redis.UniversalClient, epoch int64, layout UsageLayout) ([]UsageTotal, error) {
	r, err := CollectUsageRead(ctx, client, epoch, layout)
	return r.Totals, err
}

// UsageRead is what CollectUsageRead read of one epoch.
type UsageRead struct {
	// Totals are the epoch's totals, as CollectUsageLayout returns them.
	Totals []UsageTotal
	// Big are the keys of the hashes read that hold more than a listpack
	// (128 fields) or took more than one HSCAN call: the ones whose
	// expiry would cost redis-server's main thread more than a few µs
	// (see redisio.UnlinkLagEpochs), which a coordinator unlinks instead.
	Big []string
}

// CollectUsageRead is CollectUsageLayout that also says which hashes were
// big (UsageRead.Big).
func CollectUsageRead(ctx context.Context, client redis.UniversalClient, epoch int64, layout UsageLayout) (UsageRead, error) {
	var out []UsageTotal
	big, err := ScanUsage(ctx, client, epoch, layout, func(t UsageTotal) { out = append(out, t) })
	if err != nil && !errors.Is(err, ErrBadUsage) {
		return UsageRead{}, err
	}
	return UsageRead{Totals: out, Big: big}, err
}

// ScanUsage reads one epoch's usage as CollectUsageRead does, but hands
// each key's total to fn instead of building a slice, so that a caller
// with a slice of its own (a coordinator, sized by the last epoch's count)
// fills it without a copy: at a million keys, growing CollectUsageRead's
// slice and copying it into the caller's cost about a fifth of the read
// (the memory is faulted in afresh every epoch). It returns the keys of
// the big hashes (UsageRead.Big).
//
// fn is called on the calling goroutine, once per key, in no particular
// order: with the packed layout alone, as soon as the key's hash is read;
// with split shards too (a rolling upgrade), once every hash is read,
// since a key's split fields may be in any of them. Errors are
// CollectUsageRead's: on one wrapping ErrBadUsage, fn has had every total
// that could be read; on any other, what fn had is incomplete and must be
// discarded.
func ScanUsage(ctx context.Context, client redis.UniversalClient, epoch int64, layout UsageLayout, fn func(UsageTotal)) (big []string, err error) {
	if layout.Shards <= 0 {
		layout.Shards = DefaultUsageShards
	}
	parts := max(1, layout.Parts)
	if parts > 1 && (layout.Shards%parts != 0 || layout.SplitShards > 0 || layout.Part < 0 || layout.Part >= parts) {
		return nil, fmt.Errorf("limiter: usage layout: part %d of %d with %d shards and %d split shards: want 0 <= part < parts, shards a multiple of parts, no split shards", layout.Part, parts, layout.Shards, layout.SplitShards)
	}
	keys := make([]string, 0, layout.Shards/parts+max(0, layout.SplitShards))
	for s := max(0, layout.Part) % parts; s < layout.Shards; s += parts {
		keys = append(keys, UsageKey(epoch, s))
	}
	packed := len(keys)
	for s := range max(0, layout.SplitShards) {
		keys = append(keys, SplitUsageKey(epoch, s))
	}
	c := usageCollector{policies: map[string]string{}, index: map[string]int{}, seen: map[string]struct{}{}}
	// Split fields are merged into a map of every key's total only when
	// there are some (a rolling upgrade): the packed layout holds all of
	// a key's fields in one hash, so merging it per hash is enough, and
	// its totals go to fn as each hash is read.
	withSplit := len(keys) > packed
	var hash, split []UsageTotal
	err = scanUsageHashes(ctx, client, keys, func(i int, fields []string, paged bool) {
		if paged || len(fields)/2 > usageListpackEntries {
			big = append(big, keys[i])
		}
		switch {
		case i >= packed:
			split = c.collect(split, fields, paged, true)
		case withSplit:
			c.out = c.collect(c.out, fields, paged, false)
		default:
			hash = c.collect(hash[:0], fields, paged, false)
			for _, t := range hash {
				fn(t)
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("%w: collect usage of epoch %d: %v", ErrStoreUnavailable, epoch, err)
	}
	if withSplit {
		out := c.out
		if len(split) > 0 {
			at := make(map[string]int, len(out))
			for i, t := range out {
				at[t.PolicyID+":"+t.SubjectKey] = i
			}
			for _, t := range split {
				if i, ok := at[t.PolicyID+":"+t.SubjectKey]; ok {
					out[i].Demand += t.Demand
					out[i].Admitted += t.Admitted
					continue
				}
				out = append(out, t)
			}
		}
		for _, t := range out {
			fn(t)
		}
	}
	if len(c.bad) > 0 {
		slices.Sort(c.bad)
		return big, fmt.Errorf("%w: epoch %d: %d unparsable fields, first %q", ErrBadUsage, epoch, len(c.bad), c.bad[0])
	}
	return big, nil
}

// usageListpackEntries is redis-server 7.0's default
// hash-max-listpack-entries: a hash of more fields is hashtable-encoded.
const usageListpackEntries = 128

// usageCollector parses usage hashes into totals.
type usageCollector struct {
	out      []UsageTotal
	policies map[string]string // one string per policy id
	index    map[string]int    // "<policy>:<subject key>" -> index, of the hash being parsed
	seen     map[string]struct{}
	bad      []string
}

// collect parses the fields (field, value, ...) of one hash and appends
// its totals to out: a hash's fields of one key are merged (each key's
// fields are all in one hash of a layout). paged says the hash took
// several HSCAN calls (a field may then repeat). split selects the split
// layout's fields (d:/a:) instead of the packed layout's.
func (c *usageCollector) collect(out []UsageTotal, fields []string, paged, split bool) []UsageTotal {
	clear(c.index)
	clear(c.seen)
	for j := 0; j+1 < len(fields); j += 2 {
		field, val := fields[j], fields[j+1]
		if paged {
			if _, dup := c.seen[field]; dup {
				continue
			}
			c.seen[field] = struct{}{}
		}
		rest, kind := field, byte('p') // packed
		switch {
		case split && len(field) > 2 && (field[0] == 'd' || field[0] == 'a') && field[1] == ':':
			rest, kind = field[2:], field[0]
		case split:
			c.bad = append(c.bad, field)
			continue
		case strings.HasPrefix(field, usageWidePrefixDemand):
			rest, kind = field[len(usageWidePrefixDemand):], 'd'
		case strings.HasPrefix(field, usageWidePrefixAdmitted):
			rest, kind = field[len(usageWidePrefixAdmitted):], 'a'
		}
		policy, sk, ok := strings.Cut(rest, ":")
		v, err := strconv.ParseInt(val, 10, 64)
		if !ok || policy == "" || policy[0] == '#' || err != nil || v < 0 || !validSubjectKey(sk) {
			c.bad = append(c.bad, field)
			continue
		}
		i, ok := c.index[rest]
		if !ok {
			p, ok := c.policies[policy]
			if !ok {
				p = policy
				c.policies[policy] = p
			}
			i = len(out)
			c.index[rest] = i
			out = append(out, UsageTotal{PolicyID: p, SubjectKey: sk})
		}
		switch kind {
		case 'p':
			out[i].Demand += v >> usagePackShift
			out[i].Admitted += v & usagePackMask
		case 'd':
			out[i].Demand += v
		default:
			out[i].Admitted += v
		}
	}
	return out
}

// scanUsageHashes reads every hash of keys with HSCAN in bounded rounds
// (see CollectUsageLayout) and calls done with each hash's index in keys,
// its fields and values, and whether it took more than one call, once the
// hash is read to its end (a missing hash is read as empty). It returns
// the first Redis error.
//
// The rounds are sent by a goroutine of their own while done parses the
// hashes of the round before (one round in flight, one being parsed), so
// that parsing and redis-server's work overlap instead of taking turns;
// done is called on the calling goroutine, in the order of the rounds.
func scanUsageHashes(ctx context.Context, client redis.UniversalClient, keys []string, done func(i int, fields []string, paged bool)) error {
	read := make(chan []scannedHash, 1)
	var err error
	go func() {
		defer close(read)
		err = fetchUsageHashes(ctx, client, keys, read)
	}()
	for hashes := range read {
		for _, h := range hashes {
			done(h.i, h.fields, h.calls > 1)
		}
	}
	return err // written before read was closed
}

// scannedHash is one usage hash being read by fetchUsageHashes.
type scannedHash struct {
	i      int // in keys
	cursor uint64
	fields []string
	calls  int
}

// fetchUsageHashes sends the rounds of scanUsageHashes and, after each,
// the hashes it finished on out (a new slice every round: the receiver
// keeps it).
func fetchUsageHashes(ctx context.Context, client redis.UniversalClient, keys []string, out chan<- []scannedHash) error {
	var active []*scannedHash // being paged (cursor != 0)
	next := 0
	readHashes, readFields := 0, 0
	cmds := make([]*redis.ScanCmd, 0, UsageScanRoundCommands)
	round := make([]*scannedHash, 0, UsageScanRoundCommands)
	for len(active) > 0 || next < len(keys) {
		round = round[:0]
		asked := 0
		for _, h := range active {
			if len(round) == UsageScanRoundCommands {
				break
			}
			round = append(round, h)
			asked += UsageScanCount
		}
		// The fields a new hash is expected to hold: the mean of the
		// hashes read so far, UsageScanCount before any.
		est := UsageScanCount
		if readHashes > 0 {
			est = (readFields + readHashes - 1) / readHashes
		}
		for next < len(keys) && len(round) < UsageScanRoundCommands && (len(round) == 0 || asked+est <= UsageScanRoundFields) {
			round = append(round, &scannedHash{i: next})
			asked += est
			next++
		}
		pipe := client.Pipeline()
		cmds = cmds[:0]
		for _, h := range round {
			cmds = append(cmds, pipe.HScan(ctx, keys[h.i], h.cursor, "", UsageScanCount))
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		active = active[:0]
		var finished []scannedHash
		for j, cmd := range cmds {
			h := round[j]
			page, cursor := cmd.Val()
			if h.calls == 0 && cursor == 0 {
				h.fields = page // read whole in one call (every listpack): no copy
			} else {
				h.fields = append(h.fields, page...)
			}
			h.cursor = cursor
			h.calls++
			if cursor != 0 {
				active = append(active, h)
				continue
			}
			readHashes++
			readFields += len(h.fields) / 2
			finished = append(finished, *h)
		}
		if len(finished) > 0 {
			out <- finished
		}
	}
	return nil
}

// UsageScanCount is the COUNT hint of the HSCAN calls with which
// CollectUsageTotals reads a usage hash: about this many fields per call
// of a hashtable-encoded hash (HSCAN visits this many buckets, so a call
// returns a few more when buckets chain); a listpack-encoded hash (at most
// 128 fields) comes whole. One call costs redis-server about 0.75 µs per
// field of a hashtable (about 75 µs; see the README's coordinator scaling
// section).
const UsageScanCount = 100

// UsageScanRoundFields is about how many fields CollectUsageTotals asks
// for in one pipeline (estimated; see CollectUsageLayout): some 0.3 ms of
// redis-server time per round that a gateway's command can wait behind.
const UsageScanRoundFields = 400

// UsageScanRoundCommands is the most HSCAN calls CollectUsageTotals sends
// in one pipeline, which bounds a round of mostly empty or missing hashes
// (about 1 µs of redis-server time each): the default 16,384 hashes take
// at least 64 rounds, however few keys they hold.
const UsageScanRoundCommands = 256

// validSubjectKey reports whether ParseSubjectKey accepts key, without
// allocating for keys that hold no escape.
func validSubjectKey(key string) bool {
	prefix, val, ok := strings.Cut(key, ":")
	if !ok {
		return false
	}
	switch prefix {
	case "k", "a", "u", "ip", "d":
	default:
		return false
	}
	if strings.IndexByte(val, '%') < 0 {
		return !needsEscape(val)
	}
	_, err := ParseSubjectKey(key)
	return err == nil
}

// ErrBadUsage is wrapped by CollectUsage when a usage hash holds a field it
// cannot parse.
var ErrBadUsage = errors.New("limiter: bad usage field")

// ParseSubjectKey is the inverse of Subject.Key.
func ParseSubjectKey(key string) (Subject, error) {
	prefix, val, ok := strings.Cut(key, ":")
	if !ok {
		return Subject{}, fmt.Errorf("limiter: subject key %q: no kind prefix", key)
	}
	var s Subject
	switch prefix {
	case "k":
		s.Kind = SubjectAPIKey
	case "a":
		s.Kind = SubjectAccount
	case "u":
		s.Kind = SubjectUser
	case "ip":
		s.Kind = SubjectIP
	case "d":
		s.Kind = SubjectDescriptor
	default:
		return Subject{}, fmt.Errorf("limiter: subject key %q: unknown kind prefix %q", key, prefix)
	}
	if !strings.Contains(val, "%") {
		if needsEscape(val) {
			return Subject{}, fmt.Errorf("limiter: subject key %q: unescaped byte", key)
		}
		s.Value = val
		return s, nil
	}
	b := make([]byte, 0, len(val))
	for i := 0; i < len(val); i++ {
		c := val[i]
		if c != '%' {
			if !safeByte(c) {
				return Subject{}, fmt.Errorf("limiter: subject key %q: unescaped byte at %d", key, i)
			}
			b = append(b, c)
			continue
		}
		if i+2 >= len(val) {
			return Subject{}, fmt.Errorf("limiter: subject key %q: truncated escape at %d", key, i)
		}
		hi, ok1 := unhexUpper(val[i+1])
		lo, ok2 := unhexUpper(val[i+2])
		if !ok1 || !ok2 {
			return Subject{}, fmt.Errorf("limiter: subject key %q: bad escape at %d", key, i)
		}
		b = append(b, hi<<4|lo)
		i += 2
	}
	s.Value = string(b)
	if s.Key() != key {
		return Subject{}, fmt.Errorf("limiter: subject key %q: not in canonical form", key)
	}
	return s, nil
}

func unhexUpper(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// UsageFlusherConfig configures a UsageFlusher.
type UsageFlusherConfig struct {
	// Interval between flushes. Default 1 s.
	Interval time.Duration
	// Timeout bounds one flush. Default 500 ms.
	Timeout time.Duration
	// MaxLagEpochs: counts of epochs more than this many epochs before the
	// current one are dropped (and logged and counted) instead of retried,
	// because no coordinator will collect them any more. Default 2.
	MaxLagEpochs int64
	// Logger receives flush failures and drops. Default: discard.
	Logger *slog.Logger
}

// UsageFlusher is the driver that moves the limiter's usage counts to a
// UsageSink every Interval. Counts a flush could not write stay in memory
// and are retried on the next tick, within the limiter's UsageMaxKeys
// bound and MaxLagEpochs; what is dropped is logged and counted
// (quotient_limiter_usage_dropped_total), never lost silently. Usage
// dropped at UsageMaxKeys is also remembered per epoch as a UsageOverflow:
// when the sink is a UsageOverflowSink (RedisUsageSink is), each flush
// writes the overflows first, then the counts, and retries a marker it
// could not write; with another sink the markers are discarded (the
// metrics still count the drops). Start and
// Stop may be called once each; Flush may be called at any time and is safe
// for concurrent use.
type UsageFlusher struct {
	l    *Limiter
	sink UsageSink
	cfg  UsageFlusherConfig

	mu     sync.Mutex // serialises flushes
	cancel context.CancelFunc
	done   chan struct{}
}

// NewUsageFlusher returns a flusher of l's usage to sink.
func NewUsageFlusher(l *Limiter, sink UsageSink, cfg UsageFlusherConfig) *UsageFlusher {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 500 * time.Millisecond
	}
	if cfg.MaxLagEpochs <= 0 {
		cfg.MaxLagEpochs = 2
	}
	if cfg.Logger == nil {
		cfg.Logger = discardLogger()
	}
	return &UsageFlusher{l: l, sink: sink, cfg: cfg}
}

// Flush writes every pending count at now (the limiter's clock time in
// production). Counts that fail are put back for the next flush; the error
// says why.
func (f *UsageFlusher) Flush(ctx context.Context, now time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	ovf := f.l.usage.takeOverflow()
	counts := f.l.usage.take()
	if len(counts) == 0 && len(ovf) == 0 {
		f.idle(ctx) // pressure.go: a pressured key's traffic may have left
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	minEpoch := f.l.usage.epochOf(now) - f.cfg.MaxLagEpochs
	// The markers first: a coordinator that reads an epoch's counts after
	// this flush also sees that the epoch is incomplete.
	var ovfErr error
	if os, ok := f.sink.(UsageOverflowSink); ok && len(ovf) > 0 {
		if ovfErr = os.WriteUsageOverflow(ctx, ovf); ovfErr != nil {
			f.l.usage.putBackOverflow(ovf, minEpoch)
		}
	}
	var failed []UsageCount
	var err error
	if len(counts) > 0 {
		failed, err = f.sink.WriteUsage(ctx, counts)
	}
	if err == nil && len(failed) == 0 && ovfErr == nil {
		return nil
	}
	f.l.metrics.usageFlushError()
	if err == nil && len(failed) == 0 {
		f.cfg.Logger.Warn("limiter: usage overflow marker not written; retrying next tick", "err", ovfErr)
		return ovfErr
	}
	if dropped := f.l.usage.putBack(failed, minEpoch); dropped > 0 {
		f.l.metrics.usageDropped(dropped)
		f.cfg.Logger.Warn("limiter: usage counts dropped", "count", dropped, "reason", "too old or over UsageMaxKeys")
	}
	if err == nil {
		err = fmt.Errorf("%w: usage flush: %d counts not written", ErrStoreUnavailable, len(failed))
	}
	f.cfg.Logger.Warn("limiter: usage flush failed; retrying next tick", "pending", len(failed), "err", err)
	return err
}

// Start runs the flush loop in a goroutine until Stop.
func (f *UsageFlusher) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	f.done = make(chan struct{})
	go func() {
		defer close(f.done)
		f.Run(ctx)
	}()
}

// Stop ends the loop started by Start, then flushes once more (bounded by
// Timeout) so that the last second's counts are not lost on shutdown.
func (f *UsageFlusher) Stop() {
	if f.cancel == nil {
		return
	}
	f.cancel()
	<-f.done
	_ = f.Flush(context.Background(), f.l.clock.Now())
}

// Run flushes every Interval until ctx is done. It blocks.
func (f *UsageFlusher) Run(ctx context.Context) {
	t := time.NewTicker(f.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = f.Flush(ctx, f.l.clock.Now())
		}
	}
}
