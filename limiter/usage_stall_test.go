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
// exactly what the usage hashes hold when hashes end at, just before and
// just after a page (UsageScanCount) or the listpack limit (128 fields),
// are empty, hold one field, hold wide fields beside packed ones, and when
// rounds end at, before or after UsageScanRoundCommands hashes; on a
// standalone Redis and a cluster (each hash in its own slot).
func TestCollectUsageExactAtScanBoundaries(t *testing.T) {
	// Keys per hash; each key has a packed field and, one key in five, a
	// wide demand field and, one in ten, a wide admitted one.
	sizes := []int{0, 1, 64, 65, 127, 128, 129, UsageScanCount - 1, UsageScanCount, UsageScanCount + 1, 3*UsageScanCount + 7, 10 * UsageScanCount}
	many := func(n, keys int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = keys * (i % 3) // 0, keys, 2*keys, ...
		}
		return out
	}
	layouts := map[string][]int{
		"varied sizes":                      sizes,
		"one hash":                          {3*UsageScanCount + 7},
		"one round of hashes":               many(UsageScanRoundCommands, 0),
		"a round of hashes and one more":    many(UsageScanRoundCommands+1, 1),
		"two rounds of hashes and one less": many(2*UsageScanRoundCommands-1, 1),
		"hashes of a few keys":              many(3*UsageScanRoundCommands+5, 3),
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
						u := UsageTotal{PolicyID: "g", SubjectKey: sk, Demand: int64(7*i + s + 1), Admitted: int64(i % 3)}
						pipe.HSet(ctx, UsageKey(epoch, s), "g:"+sk, u.Demand<<32+u.Admitted)
						if i%5 == 0 {
							pipe.HSet(ctx, UsageKey(epoch, s), "#d:g:"+sk, 1<<40)
							u.Demand += 1 << 40
						}
						if i%10 == 0 {
							pipe.HSet(ctx, UsageKey(epoch, s), "#a:g:"+sk, 1<<33)
							u.Admitted += 1 << 33
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

// TestCollectUsageRoundsAreBounded: collecting 20,000 keys asks
// redis-server for a bounded amount of work per round trip, whether the
// hashes are hashtable-encoded (16 hashes of 1,250 fields, read in pages),
// listpack-encoded (256 hashes of about 78 fields, each read whole) or
// mostly missing (100 keys over the default 16,384 hashes): every
// pipeline round holds at most UsageScanRoundCommands HSCAN commands of
// COUNT UsageScanCount, each page returns at most twice UsageScanCount
// fields (HSCAN returns whole buckets, so a page may hold a few more than
// COUNT) or one listpack-encoded hash (at most 128 fields), and a round
// returns at most twice UsageScanRoundFields fields; so a gateway's
// command waits behind a bounded round. Before the rounds were bounded,
// one round was 16 pages of 250 fields. The test counts the work, not its
// time: what a round costs redis-server in CPU is measured by
// BenchmarkCollectUsageRounds, since a measured time depends on the load
// of the machine that runs the test.
func TestCollectUsageRoundsAreBounded(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	// A round of 400 fields costs redis-server about 0.3 ms
	// (BenchmarkCollectUsageRounds); a round must stay well under 1 ms.
	require.LessOrEqual(t, UsageScanRoundFields, 500, "fields asked for per round")
	// A call on a missing or small hash costs about 1 µs: 256 of them
	// stay well under 1 ms too.
	require.LessOrEqual(t, UsageScanRoundCommands, 256, "commands per round")
	for _, tc := range []struct {
		name         string
		keys, shards int
		minRounds    int
	}{
		{"hashtable", 20_000, 16, 20_000 / (2 * UsageScanRoundFields)},
		{"listpack", 20_000, 256, 20_000 / (2 * UsageScanRoundFields)},
		{"mostly missing", 100, DefaultUsageShards, DefaultUsageShards / UsageScanRoundCommands},
	} {
		t.Run(tc.name, func(t *testing.T) {
			epoch := time.Now().UnixMilli()/10_000 + 1 + int64(tc.shards)
			want := writeUsageKeys(ctx, t, srv.Client(), epoch, tc.keys, tc.shards)
			rounds := collectLogged(ctx, t, srv, epoch, tc.shards, tc.keys, want)
			require.GreaterOrEqual(t, len(rounds), tc.minRounds)
			longestPage, longestRound, scans := 0, 0, 0
			for r, round := range rounds {
				require.NotEmpty(t, round, "round %d", r)
				assert.LessOrEqual(t, len(round), UsageScanRoundCommands, "round %d: HSCAN commands", r)
				fields := 0
				for _, c := range round {
					args := c.Args()
					require.Len(t, args, 5, "round %d: %v", r, args)
					assert.Equal(t, "hscan", args[0], "round %d", r)
					assert.Equal(t, []any{"count", int64(UsageScanCount)}, args[3:], "round %d: %v", r, args)
					sc, ok := c.(*redis.ScanCmd)
					require.True(t, ok, "round %d: %T", r, c)
					page, _ := sc.Val()
					assert.LessOrEqual(t, len(page)/2, max(2*UsageScanCount, 128), "round %d: fields of a page of %v", r, args[1])
					longestPage = max(longestPage, len(page)/2)
					fields += len(page) / 2
					scans++
				}
				assert.LessOrEqual(t, fields, 2*UsageScanRoundFields, "round %d: fields", r)
				longestRound = max(longestRound, fields)
			}
			assert.GreaterOrEqual(t, scans, tc.shards, "every hash read")
			t.Logf("%d rounds; longest page %d fields, longest round %d fields", len(rounds), longestPage, longestRound)
		})
	}
}

// collectLogged collects epoch's usage over shards (the default when 0)
// through a client of its own, so that its hook sees only the collection,
// checks that it returns keys keys whose demand and admitted counts sum
// to want, and returns the pipelines the collection sent.
func collectLogged(ctx context.Context, t *testing.T, srv *redistest.Server, epoch int64, shards, keys int, want int64) [][]redis.Cmder {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true})
	defer client.Close()
	log := &redistest.PipelineLog{}
	client.AddHook(log)
	got, err := CollectUsageTotals(ctx, client, epoch, shards)
	require.NoError(t, err)
	require.Len(t, got, keys)
	var sum int64
	for _, u := range got {
		sum += u.Demand + u.Admitted
	}
	assert.Equal(t, want, sum, "exact totals")
	return log.Rounds()
}

