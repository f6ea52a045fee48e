package redisio

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
)

// ErrWrite is wrapped by Sink.Write when some updates may not have been
// applied; the caller retries the whole batch.
var ErrWrite = errors.New("redisio: share write failed")

// ErrRead is wrapped by Source.Usage when the usage could not be read.
var ErrRead = errors.New("redisio: usage read failed")

// Source reads one epoch's flushed usage from the region's Redis. It is
// safe for concurrent use.
type Source struct {
	client   redis.UniversalClient
	layout   limiter.UsageLayout
	bad      atomic.Int64
	unlinkKO atomic.Int64
	lastMu   sync.Mutex
	last     error
	bigMu    sync.Mutex
	big      map[int64][]string // by epoch read: its big packed hashes, to unlink
	lastKeys atomic.Int64       // keys of the last read, to size the next one's slice
}

var _ rebalancer.UsageSource = (*Source)(nil)

// NewSource returns a Source on client (owned by the caller) for usage
// written in the packed layout with shards hashes per epoch (the
// gateways' setting; limiter.DefaultUsageShards when <= 0).
func NewSource(client redis.UniversalClient, shards int) *Source {
	return NewLayoutSource(client, limiter.UsageLayout{Shards: shards})
}

// NewLayoutSource is NewSource for the hashes of layout: with
// layout.SplitShards > 0 it also reads (and adds in, and unlinks) the
// split layout that gateways of the previous release write, for a rolling
// upgrade (see limiter.UsageLayout).
func NewLayoutSource(client redis.UniversalClient, layout limiter.UsageLayout) *Source {
	if layout.Shards <= 0 {
		layout.Shards = limiter.DefaultUsageShards
	}
	layout.SplitShards = max(0, layout.SplitShards)
	return &Source{client: client, layout: layout, big: map[int64][]string{}}
}

// Usage implements rebalancer.UsageSource: the totals of epoch, one entry
// per (policy, subject key), in no particular order. An unreachable Redis is an error wrapping
// ErrRead (nothing read). Fields that do not parse are skipped, counted
// (BadFields) and remembered (LastBadFields); the totals that did parse are
// returned without error, since one bad field must not blank the whole
// region's usage.
//
// After the totals it reads the epoch's overflow marker
// (limiter.CollectUsageOverflow): when a gateway dropped usage of the
// epoch, or when the marker cannot be read (completeness unknown), the
// totals come with an error wrapping rebalancer.ErrUsageIncomplete: they
// are a lower bound, and the driver collects them as such.
//
// Once the totals are read it deletes, with UNLINK, the big usage hashes
// and the overflow marker of epoch-UnlinkLagEpochs (see UnlinkLagEpochs
// and unlink); a deletion that fails is counted (UnlinkFailures), not an
// error: the keys still expire by themselves.
func (s *Source) Usage(ctx context.Context, epoch int64) ([]rebalancer.Usage, error) {
	out, err := s.totals(ctx, epoch)
	if err != nil {
		return nil, err
	}
	s.unlink(ctx, epoch-UnlinkLagEpochs)
	// After the totals: a gateway writes its marker before its counts,
	// so counts read here that lack a dropped key's come with the marker.
	ovf, dropped, oerr := limiter.CollectUsageOverflow(ctx, s.client, epoch)
	switch {
	case oerr != nil && !dropped:
		return out, fmt.Errorf("%w: epoch %d: overflow marker unreadable: %w", rebalancer.ErrUsageIncomplete, epoch, oerr)
	case dropped:
		return out, fmt.Errorf("%w: epoch %d: gateways dropped usage of %d keys (%d requests) at their key bound", rebalancer.ErrUsageIncomplete, epoch, ovf.Keys, ovf.Requests)
	}
	return out, nil
}

func (s *Source) totals(ctx context.Context, epoch int64) ([]rebalancer.Usage, error) {
	// Sized for the last read's keys and a sixteenth more: growing a
	// million-entry slice, and faulting its memory in, cost about a fifth
	// of the read (BenchmarkSourceUsage).
	hint := s.lastKeys.Load()
	out := make([]rebalancer.Usage, 0, hint+hint/16)
	var bad int64
	big, err := limiter.ScanUsage(ctx, s.client, epoch, s.layout, func(t limiter.UsageTotal) {
		if u, ok := sanitize(t); ok {
			out = append(out, u)
		} else {
			bad++
		}
	})
	if err == nil || errors.Is(err, limiter.ErrBadUsage) {
		s.rememberBig(epoch, big)
	}
	switch {
	case errors.Is(err, limiter.ErrBadUsage):
		s.bad.Add(1)
		s.lastMu.Lock()
		s.last = err
		s.lastMu.Unlock()
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrRead, err)
	}
	s.bad.Add(bad)
	s.lastKeys.Store(int64(len(out)))
	return out, nil
}

