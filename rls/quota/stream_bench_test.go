package quota

import (
	"context"
	"net"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rls"
)

// BenchmarkStreamsWallClock runs the server in real time over real gRPC
// streams on loopback and redis-server: three Envoys report every 250 ms
// (10, 10 and 150 requests/s on a 100/s bucket) for 8 s, the heavy demand
// moving from Envoy 0 to Envoy 1 at 4 s, with --rlqs-ttl 1s and
// --rlqs-in-flight 200ms. It reports the messages the server sent per
// Envoy per second and the time from the shift until Envoy 1 held 90 % of
// its new rate (go test -run '^$' -bench StreamsWallClock ./rls/quota/).
func BenchmarkStreamsWallClock(b *testing.B) {
	rc := redistest.StartServer(b).Client()
	cfg, err := rls.Parse([]rls.File{{Name: "edge.yaml", Data: []byte(testConfig)}}, rls.ParseOptions{})
	require.NoError(b, err)
	for range b.N {
		qcfg := DefaultConfig()
		qcfg.TTL, qcfg.InFlight = time.Second, 200*time.Millisecond
		srv, err := NewServer(ServerConfig{Config: func() *rls.Config { return cfg }, Shares: &RedisShares{Client: rc},
			Usage: limiter.NewRedisUsageSink(rc, 16, 10*time.Second, 3), Quota: qcfg, SkipWarmUp: true})
		require.NoError(b, err)
		gs := grpc.NewServer()
		rlqsv3.RegisterRateLimitQuotaServiceServer(gs, srv)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(b, err)
		go func() { _ = gs.Serve(ln) }()
		ctx, cancel := context.WithCancel(context.Background())
		go srv.Run(ctx)
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(b, err)
		client := rlqsv3.NewRateLimitQuotaServiceClient(conn)
		const n = 3
		type rec struct {
			at   time.Time
			rate int64
		}
		got := make([]chan rec, n)
		streams := make([]rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, n)
		for i := range n {
			got[i] = make(chan rec, 1024)
			streams[i], err = client.StreamRateLimitQuotas(ctx)
			require.NoError(b, err)
			go func(i int) {
				for {
					resp, err := streams[i].Recv()
					if err != nil {
						close(got[i])
						return
					}
					for _, a := range resp.BucketAction {
						got[i] <- rec{time.Now(), rateOf(a).RateMilli}
					}
				}
			}(i)
		}
		start := time.Now()
		shiftAt := start.Add(4 * time.Second)
		end := start.Add(8 * time.Second)
		tick := time.NewTicker(250 * time.Millisecond)
		last := start
		for now := range tick.C {
			if now.After(end) {
				break
			}
			for i := range n {
				d := uint64(10)
				if (i == 0 && now.Before(shiftAt)) || (i == 1 && !now.Before(shiftAt)) {
					d = 150
				}
				el := now.Sub(last)
				require.NoError(b, streams[i].Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
					usage(apiBucket, d*uint64(el.Milliseconds())/1000, 0, el)}}))
			}
			last = now
		}
		tick.Stop()
		elapsed := time.Since(start)
		stopAt := time.Now()
		_ = srv.Shutdown(context.Background())
		cancel()
		gs.Stop()
		_ = conn.Close()
		msgs := 0 // one bucket: one action per message
		shift := time.Duration(-1)
		for i := range n {
			for r := range got[i] {
				if !r.at.Before(stopAt) {
					continue // the TTL-0 goodbye
				}
				msgs++
				if i == 1 && shift < 0 && r.at.After(shiftAt) && r.rate*10 >= 80_000*9 {
					shift = r.at.Sub(shiftAt)
				}
			}
		}
		b.ReportMetric(float64(msgs)/n/elapsed.Seconds(), "msgs/envoy/s")
		b.ReportMetric(shift.Seconds(), "shift-s")
	}
}
