package limiter

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
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

// BenchmarkScriptPieces measures, inside Redis, what the pieces of the
// decision script cost: each piece runs in a Lua loop of one EVAL timed
// by Redis TIME, so neither the network nor the call's fixed cost is in
// it, and reports µs per piece (the loop's own cost, measured alone, is
// subtracted). These are the numbers behind the README's limiter-core
// section on where a decision's Redis time goes (issue 16): the commands
// of one policy (a GET, a SET ... PX) and the cheaper ways to keep an
// expiry (PXAT, KEEPTTL, PTTL, PEXPIREAT), reading 64 keys by GETs or one
// MGET, the struct and string calls the script makes per policy, and the
// per-op arrays of a call kept for 2 ops or for 64.
func BenchmarkScriptPieces(b *testing.B) {
	client := benchClient(b)
	ctx := context.Background()
	var mgetKeys strings.Builder
	for j := 1; j <= 64; j++ {
		fmt.Fprintf(&mgetKeys, ",'piece:%d'", j)
	}
	require.NoError(b, client.Eval(ctx, `for j = 1, 64 do redis.call('SET', 'piece:' .. j, 'abcdefghijkl') end return 1`, nil).Err())
	pieces := []struct{ name, body string }{
		{"GET", `call('GET', 'piece:1')`},
		{"SET_PX", `call('SET', 'piece:2', 'abcdefghijkl', 'PX', 5000)`},
		{"SET_PXAT", `call('SET', 'piece:4', 'abcdefghijkl', 'PXAT', 4102444800000)`},
		{"SET_KEEPTTL", `call('SET', 'piece:3', 'abcdefghijkl', 'KEEPTTL')`},
		{"SET_no_TTL", `call('SET', 'piece:5', 'abcdefghijkl')`},
		{"PEXPIRE", `call('PEXPIRE', 'piece:6', 5000)`},
		{"PEXPIREAT", `call('PEXPIREAT', 'piece:7', 4102444800000)`},
		{"PTTL", `call('PTTL', 'piece:2')`},
		{"SET_PX_moving", `call('SET', 'piece:8', 'abcdefghijkl', 'PX', 5000 + i)`},
		{"SET_PXAT_moving", `call('SET', 'piece:9', 'abcdefghijkl', 'PXAT', 4102444800000 + i)`},
		{"GET_x64", `for j = 1, 64 do call('GET', K[j]) end`},
		{"MGET_64", `call('MGET'` + mgetKeys.String() + `)`},
		{"struct.unpack_op", `unpack('>BBI8I8I8I8I8i2c0', OP)`},
		{"struct.unpack_bucket", `unpack('>I6I6', 'abcdefghijkl')`},
		{"struct.pack_bucket", `pack('>I6I6', 123456789012, 98765432101)`},
		{"struct.pack_reply", `pack('>i8i8i8i8i8', 1, 2, 3, 4, 5)`},
		{"parse_fixed_window", `local v = '1733097600000:12345' local p = string.find(v, ':', 1, true) local a, c = tonumber(string.sub(v, 1, p - 1)), tonumber(string.sub(v, p + 1))`},
		{"format_fixed_window", `string.format('%d:%d', 1733097600000, 12345)`},
		{"arrays_25x2", `local ts = {} for k = 1, 25 do local t = {} for j = 1, 2 do t[j] = j end ts[k] = t end`},
		{"arrays_25x64", `local ts = {} for k = 1, 25 do local t = {} for j = 1, 64 do t[j] = j end ts[k] = t end`},
	}
	const prelude = `local call, unpack, pack = redis.call, struct.unpack, struct.pack
local K = {} for j = 1, 64 do K[j] = 'piece:' .. j end
local OP = string.rep('\1', 42) .. '\0\5abcde'
local N = tonumber(ARGV[1])
local function us() local t = call('TIME') return tonumber(t[1]) * 1e6 + tonumber(t[2]) end
`
	loop := func(body string, n int) float64 {
		src := prelude + "local t0 = us() for i = 1, N do " + body + " end return tostring((us() - t0) / N)"
		v, err := client.Eval(ctx, src, nil, n).Text()
		require.NoError(b, err, body)
		f, err := strconv.ParseFloat(v, 64)
		require.NoError(b, err)
		return f
	}
	for _, pc := range pieces {
		b.Run(pc.name, func(b *testing.B) {
			// b.N loops of the piece; the empty loop's cost per
			// iteration is measured the same way and subtracted.
			n := max(b.N, 1)
			empty := loop(`local _ = i`, n)
			got := loop(pc.body, n)
			b.ReportMetric(got-empty, "redis_µs/piece")
		})
	}
}
