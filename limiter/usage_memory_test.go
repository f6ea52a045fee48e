package limiter

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// BenchmarkUsageMemoryPerKey measures what one usage count costs a gateway
// in memory, for the documentation of Config.UsageMaxKeys: the live heap
// per key that the counter holds (map entry and subject string, a 16-byte
// API key), and the extra heap a flush takes while it turns the counts into
// the sorted slice it writes. Each iteration counts 1<<18 distinct keys.
func BenchmarkUsageMemoryPerKey(b *testing.B) {
	const n = 1 << 18
	values := make([]string, n)
	for i := range values {
		values[i] = fmt.Sprintf("key-%011d", i) // 16 bytes
	}
	now := time.Unix(1_700_000_000, 0)
	var held, flush float64
	for b.Loop() {
		u := newUsageCounter(10*time.Second, 1<<20)
		base := heapAlloc()
		for _, v := range values {
			// Each request brings its own subject string, which the count keeps.
			u.add(now, "g", Subject{Kind: SubjectAPIKey, Value: string([]byte(v))}, 1, 1)
		}
		afterAdd := heapAlloc()
		counts := u.take()
		afterTake := heapAlloc()
		held += float64(afterAdd-base) / n
		flush += float64(afterTake-base) / n
		runtime.KeepAlive(counts)
		runtime.KeepAlive(u)
	}
	b.ReportMetric(held/float64(b.N), "held-B/key")
	b.ReportMetric(flush/float64(b.N), "flush-B/key")
}

func heapAlloc() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
