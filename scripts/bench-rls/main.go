// Command bench-rls is the load of scripts/bench-rls.sh: concurrent gRPC
// callers of envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
// against one server (envoyproxy/ratelimit or quotient rls), two
// descriptors per request over a fixed key space, for a fixed time after a
// warm-up. It prints one line: decisions/s (answered requests per second),
// p50 and p99 latency as the callers saw it, and the answers by code. A
// failed call is counted and printed, not retried. Over the measured window
// it also reports where the CPU went, in µs per decision: the server's
// (--server-pid, from /proc), its own, and redis-server's (--redis, from
// INFO cpu), and the commands Redis ran per decision with their µs (INFO
// commandstats, scripts' inner commands included).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	addr := flag.String("addr", "", "gRPC address of the rate limit service (required)")
	name := flag.String("name", "server", "name printed with the result")
	callers := flag.Int("callers", 64, "concurrent callers (each on the shared connection pool)")
	conns := flag.Int("conns", 4, "gRPC connections the callers share")
	keys := flag.Int("keys", 10000, "distinct user values; the route descriptor takes keys/100 values")
	warmup := flag.Duration("warmup", 2*time.Second, "load before measuring")
	duration := flag.Duration("duration", 10*time.Second, "measured load")
	timeout := flag.Duration("timeout", time.Second, "deadline of every call")
	serverPID := flag.Int("server-pid", 0, "pid of the server under test, for its CPU per decision (0: not reported)")
	redisAddr := flag.String("redis", "", "redis-server address, for its CPU and commands per decision (empty: not reported)")
	flag.Parse()
	if *addr == "" || *callers < 1 || *conns < 1 || *keys < 100 || *duration <= 0 {
		fmt.Fprintln(os.Stderr, "bench-rls: want --addr, --callers >= 1, --conns >= 1, --keys >= 100, --duration > 0")
		os.Exit(2)
	}
	clients := make([]rlsv3.RateLimitServiceClient, *conns)
	for i := range clients {
		conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench-rls:", err)
			os.Exit(1)
		}
		defer conn.Close()
		clients[i] = rlsv3.NewRateLimitServiceClient(conn)
	}
	reqs := make([]*rlsv3.RateLimitRequest, *keys)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u" + strconv.Itoa(i)}}},
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "route", Value: "r" + strconv.Itoa(i%(*keys/100))}}},
		}}
	}

	var measuring atomic.Bool
	var ok, over, failed atomic.Int64
	var firstErr atomic.Value
	lat := make([][]time.Duration, *callers)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range *callers {
		wg.Go(func() {
			client := clients[c%len(clients)]
			for n := c; ; n += *callers {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), *timeout)
				t := time.Now()
				resp, err := client.ShouldRateLimit(ctx, reqs[n%len(reqs)])
				d := time.Since(t)
				cancel()
				if !measuring.Load() {
					continue
				}
				switch {
				case err != nil:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				case resp.OverallCode == rlsv3.RateLimitResponse_OK:
					ok.Add(1)
				default:
					over.Add(1)
				}
				lat[c] = append(lat[c], d)
			}
		})
	}
	time.Sleep(*warmup)
	before := sample(*serverPID, *redisAddr)
	measuring.Store(true)
	start := time.Now()
	time.Sleep(*duration)
	measuring.Store(false)
	elapsed := time.Since(start)
	after := sample(*serverPID, *redisAddr)
	close(stop)
	wg.Wait()

	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		fmt.Printf("%s: no answer in %v (failed %d: %v)\n", *name, elapsed, failed.Load(), firstErr.Load())
		os.Exit(1)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	fmt.Printf("%s decisions/s=%.0f p50_ms=%.2f p99_ms=%.2f ok=%d over_limit=%d failed=%d %s\n", *name,
		float64(len(all))/elapsed.Seconds(), ms(all[len(all)/2]), ms(all[len(all)*99/100]), ok.Load(), over.Load(), failed.Load(),
		after.per(before, float64(len(all))))
	if e := firstErr.Load(); e != nil {
		fmt.Fprintf(os.Stderr, "%s: first failure: %v\n", *name, e)
	}
}
