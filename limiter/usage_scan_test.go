package limiter

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// Collecting a usage hash as big as a million keys gave one in the split
// layout of 16 shards (here 62,500 keys of the packed layout, one field
// each; the packed layout gets that big with too few shards) reads it in HSCAN pages of UsageScanCount
// (each page at most twice that many fields, whole buckets), never in one
// command: one HGETALL of it blocks every gateway of the region for tens
// of milliseconds. And the totals are exact. The test counts the work per
// command, not its time, which depends on the machine's load; the time a
// round costs redis-server is BenchmarkCollectUsageRounds's.
func TestCollectUsageReadsABigShardInPages(t *testing.T) {
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
		args = append(args, "g:"+sk, d<<32+a)
		if len(args) == cap(args) || i == keys-1 {
			pipe.HSet(ctx, shard, args...)
			args = make([]any, 0, 2000)
		}
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)

	rounds := collectLogged(ctx, t, srv, epoch, 1, keys, want)
	pages := 0
	for r, round := range rounds {
		require.Len(t, round, 1, "round %d: one shard, one HSCAN", r)
		sc, ok := round[0].(*redis.ScanCmd)
		require.True(t, ok, "round %d: %T", r, round[0])
		assert.Equal(t, []any{"hscan", shard}, sc.Args()[:2], "round %d", r)
		assert.Equal(t, []any{"count", int64(UsageScanCount)}, sc.Args()[3:], "round %d", r)
		page, _ := sc.Val()
		assert.LessOrEqual(t, len(page)/2, 2*UsageScanCount, "round %d: fields of the page", r)
		pages++
	}
	assert.GreaterOrEqual(t, pages, keys/(2*UsageScanCount), "the shard is read in pages")
}
