package limiter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// UsagePressureKey is the Redis key of epoch's pressure hash:
// "qp:{<epoch>}". A gateway's flush (RedisUsageSink.WriteUsage) adds, for
// every key whose global policy rejected some of the flushed cost (demand
// > admitted), the flushed demand to field "<policy id>:<subject key>"
// (HINCRBY, cost units), in the same pipeline as the usage counts, with the
// usage shards' expiry (end of epoch + TTLEpochs). A field therefore holds
// the demand of the region's pressured flushes so far in the epoch, summed
// over the gateways; the coordinator reads it every second
// (CollectUsagePressure) and turns what a field gained since its last read
// into the key's demand rate, to ask other regions for share at once
// instead of at the next epoch. One hash per epoch (one cluster slot):
// only rejected keys are marked, at most DefaultPressureMaxKeys per flush.
func UsagePressureKey(epoch int64) string {
	return "qp:{" + strconv.FormatInt(epoch, 10) + "}"
}

// UsagePressureWakeKey is the Redis key a gateway's flush pushes a token
// to when the region's pressure changes (in the same pipeline as the
// marks): the flush marks a key the gateway's previous flush did not (new
// pressure; any key when the previous flush is older than
// newPressureAfter), or a key the previous flush marked has no usage in
// this one (its traffic left; a flush with no usage at all sends the
// token alone, once). It is a list of at most one element ("1"), expiring
// UsagePressureWakeTTL after the last push. The coordinator blocks on it
// (BLPOP, a bounded wait on its own connection: Redis serves other clients
// meanwhile) and reads the marks at once instead of at its next pressure
// interval, then at its interval, in phase with the flushes: an asker
// asks as soon as its pressure appears, and a giver whose traffic left no
// longer counts the key as under pressure from its next flush on. Keys
// that stay under pressure wake nobody (in the simulator, waking the
// coordinator at every flush cost five-regions-lossy 2 points: under
// steady contention the reads' phase is noise). It is a hint: a token
// popped before the marks of another cluster node are written, or a push
// lost, only delays the read to the coordinator's next interval. At most
// one push per gateway and flush.
const UsagePressureWakeKey = "qp:wake"

// UsagePressureWakeTTL is how long a wake token nobody popped lives.
const UsagePressureWakeTTL = 10 * time.Second

// newPressureAfter is how long after a sink's last flush every mark is
// new again (the traffic paused: no usage to flush).
const newPressureAfter = 2 * time.Second

// pressureMarks remembers the fields a sink's last flush marked.
type pressureMarks struct {
	mu   sync.Mutex
	at   time.Time
	last map[string]bool
}

// lastMarks returns the last flush's marks. The map is never changed
// after it is stored (changed replaces it), so the caller may read it.
func (m *pressureMarks) lastMarks() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

// changed records marked as the last flush's marks (used: the fields the
// flush had usage for, at least those of the last marks) and reports whether the region's pressure changed
// (see UsagePressureWakeKey).
func (m *pressureMarks) changed(now time.Time, marked, used map[string]bool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	wake := len(marked) > 0 && (now.Sub(m.at) > newPressureAfter || now.Before(m.at))
	for f := range marked {
		if !m.last[f] {
			wake = true
		}
	}
	for f := range m.last {
		if !used[f] {
			wake = true // its traffic left
		}
	}
	m.at, m.last = now, marked
	return wake
}

// wake queues the wake token on pipe.
func wake(ctx context.Context, pipe redis.Pipeliner) {
	pipe.LPush(ctx, UsagePressureWakeKey, "1")
	pipe.LTrim(ctx, UsagePressureWakeKey, 0, 0)
	pipe.PExpire(ctx, UsagePressureWakeKey, UsagePressureWakeTTL)
}

// idle is the flush of nothing: when the sink's previous flush marked
// pressure, the keys' traffic left, so it sends the wake token alone
// (bounded by the flush timeout; a failure is a lost hint).
func (f *UsageFlusher) idle(ctx context.Context) {
	s, ok := f.sink.(*RedisUsageSink)
	if !ok || !s.marks.changed(time.Now(), nil, nil) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	pipe := s.client.Pipeline()
	wake(ctx, pipe)
	_, _ = pipe.Exec(ctx)
}

// DefaultPressureMaxKeys bounds the keys one flush marks in the pressure
// hash: beyond it, the keys with the most cost rejected in the flush are
// marked and the others are not (they still ask at the next flush if they
// stay among the most rejected, and their usage is counted as always).
const DefaultPressureMaxKeys = 1024

// markPressure queues on pipe the pressure marks of counts (see
// UsagePressureKey); fields[i] is counts[i]'s "<policy>:<subject key>".
func (s *RedisUsageSink) markPressure(ctx context.Context, pipe redis.Pipeliner, counts []UsageCount, fields []string) {
	var marked []int
	// used: which of the last flush's marks (at most
	// DefaultPressureMaxKeys) still have traffic; a map of every field
	// would cost a map of the whole flush per second.
	last := s.marks.lastMarks()
	used := make(map[string]bool, len(last))
	for i, c := range counts {
		if c.Demand > 0 && last[fields[i]] {
			used[fields[i]] = true
		}
		if c.Demand > c.Admitted {
			marked = append(marked, i)
		}
	}
	if len(marked) == 0 {
		if s.marks.changed(time.Now(), nil, used) {
			wake(ctx, pipe)
		}
		return
	}
	if len(marked) > DefaultPressureMaxKeys {
		slices.SortStableFunc(marked, func(a, b int) int {
			return cmp.Compare(counts[b].Demand-counts[b].Admitted, counts[a].Demand-counts[a].Admitted)
		})
		marked = marked[:DefaultPressureMaxKeys]
	}
	expired := map[int64]bool{}
	markedFields := make(map[string]bool, len(marked))
	for _, i := range marked {
		c := counts[i]
		key := UsagePressureKey(c.Epoch)
		markedFields[fields[i]] = true
		pipe.HIncrBy(ctx, key, fields[i], c.Demand)
		if !expired[c.Epoch] {
			expired[c.Epoch] = true
			pipe.PExpireAt(ctx, key, time.UnixMilli((c.Epoch+1+s.ttlEpochs)*s.epochMs))
		}
	}
	if s.marks.changed(time.Now(), markedFields, used) {
		// After the marks in the pipeline: a standalone Redis runs them in
		// order, so the coordinator the token wakes finds them. On a
		// cluster the token's slot (qp:wake) and the marks' (qp:{E}) may be
		// on different nodes, which answer in any order; a wake-up that
		// reads before the marks land finds them at the next interval.
		wake(ctx, pipe)
	}
}

