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

// TestSinkCallsAreBounded: the Sink asks redis-server for a bounded
// amount of work per script call and per pipeline: every call writes at
// most DefaultKeysPerCall records (a call of 200 took 1.2 to 1.6 ms at a
// million keys, past the 1 ms no command of the coordinator may reach) and
// every pipeline holds the calls of at most the Sink's batch of records,
// and every record is written. The test counts the work, not its time,
// which depends on the machine's load: what a call costs redis-server in
// CPU, against calls of 200 side by side, is BenchmarkSinkCalls's.
func TestSinkCallsAreBounded(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	// A record costs redis-server up to about 7 µs inside the script at a
	// million keys (BenchmarkSinkCalls measures 3 to 3.5 µs at 20,000), so
	// a call stays well under 1 ms only up to some 70 records.
	require.LessOrEqual(t, DefaultKeysPerCall, 64, "records per call")
	const n, batch = 20_000, 3_000
	ups := sinkUpdates(n)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true})
	defer client.Close()
	log := &redistest.PipelineLog{}
	client.AddHook(log)
	require.NoError(t, NewSink(client, batch).Write(ctx, ups))

	rounds := log.Rounds()
	require.Len(t, rounds, (n+batch-1)/batch, "one pipeline per batch (one writer, the default)")
	records := 0
	for r, round := range rounds {
		inRound := 0
		for _, c := range round {
			args := c.Args()
			require.GreaterOrEqual(t, len(args), 3, "round %d: %v", r, args)
			require.Equal(t, "evalsha", args[0], "round %d", r)
			keys, ok := args[2].(int)
			require.True(t, ok, "round %d: numkeys %T", r, args[2])
			assert.LessOrEqual(t, keys, DefaultKeysPerCall, "round %d: records of a call", r)
			assert.Len(t, args, 3+4*keys, "round %d: a key and three arguments per record", r)
			require.NoError(t, c.Err(), "round %d", r)
			inRound += keys
		}
		assert.LessOrEqual(t, inRound, batch, "round %d: records of a pipeline", r)
		assert.LessOrEqual(t, len(round), (batch+DefaultKeysPerCall-1)/DefaultKeysPerCall, "round %d: calls of a pipeline", r)
		records += inRound
	}
	assert.Equal(t, n, records, "every record in exactly one call")

	pipe := client.Pipeline()
	cmds := make([]*redis.StringCmd, n)
	for i, u := range ups {
		key, err := ShareKey(u.Key)
		require.NoError(t, err)
		cmds[i] = pipe.HGet(ctx, key, "r")
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	for i, c := range cmds {
		require.Equal(t, strconv.FormatInt(ups[i].Share.RateMilli, 10), c.Val(), "record %d", i)
	}
}

// sinkUpdates returns n share updates of distinct keys of policy "g",
// expiring in an hour.
func sinkUpdates(n int) []rebalancer.Update {
	exp := time.Now().Add(time.Hour)
	ups := make([]rebalancer.Update, n)
	for i := range ups {
		ups[i] = rebalancer.Update{Key: rebalancer.Key{PolicyID: "g", Subject: "k:key-" + strconv.Itoa(i)},
			Share: shares.Share{RateMilli: int64(i + 1), BurstMilli: 5}, ExpireAt: exp}
	}
	return ups
}

// BenchmarkSinkCalls: what one script call of the Sink costs redis-server's
// main thread in CPU time (median and longest call of DefaultKeysPerCall
// records, one call per pipeline; the bound is 1 ms, and a record
// costs up to twice as much at a million keys as in these 20,000), and the
// CPU per record in calls of DefaultKeysPerCall against calls of 200,
// side by side in pipelines of DefaultBatchSize records as the driver
// writes them, taking turns. The records exist before: each write
// overwrites them, as every epoch does. The CPU time is read from the
// kernel around each pipeline while the server is otherwise idle
// (redistest.PipelineCPU), so it leaves out the time the kernel kept
// redis-server off the CPU, which SLOWLOG's wall-clock figure includes.
// Skipped where the kernel has no per-thread scheduler statistics.
func BenchmarkSinkCalls(b *testing.B) {
	srv := redistest.StartServer(b)
	ctx := b.Context()
	if _, err := srv.MainThreadTimes(ctx); errors.Is(err, redistest.ErrNoSchedStat) {
		b.Skip(err)
	}
	const n = 20_000
	ups := sinkUpdates(n)
	require.NoError(b, NewSink(srv.Client(), 0).Write(ctx, ups))
	write := func(perCall, batch int) *redistest.PipelineCPU {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true})
		defer c.Close()
		sink := NewSink(c, batch)
		sink.perCall = perCall
		for i := range ups {
			ups[i].Share.RateMilli++
		}
		require.NoError(b, c.Ping(ctx).Err())            // connect first: go-redis pipelines the connection's setup
		require.NoError(b, setShares.Load(ctx, c).Err()) // and the script
		sink.loaded.Store(true)
		timer := redistest.NewPipelineCPU(ctx, srv)
		c.AddHook(timer)
		require.NoError(b, sink.Write(ctx, ups))
		require.NoError(b, timer.Err)
		require.Len(b, timer.Rounds, (n+batch-1)/batch)
		return timer
	}
	var old, now time.Duration
	var calls []time.Duration
	for b.Loop() {
		calls = append(calls, write(DefaultKeysPerCall, DefaultKeysPerCall).Rounds...)
		old += write(200, DefaultBatchSize).Total()
		now += write(DefaultKeysPerCall, DefaultBatchSize).Total()
	}
	slices.Sort(calls)
	b.ReportMetric(float64(calls[len(calls)/2].Microseconds()), "redis-cpu-µs/call-median")
	b.ReportMetric(float64(calls[len(calls)-1].Microseconds()), "redis-cpu-µs/call-max")
	b.ReportMetric(float64(now.Nanoseconds())/float64(b.N*n), "redis-cpu-ns/record")
	b.ReportMetric(float64(now)/float64(old), "x-cpu/record-vs-calls-of-200")
}
