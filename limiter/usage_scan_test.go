package limiter

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// commandTimes returns how long each command redis-server logged in its
// SLOWLOG ran, by command name.
func commandTimes(t *testing.T, ctx context.Context, client *redis.Client) map[string][]time.Duration {
	t.Helper()
	logs, err := client.SlowLogGet(ctx, -1).Result()
	require.NoError(t, err)
	out := map[string][]time.Duration{}
	for _, l := range logs {
		if len(l.Args) > 0 {
			out[strings.ToLower(l.Args[0])] = append(out[strings.ToLower(l.Args[0])], l.Duration)
		}
	}
	return out
}

// Collecting a usage shard as big as a million keys give one (62,500 keys
// of 16 shards: 125,000 fields) runs only short commands on redis-server,
// where one HGETALL of it blocks every gateway of the region for tens of
// milliseconds; and the totals are exact. SLOWLOG records every command's
// run time (threshold 0). The run times include the time the server was
// descheduled, which on a loaded machine can be milliseconds for any
// command, so the test asserts the median HSCAN under 1 ms and the slowest
// well under the one HGETALL, and logs both; the quiet-machine figures
// are in the README.
func TestCollectUsageNeverStallsRedis(t *testing.T) {
	srv := redistest.StartServer(t)
	client := srv.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const keys = 62_500
	epoch := time.Now().UnixMilli() / 1000
	shard := UsageKey(epoch, 0)
	pipe := client.Pipeline()
	var want int64
	args := make([]any, 0, 2000)
	for i := range keys {
		d, a := int64(i%7+1), int64(i%5)
		want += d + a
		sk := "k:key-" + strconv.Itoa(i)
		args = append(args, "d:g:"+sk, d, "a:g:"+sk, a)
		if len(args) == cap(args) || i == keys-1 {
			pipe.HSet(ctx, shard, args...)
			args = make([]any, 0, 2000)
		}
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)

	require.NoError(t, client.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err())
	require.NoError(t, client.ConfigSet(ctx, "slowlog-max-len", "100000").Err())
	require.NoError(t, client.SlowLogReset(ctx).Err())
	got, err := CollectUsageTotals(ctx, client, epoch, 1)
	require.NoError(t, err)
	scans := commandTimes(t, ctx, client)["hscan"]
	require.NoError(t, client.SlowLogReset(ctx).Err())
	require.NoError(t, client.HGetAll(ctx, shard).Err())
	all := commandTimes(t, ctx, client)["hgetall"]
	require.Len(t, all, 1)

	require.Len(t, got, keys)
	var sum int64
	for _, u := range got {
		sum += u.Demand + u.Admitted
	}
	assert.Equal(t, want, sum, "exact totals")

	require.NotEmpty(t, scans)
	slices.Sort(scans)
	median, slowest := scans[len(scans)/2], scans[len(scans)-1]
	t.Logf("%d HSCAN calls: median %v, slowest %v; one HGETALL of the shard: %v", len(scans), median, slowest, all[0])
	assert.Less(t, median, time.Millisecond)
	assert.Less(t, slowest, all[0]/2, "no HSCAN comes near the HGETALL it replaced")
}
