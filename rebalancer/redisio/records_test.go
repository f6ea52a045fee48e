package redisio

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/shares"
)

// TestRecordsReadsWhatSinkWrote: on a real redis-server, Records returns
// every share record Sink wrote, with its share and absolute expiry, skips
// deleted ones and other keys.
func TestRecordsReadsWhatSinkWrote(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client()
	exp := time.UnixMilli(time.Now().Add(time.Hour).UnixMilli())
	a := rebalancer.Key{PolicyID: "g", Subject: "k:alpha"}
	b := rebalancer.Key{PolicyID: "g:x", Subject: "u:b%7Dc"}
	gone := rebalancer.Key{PolicyID: "g", Subject: "k:gone"}
	require.NoError(t, NewSink(c, 0).Write(t.Context(), []rebalancer.Update{
		{Key: a, Share: shares.Share{RateMilli: 7000, BurstMilli: 9000}, ExpireAt: exp},
		{Key: b, Share: shares.Share{RateMilli: 1, BurstMilli: 2}, ExpireAt: exp},
		{Key: gone, Share: shares.Share{RateMilli: 1, BurstMilli: 1}, ExpireAt: exp},
		{Key: gone, Delete: true},
	}))
	require.NoError(t, c.Set(t.Context(), "rl:{k:alpha}:g:tb", "x", 0).Err())
	recs, err := NewRecords(c).Records(t.Context())
	require.NoError(t, err)
	assert.ElementsMatch(t, []rebalancer.ShareRecord{
		{Key: a, Share: shares.Share{RateMilli: 7000, BurstMilli: 9000}, ExpireAt: exp},
		{Key: b, Share: shares.Share{RateMilli: 1, BurstMilli: 2}, ExpireAt: exp},
	}, recs)
}
