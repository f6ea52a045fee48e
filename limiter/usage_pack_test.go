package limiter

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// TestUsagePackedAndWideFields: a count whose demand and admitted are
// both below 2^18 is one packed field (demand<<32 + admitted), a count at
// 2^18 or more goes to the wide fields, and CollectUsageTotals adds both
// kinds; the hash of a few small keys stays listpack-encoded.
func TestUsagePackedAndWideFields(t *testing.T) {
	client := redistest.StartServer(t).Client()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	epoch := time.Now().UnixMilli()/10_000 + 7
	sink := NewRedisUsageSink(client, 1, 10*time.Second, 3)
	small := Subject{Kind: SubjectAPIKey, Value: "small"}
	big := Subject{Kind: SubjectAPIKey, Value: "big"}
	failed, err := sink.WriteUsage(ctx, []UsageCount{
		{Epoch: epoch, PolicyID: "g", Subject: small, Demand: usagePackIncMax - 1, Admitted: usagePackIncMax - 1},
		{Epoch: epoch, PolicyID: "g", Subject: big, Demand: usagePackIncMax, Admitted: 1},
	})
	require.NoError(t, err)
	require.Empty(t, failed)
	h, err := client.HGetAll(ctx, UsageKey(epoch, 0)).Result()
	require.NoError(t, err)
	assert.Equal(t, map[string]string{
		"g:k:small":  strconv.FormatInt((usagePackIncMax-1)<<32+usagePackIncMax-1, 10),
		"#d:g:k:big": strconv.Itoa(usagePackIncMax),
		"#a:g:k:big": "1",
	}, h)
	enc, err := client.ObjectEncoding(ctx, UsageKey(epoch, 0)).Result()
	require.NoError(t, err)
	assert.Equal(t, "listpack", enc)
	// A later small count of the big key is packed again: only the field
	// near its bounds, or a count too big, goes wide.
	failed, err = sink.WriteUsage(ctx, []UsageCount{{Epoch: epoch, PolicyID: "g", Subject: big, Demand: 2, Admitted: 1}})
	require.NoError(t, err)
	require.Empty(t, failed)
	got, err := CollectUsageTotals(ctx, client, epoch, 1)
	require.NoError(t, err)
	assert.ElementsMatch(t, []UsageTotal{
		{PolicyID: "g", SubjectKey: "k:small", Demand: usagePackIncMax - 1, Admitted: usagePackIncMax - 1},
		{PolicyID: "g", SubjectKey: "k:big", Demand: usagePackIncMax + 2, Admitted: 2},
	}, got)
}

// TestUsagePackingBounds: gateways' sinks (8 of them, taking turns as
// their flushes would) add counts of up to 2^18 to fields that other
// gateways already brought near or past the stop values: 2^30 - 2^22 of
// demand (crossed during the run), 2^31 - 2^24 of demand and 2^32 - 2^24
// of admitted (past the stop: one more packed increment per sink, then
// wide). No write fails, and every total is exact: the demand half never
// passes 2^31 (HINCRBY would refuse past 2^63) and the admitted half
// never carries into the demand half. Without the stop values the same
// writes overflow the packed field: a write fails, or the admitted total
// comes back 2^32 short.
func TestUsagePackingBounds(t *testing.T) {
	client := redistest.StartServer(t).Client()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	epoch := time.Now().UnixMilli()/10_000 + 9
	type start struct{ demand, admitted int64 }
	starts := map[string]start{
		"k:fresh":         {0, 0},
		"k:near-demand":   {1<<30 - 1<<22, 0},
		"k:past-demand":   {1<<31 - 1<<24, 0},
		"k:past-admitted": {1 << 20, 1<<32 - 1<<24},
	}
	want := map[string]UsageTotal{}
	for sk, st := range starts {
		if st.demand != 0 || st.admitted != 0 {
			require.NoError(t, client.HSet(ctx, UsageKey(epoch, usageShard("g", sk, 4)), "g:"+sk, st.demand<<32+st.admitted).Err())
		}
		want[sk] = UsageTotal{PolicyID: "g", SubjectKey: sk, Demand: st.demand, Admitted: st.admitted}
	}
	sinks := make([]*RedisUsageSink, 8)
	for i := range sinks {
		sinks[i] = NewRedisUsageSink(client, 4, 10*time.Second, 3)
	}
	rng := rand.New(rand.NewPCG(15, 60))
	for range 40 {
		for _, sink := range sinks {
			var counts []UsageCount
			for sk := range starts {
				d := rng.Int64N(usagePackIncMax) + usagePackIncMax/2 // 1 in 3 too big to pack
				a := rng.Int64N(d + 1)
				subj, err := ParseSubjectKey(sk)
				require.NoError(t, err)
				counts = append(counts, UsageCount{Epoch: epoch, PolicyID: "g", Subject: subj, Demand: d, Admitted: a})
				w := want[sk]
				w.Demand += d
				w.Admitted += a
				want[sk] = w
			}
			failed, err := sink.WriteUsage(ctx, counts)
			require.NoError(t, err)
			require.Empty(t, failed)
		}
	}
	got, err := CollectUsageTotals(ctx, client, epoch, 4)
	require.NoError(t, err)
	require.Len(t, got, len(want))
	for _, u := range got {
		assert.Equal(t, want[u.SubjectKey], u, u.SubjectKey)
	}
	// The packed halves stayed within their bounds.
	for sk := range starts {
		v, err := client.HGet(ctx, UsageKey(epoch, usageShard("g", sk, 4)), "g:"+sk).Int64()
		require.NoError(t, err)
		assert.Less(t, v>>32, int64(1<<31), "%s: demand half", sk)
		assert.Less(t, v&usagePackMask, int64(1<<32-1<<20), "%s: admitted half, far from carrying", sk)
	}
}