// sanitize turns one key's flushed totals into a Usage the Core accepts.
// Gateways flush demand and admitted as separate increments and retry them
// separately (at least once), so admitted can exceed demand by a retried
// flush; every admitted attempt is also demand, so demand is raised to
// admitted rather than losing the whole epoch to one entry (the Core
// rejects a list with any invalid entry). Negative totals cannot come from
// gateways (they only add) and are dropped.
func sanitize(t limiter.UsageTotal) (rebalancer.Usage, bool) {
	if t.Demand < 0 || t.Admitted < 0 || t.PolicyID == "" {
		return rebalancer.Usage{}, false
	}
	return rebalancer.Usage{
		Key:    rebalancer.Key{PolicyID: t.PolicyID, Subject: t.SubjectKey},
		Demand: max(t.Demand, t.Admitted), Admitted: t.Admitted,
	}, true
}

// UnlinkLagEpochs is how many epochs behind the one it reads Source.Usage
// deletes usage: reading epoch E (during E+1), it unlinks the hashes and
// the overflow marker of E-2. Those were collected two epochs ago (the Core
// collects an epoch once), and gateways no longer write them (a
// UsageFlusher drops counts more than MaxLagEpochs, 2 by default, epochs
// old; a later write would only make a small hash that expires by
// itself). They would expire at the end of E+1 (RedisUsageSink's default
// three epochs), and redis-server 7.0 frees an expired key synchronously
// unless lazyfree-lazy-expire is yes: 27 ms of its main thread for a
// 125,000-field shard of a million-key epoch. UNLINK hands the hash to a
// background thread (about 0.1 ms). Only a key not yet expired can be
// unlinked this way (UNLINK of an expired key frees it as an expiry
// does), so the Source does not reach further back: epochs it did not
// collect expire on their own (set lazyfree-lazy-expire yes).
const UnlinkLagEpochs = 2

// UnlinkPipeline is how many UNLINK commands Source.Usage sends in one
// pipeline when it deletes an old epoch (one key a command: each hash has
// its own cluster slot): 16,384 small hashes take 64 round trips instead
// of one pipeline that redis-server would run back to back for a few ms.
// An UNLINK of a listpack-encoded hash frees it at once (about 1 µs); of
// a big hashtable-encoded one, on a background thread.
const UnlinkPipeline = 256

// rememberBig keeps the big packed hashes of epoch, read now, for the
// unlink UnlinkLagEpochs later, and forgets older epochs' lists.
func (s *Source) rememberBig(epoch int64, keys []string) {
	s.bigMu.Lock()
	defer s.bigMu.Unlock()
	for e := range s.big {
		if e < epoch-UnlinkLagEpochs {
			delete(s.big, e)
		}
	}
	var packed []string
	prefix := limiter.UsageKey(epoch, 0)
	prefix = prefix[:strings.IndexByte(prefix, ':')+1] // "qv:"
	for _, k := range keys {
		if strings.HasPrefix(k, prefix) {
			packed = append(packed, k)
		}
	}
	s.big[epoch] = packed
}

// unlink deletes the usage of epoch e (best effort; see Usage): the split
// layout's shards (all of them; they are big), the packed layout's hashes
// that the collection of e found big, and the overflow marker. The packed
// layout's other hashes (listpack-encoded, at most 128 fields) are left to
// expire: freeing one costs about a µs, and unlinking 16,384 of them would
// take 64 round trips. When e was not read by this Source (a coordinator
// restarted or took over), every packed hash of e is unlinked.
func (s *Source) unlink(ctx context.Context, e int64) {
	s.bigMu.Lock()
	big, known := s.big[e]
	delete(s.big, e)
	s.bigMu.Unlock()
	keys := make([]string, 0, len(big)+s.layout.SplitShards+1)
	if known {
		keys = append(keys, big...)
	} else {
		for sh := range s.layout.Shards {
			keys = append(keys, limiter.UsageKey(e, sh))
		}
	}
	for sh := range s.layout.SplitShards {
		keys = append(keys, limiter.SplitUsageKey(e, sh))
	}
	keys = append(keys, limiter.UsageOverflowKey(e))
	failed := false
	for lo := 0; lo < len(keys); lo += UnlinkPipeline {
		pipe := s.client.Pipeline()
		for _, k := range keys[lo:min(lo+UnlinkPipeline, len(keys))] {
			pipe.Unlink(ctx, k)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			failed = true
		}
	}
	if failed {
		s.unlinkKO.Add(1)
	}
}

// UnlinkFailures returns how many times deleting an old epoch's usage
// failed (see UnlinkLagEpochs); those keys expire by themselves.
func (s *Source) UnlinkFailures() int64 { return s.unlinkKO.Load() }

