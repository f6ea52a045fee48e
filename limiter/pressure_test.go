package limiter

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// roundTrips counts the commands and pipelines a client sends, but for a
// new connection's set-up (HELLO, CLIENT SETINFO).
type roundTrips struct{ calls, pipelines atomic.Int64 }

func setUp(cmd redis.Cmder) bool { return cmd.Name() == "hello" || cmd.Name() == "client" }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !setUp(cmd) {
			h.calls.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && !setUp(cmds[0]) {
			h.pipelines.Add(1)
		}
		return next(ctx, cmds)
	}
}

func testPressureMarks(t *testing.T, client redis.UniversalClient) {
	clock := wallClock()
	l := usageLimiter(t, clock, nil)
	f := NewUsageFlusher(l, NewRedisUsageSink(client, 8, 10*time.Second, 3), UsageFlusherConfig{})
	ctx := context.Background()
	_, err := l.Check(ctx, Request{Identity: Identity{APIKey: "calm"}, Method: "GET", Path: "/"})
	require.NoError(t, err)
	require.NoError(t, f.Flush(ctx, clock.Now()))
	n, err := client.Exists(ctx, UsagePressureWakeKey).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "a flush that marks nothing wakes nobody")
	woke := func(what string) {
		t.Helper()
		v, err := client.LPop(ctx, UsagePressureWakeKey).Result()
		require.NoError(t, err, what)
		assert.Equal(t, "1", v, what)
	}
	slept := func(what string) {
		t.Helper()
		n, err := client.Exists(ctx, UsagePressureWakeKey).Result()
		require.NoError(t, err)
		assert.Zero(t, n, what)
	}
	hammer(t, l, "busy", "odd {key}") // 3 requests each against burst 2: 1 rejected
	require.NoError(t, f.Flush(ctx, clock.Now()))
	woke("new pressure pushes the wake token")
	hammer(t, l, "busy", "odd {key}") // all 3 rejected now: demand 3 more
	require.NoError(t, f.Flush(ctx, clock.Now()))
	slept("the same keys as the flush before: no wake-up")
	hammer(t, l, "busy")
	require.NoError(t, f.Flush(ctx, clock.Now()))
	woke("odd {key} has no usage in this flush: its traffic left")
	require.NoError(t, f.Flush(ctx, clock.Now()))
	woke("a flush of nothing after busy's marks: the token alone")
	require.NoError(t, f.Flush(ctx, clock.Now()))
	slept("nothing to flush, nothing marked before")
	hammer(t, l, "new")
	require.NoError(t, f.Flush(ctx, clock.Now()))
	hammer(t, l, "new")
	require.NoError(t, f.Flush(ctx, clock.Now()))
	wakes, err := client.LRange(ctx, UsagePressureWakeKey, 0, -1).Result()
	require.NoError(t, err)
	assert.Equal(t, []string{"1"}, wakes, "new woke; the list holds one token")
	wttl, err := client.PTTL(ctx, UsagePressureWakeKey).Result()
	require.NoError(t, err)
	assert.Greater(t, wttl, time.Duration(0))
	assert.LessOrEqual(t, wttl, UsagePressureWakeTTL)

	epoch := clock.Now().UnixMilli() / 10_000
	got, more, err := CollectUsagePressure(ctx, client, epoch, 0)
	require.NoError(t, err)
	assert.False(t, more)
	byKey := map[string]int64{}
	for _, p := range got {
		assert.Equal(t, "g", p.PolicyID)
		byKey[p.SubjectKey] = p.Demand
	}
	assert.Equal(t, map[string]int64{
		Subject{Kind: SubjectAPIKey, Value: "busy"}.Key():      9,
		Subject{Kind: SubjectAPIKey, Value: "odd {key}"}.Key(): 6,
		Subject{Kind: SubjectAPIKey, Value: "new"}.Key():       6,
	}, byKey, "only the keys with rejected cost, with the demand of their pressured flushes; calm (all admitted) is not marked")
	ttl, err := client.PTTL(ctx, UsagePressureKey(epoch)).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, 25*time.Second, "expires as the usage shards: the end of epoch+3")
	assert.LessOrEqual(t, ttl, 40*time.Second)

	// The current epoch's demand of the marked keys, from the usage shards.
	keys := []string{"g:" + Subject{Kind: SubjectAPIKey, Value: "busy"}.Key(), "g:" + Subject{Kind: SubjectAPIKey, Value: "calm"}.Key(), "g:k:never"}
	demand, err := CollectUsageDemand(ctx, client, epoch, 8, keys)
	require.NoError(t, err)
	assert.Equal(t, []int64{9, 1, 0}, demand)
}

