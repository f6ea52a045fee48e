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

// ScanUsage hands fn every key's total exactly once, on the calling
// goroutine (fn appends to a slice without a lock: the race detector
// fails the test if the reading goroutine called it), with the packed
// layout alone and with split shards of a rolling upgrade, whose fields
// are summed with the packed ones of the same key. A Redis that is gone
// is an error, not a hang.
func TestScanUsageHandsEveryTotalOnce(t *testing.T) {
	srv := redistest.StartServer(t)
	client := srv.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const keys, splitFrom, splitTo, splitShards = 600, 500, 700, 4
	epoch := time.Now().UnixMilli() / 10_000
	type total struct{ demand, admitted int64 }
	packed := map[string]total{}
	counts := make([]UsageCount, 0, keys)
	for i := range keys {
		c := UsageCount{Epoch: epoch, PolicyID: "g", Subject: Subject{Kind: SubjectAPIKey, Value: "key-" + strconv.Itoa(i)}, Demand: int64(i%7 + 2), Admitted: int64(i%5 + 1)}
		counts = append(counts, c)
		packed["g:"+c.Subject.Key()] = total{c.Demand, c.Admitted}
	}
	failed, err := NewRedisUsageSink(client, 0, 10*time.Second, 3).WriteUsage(ctx, counts)
	require.NoError(t, err)
	require.Empty(t, failed)
	// Split-layout fields (an older gateway's), some of keys also in the
	// packed layout, some not.
	withSplit := map[string]total{}
	for k, v := range packed {
		withSplit[k] = v
	}
	pipe := client.Pipeline()
	for i := splitFrom; i < splitTo; i++ {
		f := "g:" + (Subject{Kind: SubjectAPIKey, Value: "key-" + strconv.Itoa(i)}).Key()
		pipe.HSet(ctx, SplitUsageKey(epoch, i%splitShards), "d:"+f, 3, "a:"+f, 1)
		v := withSplit[f]
		withSplit[f] = total{v.demand + 3, v.admitted + 1}
	}
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)

	scan := func(layout UsageLayout) map[string]total {
		var got []UsageTotal
		_, err := ScanUsage(ctx, client, epoch, layout, func(u UsageTotal) { got = append(got, u) })
		require.NoError(t, err)
		out := map[string]total{}
		for _, u := range got {
			k := u.PolicyID + ":" + u.SubjectKey
			require.NotContains(t, out, k, "a key handed twice")
			out[k] = total{u.Demand, u.Admitted}
		}
		return out
	}
	assert.Equal(t, packed, scan(UsageLayout{}))
	assert.Equal(t, withSplit, scan(UsageLayout{SplitShards: splitShards}))

	// No retries: go-redis's would take seconds to give up.
	once := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	defer once.Close()
	srv.Stop()
	_, err = ScanUsage(ctx, once, epoch, UsageLayout{}, func(UsageTotal) {})
	require.ErrorIs(t, err, ErrStoreUnavailable)
}
