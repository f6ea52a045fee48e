package rls

import (
	"context"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
)

const benchConfig = `domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 1000000
  - key: route
    rate_limit:
      unit: minute
      requests_per_unit: 1000000
`

// BenchmarkShouldRateLimit drives the server as issue #13's anchor does:
// 64 concurrent gRPC callers on loopback, two descriptors per request,
// 10,000 keys, one local redis-server, the limiter's production defaults
// (pipelined store with 4 pipelines), with the default 5 ms deadline and
// with 50 ms. It reports
// decisions/s, the p50 and p99 latency seen by the callers, and the share
// of policy decisions the store made within its deadline (store_frac).
func BenchmarkShouldRateLimit(b *testing.B) {
	rs := redistest.StartServer(b)
	for _, deadline := range []time.Duration{5 * time.Millisecond, 50 * time.Millisecond} {
		b.Run("deadline="+deadline.String(), func(b *testing.B) { benchRLS(b, rs, deadline) })
	}
}

func benchRLS(b *testing.B, rs *redistest.Server, deadline time.Duration) {
	require.NoError(b, rs.Client().FlushAll(context.Background()).Err())
	cfg, err := Parse([]File{{Name: "bench.yaml", Data: []byte(benchConfig)}}, ParseOptions{})
	require.NoError(b, err)
	store, err := limiter.NewPipelinedRedisStore(rs.Client(), limiter.DefaultPipelineConfig())
	require.NoError(b, err)
	b.Cleanup(store.Close)
	lcfg := limiter.DefaultConfig()
	lcfg.Store = store
	lcfg.Deadline = deadline
	lcfg.EventSampleRate = -1
	reg := prometheus.NewRegistry()
	lcfg.Metrics = reg
	l, err := limiter.New(lcfg, nil)
	require.NoError(b, err)
	srv, err := NewServer(ServerConfig{Limiter: l, Config: cfg})
	require.NoError(b, err)
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	go func() { _ = gs.Serve(ln) }()
	b.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(b, err)
	b.Cleanup(func() { _ = conn.Close() })
	client := rlsv3.NewRateLimitServiceClient(conn)

	const callers, keys = 64, 10000
	reqs := make([]*rlsv3.RateLimitRequest, keys)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u" + strconv.Itoa(i)}}},
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "route", Value: "r" + strconv.Itoa(i%100)}}},
		}}
	}
	var next atomic.Int64
	lat := make([][]time.Duration, callers)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := next.Add(1)
				if n > int64(b.N) {
					return
				}
				t := time.Now()
				_, err := client.ShouldRateLimit(context.Background(), reqs[n%keys])
				lat[c] = append(lat[c], time.Since(t))
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		return
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99_ms")
	// The share of policy decisions the store made (the rest came from
	// the fallback after a missed deadline, or the deny cache).
	var fromStore, total float64
	mfs, err := reg.Gather()
	require.NoError(b, err)
	for _, mf := range mfs {
		if mf.GetName() != "quotient_limiter_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue()
			total += v
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "source" && lp.GetValue() == "store" {
					fromStore += v
				}
			}
		}
	}
	if total > 0 {
		b.ReportMetric(fromStore/total, "store_frac")
	}
}
