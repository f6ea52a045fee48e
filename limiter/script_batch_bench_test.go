package limiter

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// BenchmarkScriptBatch measures what one script call costs Redis by the
// number of requests it carries, for quotient rls's shape of request: two
// fixed windows of two subjects (make bench-rls's "user" and "route"
// descriptors), every request admitted, keys already present. It reports
// Redis's own time (INFO commandstats: evalsha usec) per call and per
// decision; the difference between batch sizes is the fixed cost of a
// call (running the script's top level), the rest the per-request work
// (its GET and SET of each window and the Lua around them).
func BenchmarkScriptBatch(b *testing.B) {
	client := benchClient(b)
	rs := NewRedisStore(client)
	ps, err := ParsePolicies([]byte(`[
		{"id":"bench.user","algorithm":"fixed_window","limit":1000000000,"window_s":1},
		{"id":"bench.route","algorithm":"fixed_window","limit":1000000000,"window_s":60}]`))
	require.NoError(b, err)
	benchScriptCalls(b, client, rs, ps, func(i int) []Subject {
		return []Subject{{Kind: SubjectDescriptor, Value: "bench/user=u" + strconv.Itoa(i)}, {Kind: SubjectDescriptor, Value: "bench/route=r" + strconv.Itoa(i)}}
	})
}

// BenchmarkScriptBatchPair is BenchmarkScriptBatch for the shape of
// BenchmarkCompareRedisRate: one subject per request with a token bucket
// and a daily fixed window (benchPolicies), every request admitted, the
// subjects' states already present. Its redis_µs/decision at 32 requests
// a call is what Redis spends per decision in a full batch, without the
// pipeline or go-redis around it.
func BenchmarkScriptBatchPair(b *testing.B) {
	client := benchClient(b)
	benchScriptCalls(b, client, NewRedisStore(client), benchPolicies(b), func(i int) []Subject {
		subj := Subject{Kind: SubjectAPIKey, Value: "k_8f2a4c1d9e7b6a5f3c2d1e0f9a8b" + strconv.Itoa(1000+i)}
		return []Subject{subj, subj}
	})
}

// benchScriptCalls runs the decision script on batches of 1, 8 and 32
// requests, request i deciding ps[0] and ps[1] (cost 1 each) for
// subjects(i), and reports Redis's own time (INFO commandstats) per call
// and per decision, and Redis's CPU time (INFO cpu, which being
// descheduled on a busy machine does not inflate) per decision. The script is loaded and the keys created before the
// measurement.
func benchScriptCalls(b *testing.B, client *redis.Client, rs *RedisStore, ps []*Policy, subjects func(i int) []Subject) {
	l, err := New(Config{Store: rs}, ps)
	require.NoError(b, err)
	ctx := context.Background()
	for _, n := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("requests=%d", n), func(b *testing.B) {
			args := make([]any, n)
			var route string
			for i := range n {
				var rk reqKeys
				buf, err := rs.appendRequest(nil, l.Now(), subjects(i), []op{l.opFor(ps[0], 1), l.opFor(ps[1], 1)}, false, &rk)
				require.NoError(b, err)
				args[i] = string(buf)
				if i == 0 {
					route = args[i].(string)[rk.route[0]:rk.route[1]]
				}
			}
			require.NoError(b, evalScript.Run(ctx, client, []string{route}, args...).Err())
			require.NoError(b, client.ConfigResetStat(ctx).Err())
			c0 := readRedisCost(b, client)
			b.ResetTimer()
			for range b.N {
				require.NoError(b, evalScript.EvalSha(ctx, client, []string{route}, args...).Err())
			}
			b.StopTimer()
			cpu := readRedisCost(b, client).sub(c0).cpuUs / float64(b.N)
			info, err := client.Info(ctx, "commandstats").Result()
			require.NoError(b, err)
			m := regexp.MustCompile(`cmdstat_evalsha:calls=(\d+),usec=(\d+)`).FindStringSubmatch(info)
			require.NotNil(b, m, info)
			calls, _ := strconv.ParseFloat(m[1], 64)
			usec, _ := strconv.ParseFloat(m[2], 64)
			b.ReportMetric(usec/calls, "redis_µs/call")
			b.ReportMetric(usec/calls/float64(n), "redis_µs/decision")
			b.ReportMetric(cpu/float64(n), "redis_cpu_µs/decision")
		})
	}
}
