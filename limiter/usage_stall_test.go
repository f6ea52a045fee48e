package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// TestCollectUsageExactAtScanBoundaries: CollectUsageTotals returns
// exactly what the shard hashes hold when shards end at, just before and
// just after a page (UsageScanCount) or a round (UsageScanPipeline shards),
// are empty, hold one field, or are small enough to be one listpack page;
// with fewer shards than one round and with a last round that is not full;
// on a standalone Redis and a cluster (each shard in its own slot).
func TestCollectUsageExactAtScanBoundaries(t *testing.T) {
	// Keys per shard; each key has a demand field and, for two keys in
	// three, an admitted one.
	sizes := []int{0, 1, 64, 65, UsageScanCount/2 - 1, UsageScanCount / 2, UsageScanCount/2 + 1,
		UsageScanCount - 1, UsageScanCount, UsageScanCount + 1, 3*UsageScanCount + 7, 10 * UsageScanCount}
	layouts := map[string][]int{
		"fewer shards than a round":   sizes[:UsageScanPipeline-1],
		"exactly one round of shards": sizes[len(sizes)-UsageScanPipeline:],
		"last round not full":         sizes,
		"one shard":                   {3*UsageScanCount + 7},
	}
	clients := map[string]redis.UniversalClient{
		"standalone": redistest.StartServer(t).Client(),
		"cluster":    redistest.StartCluster(t).Client(),
	}
	epoch := time.Now().UnixMilli()/1000 + 1000 // an epoch no other subtest uses
	for cname, client := range clients {
		for lname, layout := range layouts {
			epoch++
			t.Run(cname+"/"+lname, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				defer cancel()
				want := map[string]UsageTotal{}
				pipe := client.Pipeline()
				for s, n := range layout {
					for i := range n {
						sk := fmt.Sprintf("k:s%d-%d", s, i)
						u := UsageTotal{PolicyID: "g", SubjectKey: sk, Demand: int64(7*i + s + 1)}
						pipe.HSet(ctx, UsageKey(epoch, s), "d:g:"+sk, u.Demand)
						if i%3 != 0 {
							u.Admitted = int64(i + 1)
							pipe.HSet(ctx, UsageKey(epoch, s), "a:g:"+sk, u.Admitted)
						}
						want[sk] = u
					}
				}
				if len(want) > 0 {
					_, err := pipe.Exec(ctx)
					require.NoError(t, err)
				}
				got, err := CollectUsageTotals(ctx, client, epoch, len(layout))
				require.NoError(t, err)
				require.Len(t, got, len(want))
				for _, u := range got {
					assert.Equal(t, want[u.SubjectKey], u, u.SubjectKey)
				}
			})
		}
	}
}

// TestCollectUsageRoundsStayShort: collecting 100,000 keys (200,000
// fields over the default 16 shards, 12,500 each) never holds
// redis-server for 1 ms: no pipeline round of CollectUsageTotals costs
// redis-server's main thread 1 ms of CPU or more, so no command in it
// does either (SLOWLOG's figure, without the descheduling), and a
// gateway's command waits behind at most one round. Before the rounds
// were bounded, one round was 16 pages of 250 fields, about 2.8 ms.
//
// Why CPU and not SLOWLOG: SLOWLOG times a command by the wall clock, so
// on this shared machine any command the kernel preempts shows up at
// several milliseconds however little it does (the 100k-key benchmark
// logged 97 share-writing scripts over 1 ms, up to 30 ms, at load average
// 8 to 10). The CPU time of the thread that runs the commands, read from
// the kernel while redis-server is idle before and after each round with
// no other client, is the run time SLOWLOG would show on an idle machine,
// and it does not depend on the load. The bound (1 ms, the issue's
// threshold) is about three times what a round measures (some 0.3 ms), so
// a slower CPU passes and a round of 16 pages fails. The test logs
// SLOWLOG's entries of 1 ms or more and how often the kernel preempted
// redis-server, for comparison; it does not assert on them.
func TestCollectUsageRoundsStayShort(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	if _, err := srv.MainThreadTimes(ctx); errors.Is(err, redistest.ErrNoSchedStat) {
		t.Skip(err)
	}
	const keys = 100_000
	epoch := time.Now().UnixMilli()/10_000 + 1
	gw := NewRedisUsageSink(srv.Client(), 0, 10*time.Second, 3)
	var want int64
	counts := make([]UsageCount, 0, 10_000)
	for i := range keys {
		c := UsageCount{Epoch: epoch, PolicyID: "g", Subject: Subject{Kind: SubjectAPIKey, Value: "key-" + strconv.Itoa(i)}, Demand: int64(i%7 + 1), Admitted: int64(i%5 + 1)}
		want += c.Demand + c.Admitted
		counts = append(counts, c)
		if len(counts) == cap(counts) || i == keys-1 {
			failed, err := gw.WriteUsage(ctx, counts)
			require.NoError(t, err)
			require.Empty(t, failed)
			counts = counts[:0]
		}
	}

	// A client of its own, so that the hook sees only the collection.
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true})
	defer client.Close()
	require.NoError(t, client.ConfigSet(ctx, "slowlog-log-slower-than", "1000").Err())
	require.NoError(t, client.SlowLogReset(ctx).Err())
	timer := redistest.NewPipelineCPU(ctx, srv)
	client.AddHook(timer)
	got, err := CollectUsageTotals(ctx, client, epoch, 0)
	require.NoError(t, err)
	require.NoError(t, timer.Err)
	slow, err := client.SlowLogGet(ctx, -1).Result()
	require.NoError(t, err)

	require.Len(t, got, keys)
	var sum int64
	for _, u := range got {
		sum += u.Demand + u.Admitted
	}
	assert.Equal(t, want, sum, "exact totals")
	require.NotEmpty(t, timer.Rounds)
	cpu := slices.Clone(timer.Rounds)
	slices.Sort(cpu)
	var total time.Duration
	for _, d := range cpu {
		total += d
	}
	t.Logf("%d rounds: redis-server CPU per round median %v, longest %v, total %v; preempted %d times; %d SLOWLOG entries of 1 ms or more",
		len(cpu), cpu[len(cpu)/2], cpu[len(cpu)-1], total, timer.Preempted, len(slow))
	for _, e := range slow {
		t.Logf("SLOWLOG %v %q", e.Duration, e.Args)
	}
	assert.Less(t, cpu[len(cpu)-1], time.Millisecond, "the longest round's redis-server CPU time")
}
