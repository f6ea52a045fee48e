package redisio_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/dailyquota"
	"github.com/quotientlabs/quotient/dailyquota/redisio"
	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
)

// TestActiveReadsBothUsageLayouts: during a rolling upgrade a key that only
// a gateway of the previous release counted (the split layout) is active
// when the layout names the split shards, so its window's count is still
// replicated; without them only the packed layout's keys are. Keys with
// demand but nothing admitted are not active.
func TestActiveReadsBothUsageLayouts(t *testing.T) {
	client := redistest.StartServer(t).Client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const epoch = 10 * time.Second
	now := time.Now()
	e := now.UnixMilli() / epoch.Milliseconds()
	newKey := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "new"}
	sink := limiter.NewRedisUsageSink(client, 8, epoch, 3)
	failed, err := sink.WriteUsage(ctx, []limiter.UsageCount{
		{Epoch: e, PolicyID: "day", Subject: newKey, Demand: 3, Admitted: 2},
		{Epoch: e, PolicyID: "day", Subject: limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "refused"}, Demand: 5},
	})
	require.NoError(t, err)
	require.Empty(t, failed)
	oldKey := limiter.Subject{Kind: limiter.SubjectAPIKey, Value: "old"}
	require.NoError(t, client.HIncrBy(ctx, limiter.SplitUsageKey(e-1, 0), "a:day:"+oldKey.Key(), 4).Err())
	require.NoError(t, client.HIncrBy(ctx, limiter.SplitUsageKey(e-1, 0), "d:day:"+oldKey.Key(), 4).Err())

	both, err := redisio.NewActiveLayout(client, epoch, limiter.UsageLayout{Shards: 8, SplitShards: 1}).Active(ctx, now)
	require.NoError(t, err)
	assert.ElementsMatch(t, []dailyquota.PolicySubject{
		{Policy: "day", Subject: newKey.Key()}, {Policy: "day", Subject: oldKey.Key()},
	}, both)
	packed, err := redisio.NewActive(client, epoch, 8).Active(ctx, now)
	require.NoError(t, err)
	assert.Equal(t, []dailyquota.PolicySubject{{Policy: "day", Subject: newKey.Key()}}, packed)
}