// TestUsagePackedFieldFullGoesWide: a packed field that another writer
// filled to the top of its demand half makes HINCRBY refuse the next
// increment; the count comes back failed, and its retry (and every later
// count of the key in the epoch) is written wide: no demand is lost.
func TestUsagePackedFieldFullGoesWide(t *testing.T) {
	client := redistest.StartServer(t).Client()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	epoch := time.Now().UnixMilli()/10_000 + 11
	key := UsageKey(epoch, 0)
	require.NoError(t, client.HSet(ctx, key, "g:k:full", int64(1<<31-1)<<32).Err())
	sink := NewRedisUsageSink(client, 1, 10*time.Second, 3)
	full := Subject{Kind: SubjectAPIKey, Value: "full"}
	failed, err := sink.WriteUsage(ctx, []UsageCount{{Epoch: epoch, PolicyID: "g", Subject: full, Demand: 3, Admitted: 1}})
	require.ErrorIs(t, err, ErrStoreUnavailable)
	require.Equal(t, []UsageCount{{Epoch: epoch, PolicyID: "g", Subject: full, Demand: 3, Admitted: 1}}, failed)
	failed, err = sink.WriteUsage(ctx, failed)
	require.NoError(t, err)
	require.Empty(t, failed)
	got, err := CollectUsageTotals(ctx, client, epoch, 1)
	require.NoError(t, err)
	assert.Equal(t, []UsageTotal{{PolicyID: "g", SubjectKey: "k:full", Demand: 1<<31 - 1 + 3, Admitted: 1}}, got)
	w, err := client.HMGet(ctx, key, "#d:g:k:full", "#a:g:k:full").Result()
	require.NoError(t, err)
	assert.Equal(t, []any{"3", "1"}, w, "the retry went wide")
}

// TestUsageLongSubjectKeys: a subject key longer than Redis's
// hash-max-listpack-value (64 bytes) turns its hash hashtable-encoded and
// still reads back exactly, beside the listpack-encoded hashes of short
// keys; on a standalone Redis and a cluster.
func TestUsageLongSubjectKeys(t *testing.T) {
	for name, client := range map[string]redis.UniversalClient{
		"standalone": redistest.StartServer(t).Client(),
		"cluster":    redistest.StartCluster(t).Client(),
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			epoch := time.Now().UnixMilli()/10_000 + 13
			const shards = 8
			sink := NewRedisUsageSink(client, shards, 10*time.Second, 3)
			long := Subject{Kind: SubjectAPIKey, Value: string(make([]byte, 100))} // escaped: 300 bytes
			var counts []UsageCount
			for i := range 50 {
				counts = append(counts, UsageCount{Epoch: epoch, PolicyID: "g", Subject: Subject{Kind: SubjectAPIKey, Value: "s" + strconv.Itoa(i)}, Demand: 2, Admitted: 1})
			}
			counts = append(counts, UsageCount{Epoch: epoch, PolicyID: "g", Subject: long, Demand: 5, Admitted: 4})
			failed, err := sink.WriteUsage(ctx, counts)
			require.NoError(t, err)
			require.Empty(t, failed)
			got, err := CollectUsage(ctx, client, epoch, shards)
			require.NoError(t, err)
			require.Len(t, got, 51)
			encodings := map[string]int{}
			for s := range shards {
				enc, err := client.ObjectEncoding(ctx, UsageKey(epoch, s)).Result()
				require.NoError(t, err)
				encodings[enc]++
			}
			assert.Equal(t, map[string]int{"hashtable": 1, "listpack": shards - 1}, encodings)
			for _, u := range got {
				if u.Subject == long {
					assert.Equal(t, UsageCount{Epoch: epoch, PolicyID: "g", Subject: long, Demand: 5, Admitted: 4}, u)
				} else {
					assert.Equal(t, [2]int64{2, 1}, [2]int64{u.Demand, u.Admitted}, u.Subject.Value)
				}
			}
		})
	}
}
