package redisio_test

import (
	"fmt"
	"os"
	"runtime/debug"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/redisio"
)

// BenchmarkSourceUsage: one Source.Usage of an epoch of 100,000 and
// 1,000,000 keys in the packed layout (the default 16,384 hashes), as the
// coordinator reads it every epoch: wall time per read (ns/op), this
// process's CPU (cpu-ms/read), redis-server's (redis-cpu-ms/read) and what
// the read allocates. Between reads the heap is returned to the OS
// (debug.FreeOSMemory, untimed), as the 10 s between a coordinator's
// epochs lets the runtime's scavenger do: memory a read allocates afresh
// is then faulted in again, which is most of what growing its result cost
// (issue 15). The million-key size runs only with QUOTIENT_BENCH_1M=1.
func BenchmarkSourceUsage(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			if n >= 1_000_000 && os.Getenv("QUOTIENT_BENCH_1M") != "1" {
				b.Skip("the million-key read takes a minute to set up: set QUOTIENT_BENCH_1M=1")
			}
			benchSourceUsage(b, n)
		})
	}
}

func benchSourceUsage(b *testing.B, keys int) {
	srv := redistest.StartServer(b)
	ctx := b.Context()
	client := srv.Client()
	const epochLen = 10 * time.Second
	epoch := rebalancer.EpochOf(time.Now(), epochLen)
	gw := limiter.NewRedisUsageSink(client, 0, epochLen, 3)
	counts := make([]limiter.UsageCount, 0, 10_000)
	for i := range keys {
		counts = append(counts, limiter.UsageCount{Epoch: epoch, PolicyID: "g",
			Subject: limiter.Subject{Kind: limiter.SubjectAPIKey, Value: fmt.Sprintf("key-%07d", i)}, Demand: int64(i%7 + 2), Admitted: int64(i%5 + 1)})
		if len(counts) == cap(counts) || i == keys-1 {
			failed, err := gw.WriteUsage(ctx, counts)
			require.NoError(b, err)
			require.Empty(b, failed)
			counts = counts[:0]
		}
	}
	src := redisio.NewSource(client, 0)
	_, err := src.Usage(ctx, epoch) // as every epoch after a coordinator's first
	require.NoError(b, err)
	var cpu, rcpu time.Duration
	for b.Loop() {
		b.StopTimer()
		debug.FreeOSMemory()
		c0, r0 := selfCPU(b), redisCPU(b, srv)
		b.StartTimer()
		got, err := src.Usage(ctx, epoch)
		b.StopTimer()
		cpu += selfCPU(b) - c0
		rcpu += redisCPU(b, srv) - r0
		require.NoError(b, err)
		require.Len(b, got, keys)
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/read")
	b.ReportMetric(float64(rcpu.Microseconds())/1000/float64(b.N), "redis-cpu-ms/read")
}

// selfCPU is this process's CPU time (user and system).
func selfCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	require.NoError(tb, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU is the CPU time of srv's main thread.
func redisCPU(tb testing.TB, srv *redistest.Server) time.Duration {
	t, err := srv.MainThreadTimes(tb.Context())
	if err != nil {
		tb.Skip(err) // no per-thread scheduler statistics here
	}
	return t.CPU
}
