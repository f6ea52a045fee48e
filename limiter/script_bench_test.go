package limiter

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// BenchmarkSlidingLogSize measures what one sliding_window_log check costs
// Redis as its log grows: the script loads the whole log (LRANGE) and
// parses every entry, so its time grows with the number of entries, that
// is up to the policy's limit. It reports the script's time per call as
// Redis measures it (INFO commandstats, evalsha usec_per_call), which is
// what other clients of the same Redis wait behind, and the caller's wall
// time per check. The bound MaxSlidingLogLimit comes from these numbers.
func BenchmarkSlidingLogSize(b *testing.B) {
	for _, n := range []int{100, 1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			client := benchClient(b)
			ctx := context.Background()
			p := &Policy{ID: "swl", Algorithm: SlidingWindowLog, Limit: 1, WindowSec: 3600}
			p.validateForBench()
			// Past MaxSlidingLogLimit on purpose, to measure what the bound
			// keeps out: the parser would refuse this policy.
			p.Limit = int64(n) * 10
			l, err := New(Config{Store: NewRedisStore(client)}, []*Policy{p})
			require.NoError(b, err)
			subj := Subject{Kind: SubjectAPIKey, Value: "k"}
			now := time.Now()
			key := StateKey(subj, p)
			vals := make([]any, 0, 1000)
			for i := 0; i < n; {
				vals = vals[:0]
				for ; i < n && len(vals) < 1000; i++ {
					vals = append(vals, fmt.Sprintf("%d:1", now.Add(-time.Minute).UnixMilli()+int64(i%1000)))
				}
				require.NoError(b, client.RPush(ctx, key, vals...).Err())
			}
			require.NoError(b, client.PExpire(ctx, key, time.Hour).Err())
			// One call loads the script, outside the measurement.
			_, err = l.checkSubjectAt(ctx, time.Now(), subj, []*Policy{p}, 1)
			require.NoError(b, err)
			require.NoError(b, client.ConfigResetStat(ctx).Err())
			b.ResetTimer()
			for range b.N {
				d, err := l.checkSubjectAt(ctx, time.Now(), subj, []*Policy{p}, 1)
				require.NoError(b, err)
				require.True(b, d.Allowed)
			}
			b.StopTimer()
			b.ReportMetric(evalshaMicros(b, client), "redis_µs/check")
		})
	}
}

// BenchmarkBucketScript reports the Redis time of one token bucket
// decision (INFO commandstats, evalsha usec_per_call), admitting, on one
// subject: what the bucket's state layout costs the script.
func BenchmarkBucketScript(b *testing.B) {
	client := benchClient(b)
	ctx := context.Background()
	p := &Policy{ID: "tb", Algorithm: TokenBucket, RatePerSec: 1e9, Burst: 1e6}
	p.validateForBench()
	l, err := New(Config{Store: NewRedisStore(client)}, []*Policy{p})
	require.NoError(b, err)
	subj := Subject{Kind: SubjectAPIKey, Value: "k_8f2a4c1d9e7b6a5f3c2d1e0f9a8b7c6d"}
	_, err = l.checkSubjectAt(ctx, time.Now(), subj, []*Policy{p}, 1)
	require.NoError(b, err)
	require.NoError(b, client.ConfigResetStat(ctx).Err())
	b.ResetTimer()
	for range b.N {
		if _, err := l.checkSubjectAt(ctx, time.Now(), subj, []*Policy{p}, 1); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(evalshaMicros(b, client), "redis_µs/check")
}

// evalshaMicros is Redis's time per EVALSHA since the last CONFIG RESETSTAT.
func evalshaMicros(b *testing.B, client interface {
	Info(ctx context.Context, section ...string) *redis.StringCmd
}) float64 {
	info, err := client.Info(context.Background(), "commandstats").Result()
	require.NoError(b, err)
	m := regexp.MustCompile(`cmdstat_evalsha:calls=(\d+),usec=(\d+),usec_per_call=([\d.]+)`).FindStringSubmatch(info)
	require.NotNil(b, m, info)
	perCall, err := strconv.ParseFloat(m[3], 64)
	require.NoError(b, err)
	return perCall
}

func (p *Policy) validateForBench() {
	if err := p.Validate(); err != nil {
		panic(err)
	}
}
