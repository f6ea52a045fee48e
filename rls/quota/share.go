package quota

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/quotientlabs/quotient/limiter"
)

// ShareQuery names one share record: a policy and a subject.
type ShareQuery struct {
	Subject  limiter.Subject
	PolicyID string
}

// ShareRecord is what a share record holds, or Found false without one.
type ShareRecord struct {
	Amount Amount
	Found  bool
}

// ShareSource reads the region's share records. ReadShares returns one
// record per query, in order; on an error the server keeps the shares it
// knew (and uses the default for buckets it never read). It must honour
// ctx.
type ShareSource interface {
	ReadShares(ctx context.Context, qs []ShareQuery) ([]ShareRecord, error)
}

// RedisShares reads the coordinator's share records from the region's
// Redis (standalone or cluster): the hash limiter.ShareKey(subject,
// policy) with fields r (milli-requests per second) and b
// (milli-requests), the record the limiter reads for global policies.
// One call is one pipeline. Safe for concurrent use.
type RedisShares struct {
	Client redis.UniversalClient
}

var _ ShareSource = (*RedisShares)(nil)

// ReadShares implements ShareSource. A record with a field missing or not
// a number is reported as not found, and named in the error.
func (r *RedisShares) ReadShares(ctx context.Context, qs []ShareQuery) ([]ShareRecord, error) {
	if len(qs) == 0 {
		return nil, nil
	}
	pipe := r.Client.Pipeline()
	cmds := make([]*redis.SliceCmd, len(qs))
	for i, q := range qs {
		cmds[i] = pipe.HMGet(ctx, limiter.ShareKey(q.Subject, q.PolicyID), "r", "b")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("quota: reading share records: %w", err)
	}
	out := make([]ShareRecord, len(qs))
	var bad error
	for i, c := range cmds {
		v := c.Val()
		if len(v) != 2 || v[0] == nil || v[1] == nil {
			continue
		}
		rs, _ := v[0].(string)
		bs, _ := v[1].(string)
		rate, err1 := strconv.ParseInt(rs, 10, 64)
		b, err2 := strconv.ParseInt(bs, 10, 64)
		if err1 != nil || err2 != nil || rate < 0 || b < 0 {
			bad = fmt.Errorf("quota: share record %s holds r=%q b=%q, not milli units", limiter.ShareKey(qs[i].Subject, qs[i].PolicyID), rs, bs)
			continue
		}
		out[i] = ShareRecord{Amount: Amount{RateMilli: rate, BurstMilli: b}, Found: true}
	}
	return out, bad
}