// UsagePressure is one field of a pressure hash: the demand a region's
// gateways flushed so far in the epoch for a key whose policy rejected
// some of it (see UsagePressureKey).
type UsagePressure struct {
	// PolicyID is the global policy.
	PolicyID string
	// SubjectKey is the subject, as Subject.Key (ParseSubjectKey accepts it).
	SubjectKey string
	// Demand is the demand of the pressured flushes, cost units, > 0.
	Demand int64
}

// CollectUsagePressure reads at most maxKeys fields of epoch's pressure
// hash (HSCAN, a bounded slice per call; maxKeys <= 0 means
// DefaultPressureMaxKeys), in no particular order, and whether the hash
// held more than that (the rest is not read). Fields it cannot parse are
// skipped and reported in the error (wrapping ErrBadUsage) with the ones
// it could read; an unreachable Redis is an error wrapping
// ErrStoreUnavailable and nothing read. Safe for concurrent use.
func CollectUsagePressure(ctx context.Context, client redis.UniversalClient, epoch int64, maxKeys int) ([]UsagePressure, bool, error) {
	if maxKeys <= 0 {
		maxKeys = DefaultPressureMaxKeys
	}
	key := UsagePressureKey(epoch)
	var out []UsagePressure
	seen := map[string]bool{}
	var bad []string
	var cursor uint64
	for {
		page, next, err := client.HScan(ctx, key, cursor, "", UsageScanCount).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, false, fmt.Errorf("%w: usage pressure of epoch %d: %v", ErrStoreUnavailable, epoch, err)
		}
		for j := 0; j+1 < len(page); j += 2 {
			field, val := page[j], page[j+1]
			if seen[field] {
				continue // HSCAN may return a field twice
			}
			seen[field] = true
			policy, sk, ok := strings.Cut(field, ":")
			n, err := strconv.ParseInt(val, 10, 64)
			if !ok || policy == "" || err != nil || n <= 0 || !validSubjectKey(sk) {
				bad = append(bad, field)
				continue
			}
			if len(out) == maxKeys {
				return out, true, badPressure(epoch, bad)
			}
			out = append(out, UsagePressure{PolicyID: policy, SubjectKey: sk, Demand: n})
		}
		cursor = next
		if cursor == 0 {
			return out, false, badPressure(epoch, bad)
		}
	}
}

func badPressure(epoch int64, bad []string) error {
	if len(bad) == 0 {
		return nil
	}
	slices.Sort(bad)
	return fmt.Errorf("%w: usage pressure of epoch %d: %d unparsable fields, first %q", ErrBadUsage, epoch, len(bad), bad[0])
}

// CollectUsageDemand reads the demand counted so far in epoch for keys
// (each "<policy id>:<subject key>", as in the pressure hash) from the
// usage hashes of the packed layout (HMGET of each key's packed and wide
// demand fields, one pipeline), in the order of
// keys; 0 for a key with no usage. shards is the gateways' usage shard
// count (DefaultUsageShards when <= 0). An unreachable Redis is an error
// wrapping ErrStoreUnavailable; a field that does not parse reads as 0 and
// is reported in an error wrapping ErrBadUsage with the others. Safe for
// concurrent use.
func CollectUsageDemand(ctx context.Context, client redis.UniversalClient, epoch int64, shards int, keys []string) ([]int64, error) {
	if shards <= 0 {
		shards = DefaultUsageShards
	}
	out := make([]int64, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	byShard := map[int][]int{}
	for i, k := range keys {
		policy, sk, _ := strings.Cut(k, ":")
		sh := usageShard(policy, sk, shards)
		byShard[sh] = append(byShard[sh], i)
	}
	pipe := client.Pipeline()
	type get struct {
		idx []int
		cmd *redis.SliceCmd
	}
	gets := make([]get, 0, len(byShard))
	for sh, idx := range byShard {
		fields := make([]string, 0, 2*len(idx))
		for _, i := range idx {
			fields = append(fields, keys[i], usageWidePrefixDemand+keys[i])
		}
		gets = append(gets, get{idx: idx, cmd: pipe.HMGet(ctx, UsageKey(epoch, sh), fields...)})
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("%w: usage demand of epoch %d: %v", ErrStoreUnavailable, epoch, err)
	}
	var bad error
	for _, g := range gets {
		for j, v := range g.cmd.Val() {
			s, ok := v.(string)
			if !ok {
				continue // no usage yet
			}
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n < 0 {
				bad = fmt.Errorf("%w: usage demand of epoch %d: field %q = %q", ErrBadUsage, epoch, g.cmd.Args()[2+j], s)
				continue
			}
			if j%2 == 0 {
				n >>= usagePackShift // the packed field's demand half
			}
			out[g.idx[j/2]] += n
		}
	}
	return out, bad
}
