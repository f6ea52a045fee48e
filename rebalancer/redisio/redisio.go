package redisio

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

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
	client redis.UniversalClient
	shards int
	bad    atomic.Int64
	lastMu sync.Mutex
	last   error
}

var _ rebalancer.UsageSource = (*Source)(nil)

// NewSource returns a Source on client (owned by the caller) for usage
// written with shards shard hashes per epoch (the gateways' setting;
// limiter.DefaultUsageShards when <= 0).
func NewSource(client redis.UniversalClient, shards int) *Source {
	if shards <= 0 {
		shards = limiter.DefaultUsageShards
	}
	return &Source{client: client, shards: shards}
}

// Usage implements rebalancer.UsageSource: the totals of epoch, one entry
// per (policy, subject key), in the order CollectUsage returns them. An
// unreachable Redis is an error wrapping ErrRead (nothing read). Fields
// that do not parse are skipped, counted (BadFields) and remembered
// (LastBadFields); the totals that did parse are returned without error,
// since one bad field must not blank the whole region's usage.
func (s *Source) Usage(ctx context.Context, epoch int64) ([]rebalancer.Usage, error) {
	counts, err := limiter.CollectUsage(ctx, s.client, epoch, s.shards)
	switch {
	case errors.Is(err, limiter.ErrBadUsage):
		s.bad.Add(1)
		s.lastMu.Lock()
		s.last = err
		s.lastMu.Unlock()
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrRead, err)
	}
	out := make([]rebalancer.Usage, len(counts))
	for i, c := range counts {
		out[i] = rebalancer.Usage{
			Key:    rebalancer.Key{PolicyID: c.PolicyID, Subject: c.Subject.Key()},
			Demand: c.Demand, Admitted: c.Admitted,
		}
	}
	return out, nil
}

// BadFields returns how many collections found unparsable usage fields.
func (s *Source) BadFields() int64 { return s.bad.Load() }

// LastBadFields returns the error of the last collection that found
// unparsable fields (nil if none did).
func (s *Source) LastBadFields() error {
	s.lastMu.Lock()
	defer s.lastMu.Unlock()
	return s.last
}

// setShare writes one share record and its expiry atomically.
// KEYS[1] the share key; ARGV rate milli, burst milli, expire-at unix ms.
var setShare = redis.NewScript(`
redis.call('HSET', KEYS[1], 'r', ARGV[1], 'b', ARGV[2])
redis.call('PEXPIREAT', KEYS[1], ARGV[3])
return 1
`)

// DefaultBatchSize is the default number of updates per pipeline.
const DefaultBatchSize = 5000

// Sink writes share updates to the region's Redis. It is safe for
// concurrent use (but a driver writes one batch at a time, in order).
type Sink struct {
	client  redis.UniversalClient
	batch   int
	loaded  atomic.Bool
	skipped atomic.Int64

	lastMu      sync.Mutex
	lastSkipped string
}

var _ rebalancer.ShareSink = (*Sink)(nil)

// NewSink returns a Sink on client (owned by the caller) that pipelines at
// most batch updates at a time (DefaultBatchSize when <= 0).
func NewSink(client redis.UniversalClient, batch int) *Sink {
	if batch <= 0 {
		batch = DefaultBatchSize
	}
	return &Sink{client: client, batch: batch}
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
		if err := setShare.Load(ctx, s.client).Err(); err != nil {
			return fmt.Errorf("%w: load script: %v", ErrWrite, err)
		}
		s.loaded.Store(true)
	}
	for lo := 0; lo < len(updates); lo += s.batch {
		hi := min(lo+s.batch, len(updates))
		bad, err := s.writeBatch(ctx, updates[lo:hi])
		if len(bad) > 0 {
			s.skipped.Add(int64(len(bad)))
			s.lastMu.Lock()
			s.lastSkipped = bad[len(bad)-1]
			s.lastMu.Unlock()
		}
		if err != nil {
			return err
		}
	}
	return nil
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

func (s *Sink) writeBatch(ctx context.Context, updates []rebalancer.Update) (bad []string, err error) {
	pipe := s.client.Pipeline()
	cmds := make([]redis.Cmder, 0, len(updates))
	for _, u := range updates {
		key, err := ShareKey(u.Key)
		if err != nil {
			bad = append(bad, u.PolicyID+"/"+u.Subject)
			continue
		}
		if u.Delete {
			cmds = append(cmds, pipe.Del(ctx, key))
			continue
		}
		cmds = append(cmds, setShare.EvalSha(ctx, pipe, []string{key},
			strconv.FormatInt(u.Share.RateMilli, 10), strconv.FormatInt(u.Share.BurstMilli, 10),
			strconv.FormatInt(u.ExpireAt.UnixMilli(), 10)))
	}
	if len(cmds) == 0 {
		return bad, nil
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