// BadFields returns how many collections found unparsable usage fields.
func (s *Source) BadFields() int64 { return s.bad.Load() }

// LastBadFields returns the error of the last collection that found
// unparsable fields (nil if none did).
func (s *Source) LastBadFields() error {
	s.lastMu.Lock()
	defer s.lastMu.Unlock()
	return s.last
}

// setShares writes share records, each atomically with its expiry, and
// deletes records, in the order given: for every key KEYS[i], ARGV[3i-2],
// ARGV[3i-1] and ARGV[3i] are its rate milli, burst milli and expire-at
// unix ms, or "-", "", "" to delete it. On a cluster every key of one call
// is in one slot.
var setShares = redis.NewScript(`
for i, key in ipairs(KEYS) do
  local j = 3 * i
  if ARGV[j - 2] == '-' then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'r', ARGV[j - 2], 'b', ARGV[j - 1])
    redis.call('PEXPIREAT', key, ARGV[j])
  end
end
return #KEYS
`)

// DefaultBatchSize is the default number of updates per pipeline.
// redis-server runs every command one read of a client's socket brought
// back to back (once its query buffer has grown, a read takes whatever the
// socket holds), so to the gateways' commands a pipeline is one long
// command: with pipelines of 5,000 updates a gateway-like probe waited 0.9
// to 1.5 ms at the median and 2.5 to 3.5 ms at p99 while a region's
// shares were written (BenchmarkEpochScale at 100k keys, redis-server on a
// core of its own); 64 updates a pipeline with 3 in flight (SetWriters)
// gave 0.38 to 0.43 and 0.6 to 0.7 ms and wrote as fast (194 to 216 ms
// against 243 to 318). At a million keys (same placement, two runs of
// each in turns) 64 x 3 lost on every count: the writes took 4.35 to
// 4.40 s against 2.73 to 2.80 s and 3.6 to 3.7 s of redis-server CPU
// against 2.2 to 2.3 s (16,000 pipelines instead of 200), and the probe
// waited as long (p50 0.79 to 0.85 ms, p99 4.7 to 4.9 ms, against 0.85 and
// 5.0 to 5.1 ms): at that size its wait is the scheduler sharing Redis's
// core, not one pipeline's length. So 5,000 and one writer stay the
// defaults.
const DefaultBatchSize = 5000

// DefaultWriters is how many pipelines one Write keeps in flight at once
// by default.
const DefaultWriters = 1

// DefaultKeysPerCall is the default number of records one script call
// writes (at most; on a cluster a call holds the records of one slot).
// A record costs redis-server about 3.5 µs inside the script at 20,000
// records and up to twice that at a million (a larger keyspace), so a call
// of 50 runs about 0.2 to 0.4 ms, under the 1 ms no command of the
// coordinator may reach; 200 a call took 1.2 to 1.6 ms at a million keys.
// Calls of 50 cost about 7 % more per record than calls of 200.
const DefaultKeysPerCall = 32

// Sink writes share updates to the region's Redis. It is safe for
// concurrent use (but a driver writes one batch at a time, in order).
type Sink struct {
	client  redis.UniversalClient
	batch   int
	writers int
	seed    maphash.Seed
	perCall int // records per script call; 1 for clients whose routing is unknown
	cluster bool
	loaded  atomic.Bool
	skipped atomic.Int64

	lastMu      sync.Mutex
	lastSkipped string
}

var _ rebalancer.ShareSink = (*Sink)(nil)

// NewSink returns a Sink on client (owned by the caller) that pipelines at
// most batch updates at a time (DefaultBatchSize when <= 0), with up to
// DefaultWriters pipelines in flight (SetWriters). Each script
// call writes up to DefaultKeysPerCall records: consecutive ones on a
// standalone Redis (*redis.Client), records of one slot on a cluster
// (*redis.ClusterClient); any other client (a Ring, whose routing of a
// multi-key call is its own) gets one record per call.
func NewSink(client redis.UniversalClient, batch int) *Sink {
	if batch <= 0 {
		batch = DefaultBatchSize
	}
	s := &Sink{client: client, batch: batch, writers: DefaultWriters, seed: maphash.MakeSeed(), perCall: DefaultKeysPerCall}
	switch client.(type) {
	case *redis.Client:
	case *redis.ClusterClient:
		s.cluster = true
	default:
		s.perCall = 1
	}
	return s
}

// SetWriters sets how many pipelines one Write keeps in flight (at least
// 1; DefaultWriters by default). Call it before the first Write, not
// during one.
func (s *Sink) SetWriters(n int) {
	s.writers = max(n, 1)
}