func TestPressureMarksStandalone(t *testing.T) {
	testPressureMarks(t, redistest.StartServer(t).Client())
}

func TestPressureMarksCluster(t *testing.T) {
	testPressureMarks(t, redistest.StartCluster(t).Client())
}

// TestPressureMarksCostNoRoundTrip: a flush with pressure marks is still
// one pipeline, as a flush without them.
func TestPressureMarksCostNoRoundTrip(t *testing.T) {
	srv := redistest.StartServer(t)
	client := srv.Client()
	hook := &roundTrips{}
	client.AddHook(hook)
	clock := wallClock()
	l := usageLimiter(t, clock, nil)
	f := NewUsageFlusher(l, NewRedisUsageSink(client, 8, 10*time.Second, 3), UsageFlusherConfig{})
	hammer(t, l, "a", "b", "c")
	require.NoError(t, f.Flush(context.Background(), clock.Now()))
	pipelines, calls := hook.pipelines.Load(), hook.calls.Load()
	assert.Equal(t, int64(1), pipelines, "one pipeline per flush")
	assert.Zero(t, calls, "no command outside it")
	n, err := client.HLen(context.Background(), UsagePressureKey(clock.Now().UnixMilli()/10_000)).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(3), n, "the three keys are marked")
}

// TestPressureMarksAreBounded: a flush marks at most
// DefaultPressureMaxKeys keys, those with the most cost rejected, and a
// reader bounds what it reads.
func TestPressureMarksAreBounded(t *testing.T) {
	srv := redistest.StartServer(t)
	client := srv.Client()
	ctx := context.Background()
	epoch := time.Now().UnixMilli() / 10_000
	var counts []UsageCount
	for i := range DefaultPressureMaxKeys + 100 {
		// Rejected cost i: key 0 rejects nothing, the 100 lowest lose out.
		counts = append(counts, UsageCount{Epoch: epoch, PolicyID: "g", Subject: Subject{Kind: SubjectAPIKey, Value: fmt.Sprint(i)}, Demand: int64(i) + 5, Admitted: 5})
	}
	sink := NewRedisUsageSink(client, 8, 10*time.Second, 3)
	failed, err := sink.WriteUsage(ctx, counts)
	require.NoError(t, err)
	require.Empty(t, failed)
	got, more, err := CollectUsagePressure(ctx, client, epoch, 2*DefaultPressureMaxKeys)
	require.NoError(t, err)
	assert.False(t, more)
	require.Len(t, got, DefaultPressureMaxKeys)
	for _, p := range got {
		var i int64
		_, err := fmt.Sscan(p.SubjectKey[len("k:"):], &i)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, i, int64(100), "%s: the most rejected are marked", p.SubjectKey)
		assert.Equal(t, i+5, p.Demand)
	}
	few, more, err := CollectUsagePressure(ctx, client, epoch, 10)
	require.NoError(t, err)
	assert.True(t, more, "the reader says it stopped at its bound")
	assert.Len(t, few, 10)
}

// TestPressureBadFieldIsReported: a field that does not parse is skipped
// and named; the others are read.
func TestPressureBadFieldIsReported(t *testing.T) {
	srv := redistest.StartServer(t)
	client := srv.Client()
	ctx := context.Background()
	require.NoError(t, client.HSet(ctx, UsagePressureKey(7), "g:k:a", "4", "g:nokind", "1", "g:k:b", "x").Err())
	got, _, err := CollectUsagePressure(ctx, client, 7, 0)
	require.ErrorIs(t, err, ErrBadUsage)
	assert.Contains(t, err.Error(), "2 unparsable fields")
	assert.Equal(t, []UsagePressure{{PolicyID: "g", SubjectKey: "k:a", Demand: 4}}, got)
}
