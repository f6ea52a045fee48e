package redisio

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/shares"
)

// ErrRecords is wrapped by Records.Records when the share records could not
// all be read.
var ErrRecords = errors.New("redisio: share records read failed")

// sharePattern matches every share record (limiter.ShareKey's layout).
const sharePattern = "rl:{*}:*:share"

// scanCount is the COUNT hint of each SCAN call.
const scanCount = 1000

// Records reads every share record of the region's Redis, for a driver
// taking over (rebalancer.DriverConfig.Records): SCAN over each master
// (every node of a cluster), then each record's fields and absolute expiry
// (PEXPIRETIME, Redis 7.0 or later). It is safe for concurrent use.
type Records struct {
	client redis.UniversalClient
}

var _ rebalancer.RecordSource = (*Records)(nil)

// NewRecords returns a Records on client (owned by the caller).
func NewRecords(client redis.UniversalClient) *Records { return &Records{client: client} }

// Records implements rebalancer.RecordSource. A key that matches the
// pattern but is not a share record (unparsable name or fields) is skipped;
// a key that vanished between SCAN and the read (expired) is absent, as it
// is to the gateways. Any Redis failure is an error wrapping ErrRecords.
func (r *Records) Records(ctx context.Context) ([]rebalancer.ShareRecord, error) {
	var (
		mu  sync.Mutex
		out []rebalancer.ShareRecord
	)
	each := func(ctx context.Context, c *redis.Client) error {
		recs, err := readNode(ctx, c)
		mu.Lock()
		out = append(out, recs...)
		mu.Unlock()
		return err
	}
	var err error
	switch c := r.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, each)
	case *redis.Client:
		err = each(ctx, c)
	default:
		return nil, fmt.Errorf("%w: client %T: only *redis.Client and *redis.ClusterClient are supported", ErrRecords, r.client)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRecords, err)
	}
	return out, nil
}

// readNode reads the share records of one node.
func readNode(ctx context.Context, c *redis.Client) ([]rebalancer.ShareRecord, error) {
	var out []rebalancer.ShareRecord
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, sharePattern, scanCount).Result()
		if err != nil {
			return nil, err
		}
		if len(keys) > 0 {
			pipe := c.Pipeline()
			fields := make([]*redis.SliceCmd, len(keys))
			exp := make([]*redis.DurationCmd, len(keys))
			for i, k := range keys {
				fields[i] = pipe.HMGet(ctx, k, "r", "b")
				exp[i] = pipe.PExpireTime(ctx, k)
			}
			if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
				return nil, err
			}
			for i, k := range keys {
				if rec, ok := parseRecord(k, fields[i].Val(), exp[i].Val()); ok {
					out = append(out, rec)
				}
			}
		}
		if next == 0 {
			return out, nil
		}
		cursor = next
	}
}

// parseRecord turns a share key, its r and b fields and its PEXPIRETIME
// (a duration since the Unix epoch; negative: none, or the key is gone)
// into a record.
func parseRecord(key string, vals []any, exp time.Duration) (rebalancer.ShareRecord, bool) {
	rest, ok := strings.CutPrefix(key, "rl:{")
	if !ok {
		return rebalancer.ShareRecord{}, false
	}
	rest, ok = strings.CutSuffix(rest, ":share")
	if !ok {
		return rebalancer.ShareRecord{}, false
	}
	subject, policy, ok := strings.Cut(rest, "}:")
	if !ok || policy == "" || len(vals) != 2 {
		return rebalancer.ShareRecord{}, false
	}
	rs, ok1 := vals[0].(string)
	bs, ok2 := vals[1].(string)
	if !ok1 || !ok2 {
		return rebalancer.ShareRecord{}, false // gone, or not a record
	}
	rate, err1 := strconv.ParseInt(rs, 10, 64)
	burst, err2 := strconv.ParseInt(bs, 10, 64)
	if err1 != nil || err2 != nil || rate < 0 || burst < 0 {
		return rebalancer.ShareRecord{}, false
	}
	rec := rebalancer.ShareRecord{Key: rebalancer.Key{PolicyID: policy, Subject: subject}, Share: shares.Share{RateMilli: rate, BurstMilli: burst}}
	if exp > 0 {
		rec.ExpireAt = time.UnixMilli(exp.Milliseconds())
	}
	return rec, true
}
