package redisio

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/shares"
)

// TestSinkCallsStayShort: one script call of the Sink costs redis-server
// well under a millisecond, and splitting the records into calls of
// DefaultKeysPerCall costs little more per record than calls of 200 did.
// Each pipeline holds one call (batch = the records per call) and
// redistest.PipelineCPU reads the CPU time of redis-server's main thread
// around it, which is what SLOWLOG would log on an idle machine:
// SLOWLOG's wall-clock figure on this shared machine adds whatever time
// the kernel kept redis-server off the CPU (1 to 30 ms for share-writing
// calls at load average 8 to 10, whatever their size). No call may take
// 1 ms (the bound), and the median call must stay under half of
// it, because a record costs up to twice as much at a million keys (a
// larger keyspace) as in this test's 20,000: calls of 200 records take
// about 0.7 ms here (so they fail it) and took 1.2 to 1.6 ms at a
// million. (A call's figure includes reading and answering its pipeline
// and, now and then, redis-server's own periodic work, such as expiring
// keys: up to some 0.35 ms for calls of 32 records, whose median is about
// 0.15 ms.) The per-record cost is compared side by
// side: the same 20,000 records rewritten in calls of 200 and of
// DefaultKeysPerCall, in pipelines of DefaultBatchSize records as the
// driver writes them, twice each, taking turns.
func TestSinkCallsStayShort(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if _, err := srv.MainThreadTimes(ctx); errors.Is(err, redistest.ErrNoSchedStat) {
		t.Skip(err)
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true})
	defer client.Close()
	const n = 20_000
	exp := time.Now().Add(time.Hour)
	ups := make([]rebalancer.Update, n)
	for i := range ups {
		ups[i] = rebalancer.Update{Key: rebalancer.Key{PolicyID: "g", Subject: "k:key-" + strconv.Itoa(i)},
			Share: shares.Share{RateMilli: int64(i + 1), BurstMilli: 5}, ExpireAt: exp}
	}
	// The records exist: the timed writes overwrite them, as every epoch does.
	require.NoError(t, NewSink(client, 0).Write(ctx, ups))
	write := func(perCall, batch int) *redistest.PipelineCPU {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true})
		defer c.Close()
		sink := NewSink(c, batch)
		sink.perCall = perCall
		for i := range ups {
			ups[i].Share.RateMilli++
		}
		require.NoError(t, c.Ping(ctx).Err())            // connect first: go-redis pipelines the connection's setup
		require.NoError(t, setShares.Load(ctx, c).Err()) // and the script
		sink.loaded.Store(true)
		timer := redistest.NewPipelineCPU(ctx, srv)
		c.AddHook(timer)
		require.NoError(t, sink.Write(ctx, ups))
		require.NoError(t, timer.Err)
		require.Len(t, timer.Rounds, (n+batch-1)/batch)
		return timer
	}
	var old, now time.Duration
	var calls []time.Duration
	for range 2 {
		// Calls one per pipeline, for the time of a call.
		timer := write(DefaultKeysPerCall, DefaultKeysPerCall)
		calls = append(calls, timer.Rounds...)
		t.Logf("%d calls of %d records: redis-server CPU longest %v, %v per record; preempted %d times",
			len(timer.Rounds), DefaultKeysPerCall, timer.Longest(), timer.Total()/n, timer.Preempted)
		// Pipelines of DefaultBatchSize records, as the driver writes,
		// for the cost per record.
		old += write(200, DefaultBatchSize).Total()
		now += write(DefaultKeysPerCall, DefaultBatchSize).Total()
	}
	t.Logf("per record: %v in calls of 200, %v in calls of %d (%.2fx)", old/(2*n), now/(2*n), DefaultKeysPerCall, float64(now)/float64(old))
	slices.Sort(calls)
	t.Logf("a call of %d records: median %v, longest %v", DefaultKeysPerCall, calls[len(calls)/2], calls[len(calls)-1])
	assert.Less(t, calls[len(calls)/2], 500*time.Microsecond, "the median call's redis-server CPU time")
	assert.Less(t, calls[len(calls)-1], time.Millisecond, "the longest call's redis-server CPU time")
	assert.Less(t, float64(now)/float64(old), 1.25, "redis-server CPU per record, against calls of 200")
}
