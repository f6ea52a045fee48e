package quota

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
)

// RedisShares reads the records the coordinator's writer (the limiter's
// SetShare) writes, on a standalone server and across the slots of a
// three-node cluster, reports missing records as not found, and names a
// record that holds something else.
func TestRedisShares(t *testing.T) {
	for _, b := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"standalone", func(t *testing.T) redis.UniversalClient { return redistest.StartServer(t).Client() }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t).Client() }},
	} {
		t.Run(b.name, func(t *testing.T) {
			rc := b.client(t)
			ctx := context.Background()
			store := limiter.NewRedisStore(rc)
			var qs []ShareQuery
			for i := range 20 {
				q := ShareQuery{Subject: limiter.Subject{Kind: limiter.SubjectDescriptor, Value: fmt.Sprintf("edge/path=%%2Fp%d", i)}, PolicyID: "edge.path"}
				qs = append(qs, q)
				if i%2 == 0 {
					require.NoError(t, store.SetShare(ctx, q.Subject, q.PolicyID, int64(1000*i), int64(500*i), time.Minute))
				}
			}
			got, err := (&RedisShares{Client: rc}).ReadShares(ctx, qs)
			require.NoError(t, err)
			require.Len(t, got, len(qs))
			for i, r := range got {
				if i%2 == 0 {
					assert.Equal(t, ShareRecord{Found: true, Amount: Amount{RateMilli: int64(1000 * i), BurstMilli: int64(500 * i)}}, r, "%d", i)
				} else {
					assert.False(t, r.Found, "%d", i)
				}
			}
			require.NoError(t, rc.HSet(ctx, limiter.ShareKey(qs[1].Subject, qs[1].PolicyID), "r", "x", "b", "1").Err())
			got, err = (&RedisShares{Client: rc}).ReadShares(ctx, qs[:2])
			require.ErrorContains(t, err, `holds r="x" b="1", not milli units`)
			assert.True(t, got[0].Found)
			assert.False(t, got[1].Found)
		})
	}
}