// ShareKey returns the Redis key of the share record of k, as the limiter
// reads it; an error when k.Subject is not a limiter subject key.
func ShareKey(k rebalancer.Key) (string, error) {
	subj, err := limiter.ParseSubjectKey(k.Subject)
	if err != nil {
		return "", err
	}
	return limiter.ShareKey(subj, k.PolicyID), nil
}

// Write implements rebalancer.ShareSink. Any Redis failure returns an
// error wrapping ErrWrite; the caller retries the same updates (every
// command is idempotent). Updates whose subject is not a limiter subject
// key (only another region's malformed report can name one) cannot be
// enforced by any gateway: they are skipped and counted (Skipped,
// LastSkipped), not an error, so that retrying cannot loop on them.
func (s *Sink) Write(ctx context.Context, updates []rebalancer.Update) error {
	if len(updates) == 0 {
		return nil
	}
	if !s.loaded.Load() {
		if err := setShares.Load(ctx, s.client).Err(); err != nil {
			return fmt.Errorf("%w: load script: %v", ErrWrite, err)
		}
		s.loaded.Store(true)
	}
	if s.writers <= 1 || len(updates) <= s.batch {
		for lo := 0; lo < len(updates); lo += s.batch {
			if err := s.writeCounted(ctx, updates[lo:min(lo+s.batch, len(updates))]); err != nil {
				return err
			}
		}
		return nil
	}
	// Several pipelines in flight: each writer takes the updates of the
	// subjects that hash to it, in the order given, so a later update of
	// a key is still written after an earlier one.
	parts := make([][]int32, s.writers)
	for i, u := range updates {
		w := maphash.String(s.seed, u.Subject) % uint64(s.writers)
		parts[w] = append(parts[w], int32(i))
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, part := range parts {
		g.Go(func() error {
			buf := make([]rebalancer.Update, 0, s.batch)
			for lo := 0; lo < len(part); lo += s.batch {
				buf = buf[:0]
				for _, i := range part[lo:min(lo+s.batch, len(part))] {
					buf = append(buf, updates[i])
				}
				if err := s.writeCounted(gctx, buf); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// writeCounted writes one batch, counting the updates it skipped.
func (s *Sink) writeCounted(ctx context.Context, updates []rebalancer.Update) error {
	bad, err := s.writeBatch(ctx, updates)
	if len(bad) > 0 {
		s.skipped.Add(int64(len(bad)))
		s.lastMu.Lock()
		s.lastSkipped = bad[len(bad)-1]
		s.lastMu.Unlock()
	}
	return err
}

// Skipped returns how many updates Write skipped because their subject is
// not a limiter subject key.
func (s *Sink) Skipped() int64 { return s.skipped.Load() }

// LastSkipped returns the last skipped update's "policy/subject" ("" if
// none).
func (s *Sink) LastSkipped() string {
	s.lastMu.Lock()
	defer s.lastMu.Unlock()
	return s.lastSkipped
}

// call is one script call being assembled: its keys and arguments.
type call struct {
	keys []string
	args []any
}

func (s *Sink) writeBatch(ctx context.Context, updates []rebalancer.Update) (bad []string, err error) {
	// Group records into calls: consecutive ones, or on a cluster the ones
	// of one slot. Records of one key stay in their order (one key, one
	// slot), so a later update of a key still wins.
	var calls []*call
	open := map[uint16]*call{} // by slot, the call being filled
	for _, u := range updates {
		key, err := ShareKey(u.Key)
		if err != nil {
			bad = append(bad, u.PolicyID+"/"+u.Subject)
			continue
		}
		var slot uint16
		if s.cluster {
			slot = keySlot(key)
		}
		c := open[slot]
		if c == nil || len(c.keys) >= s.perCall {
			c = &call{keys: make([]string, 0, min(s.perCall, len(updates))), args: make([]any, 0, 3*min(s.perCall, len(updates)))}
			open[slot] = c
			calls = append(calls, c)
		}
		c.keys = append(c.keys, key)
		if u.Delete {
			c.args = append(c.args, "-", "", "")
		} else {
			c.args = append(c.args, u.Share.RateMilli, u.Share.BurstMilli, u.ExpireAt.UnixMilli())
		}
	}
	if len(calls) == 0 {
		return bad, nil
	}
	pipe := s.client.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for i, c := range calls {
		cmds[i] = setShares.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		for _, c := range cmds {
			if e := c.Err(); e != nil && redis.HasErrorPrefix(e, "NOSCRIPT") {
				s.loaded.Store(false) // a restarted server lost the script
				break
			}
		}
		return bad, fmt.Errorf("%w: %d updates: %v", ErrWrite, len(updates), err)
	}
	return bad, nil
}

// keySlot is the Redis Cluster slot of key: CRC16 (XMODEM) of its hash
// tag (the part inside the first {...}, when not empty) or of the whole
// key, modulo 16384, as the Redis Cluster specification defines it.
func keySlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc & 16383
}