// writeUsageKeys writes one epoch's usage of keys keys through a gateway's
// usage sink, over shards hashes (the default when 0), and returns the sum
// of their demand and admitted counts.
func writeUsageKeys(ctx context.Context, t testing.TB, client redis.UniversalClient, epoch int64, keys, shards int) int64 {
	gw := NewRedisUsageSink(client, shards, 10*time.Second, 3)
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
	return want
}

// BenchmarkCollectUsageRounds: what one round of CollectUsageTotals costs
// redis-server's main thread in CPU time, collecting 100,000 keys (200,000
// fields over the default 16 shards): the median and the longest round
// (the bound is 1 ms; one round of 16 pages of 250 fields, before
// the rounds were bounded, was about 3.1 ms), and the whole collection.
// The CPU time is read from the kernel around each pipeline while the
// server is otherwise idle (redistest.PipelineCPU), so unlike SLOWLOG's
// wall-clock figure it leaves out the time the kernel kept redis-server
// off the CPU; a loaded machine still raises it somewhat (caches, clock
// frequency). Skipped where the kernel has no per-thread scheduler
// statistics (not Linux).
func BenchmarkCollectUsageRounds(b *testing.B) {
	srv := redistest.StartServer(b)
	ctx := b.Context()
	if _, err := srv.MainThreadTimes(ctx); errors.Is(err, redistest.ErrNoSchedStat) {
		b.Skip(err)
	}
	const keys = 100_000
	epoch := time.Now().UnixMilli()/10_000 + 1
	writeUsageKeys(ctx, b, srv.Client(), epoch, keys, 0)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true})
	defer client.Close()
	require.NoError(b, client.Ping(ctx).Err())
	timer := redistest.NewPipelineCPU(ctx, srv)
	client.AddHook(timer)
	for b.Loop() {
		got, err := CollectUsageTotals(ctx, client, epoch, 0)
		require.NoError(b, err)
		require.Len(b, got, keys)
	}
	b.StopTimer()
	require.NoError(b, timer.Err)
	cpu := slices.Clone(timer.Rounds)
	slices.Sort(cpu)
	b.ReportMetric(float64(cpu[len(cpu)/2].Microseconds()), "redis-cpu-µs/round-median")
	b.ReportMetric(float64(cpu[len(cpu)-1].Microseconds()), "redis-cpu-µs/round-max")
	b.ReportMetric(float64(timer.Total().Microseconds())/float64(b.N)/1000, "redis-cpu-ms/collect")
	b.ReportMetric(float64(len(cpu))/float64(b.N), "rounds/collect")
}
