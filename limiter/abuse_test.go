package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// BenchmarkAbusiveKey: one key hammering after its rejection, against a
// real redis-server, in the same run: ns/op is the deny-cache path;
// store-ns/op is the same rejected request decided by Redis every time
// (deny cache off); speedup is their ratio (target >= 10).
func BenchmarkAbusiveKey(b *testing.B) {
	srv := redistest.StartServer(b)
	policies := mustPolicies(b, `[{"id":"tb","algorithm":"token_bucket","rate_per_sec":0.001,"burst":1}]`)
	req := Request{Identity: Identity{APIKey: "abuser"}, Method: "GET", Path: "/v1/x"}
	ctx := context.Background()
	mk := func(denyKeys int) *Limiter {
		l, err := New(Config{Store: NewRedisStore(srv.Client()), DenyCacheMaxKeys: denyKeys, Deadline: time.Second, EventSampleRate: -1}, policies)
		require.NoError(b, err)
		return l
	}
	storeL, cacheL := mk(-1), mk(0)
	var d Decision
	for range 2 {
		require.NoError(b, storeL.CheckInto(ctx, storeL.Now(), req, &d))
		require.NoError(b, cacheL.CheckInto(ctx, cacheL.Now(), req, &d))
	}
	require.False(b, d.Allowed)

	const storeOps = 2000
	start := time.Now()
	for range storeOps {
		require.NoError(b, storeL.CheckInto(ctx, storeL.Now(), req, &d))
	}
	require.Equal(b, SourceStore, d.Source)
	storeNs := float64(time.Since(start).Nanoseconds()) / storeOps

	b.ReportAllocs()
	b.ResetTimer()
	start = time.Now()
	for b.Loop() {
		_ = cacheL.CheckInto(ctx, cacheL.Now(), req, &d)
	}
	cacheNs := float64(time.Since(start).Nanoseconds()) / float64(b.N)
	b.StopTimer()
	require.Equal(b, SourceDenyCache, d.Source)
	b.ReportMetric(storeNs, "store-ns/op")
	b.ReportMetric(storeNs/cacheNs, "speedup")
}
