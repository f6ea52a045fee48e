package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"
)

// loadProbe measures how much CPU this test process was denied over an
// interval, to say why a store call missed its deadline: the Go
// scheduler's latency (runnable goroutine to running, runtime/metrics)
// and the time the process's threads waited on the kernel's run queues
// (/proc/self/task/*/schedstat; Linux). The gateway runs in this process.
type loadProbe struct {
	hist  *metrics.Float64Histogram
	runq  time.Duration
	start time.Time
}

func startLoadProbe() *loadProbe {
	return &loadProbe{hist: schedLatencies(), runq: runqWait(), start: time.Now()}
}

// stop summarises the interval.
func (p *loadProbe) stop() string {
	h, runq, wall := schedLatencies(), runqWait(), time.Since(p.start)
	var n, over uint64
	maxS := 0.0
	for i := range h.Counts {
		d := h.Counts[i] - p.hist.Counts[i]
		n += d
		if d > 0 {
			maxS = h.Buckets[i+1]
			if h.Buckets[i] >= 0.005 {
				over += d
			}
		}
	}
	load := ""
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Fields(string(b))[0]
	}
	return fmt.Sprintf("machine: load %s, goroutine scheduling latency max <= %.3g ms (%d of %d waits >= 5 ms), threads waited %v on run queues over %v",
		load, maxS*1000, over, n, (runq - p.runq).Round(time.Millisecond), wall.Round(time.Millisecond))
}

func schedLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	return s[0].Value.Float64Histogram()
}

// runqWait is the time this process's threads have waited on a run queue.
func runqWait() time.Duration {
	var tot int64
	files, _ := filepath.Glob("/proc/self/task/*/schedstat")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended
		}
		if fs := strings.Fields(string(b)); len(fs) >= 2 {
			v, _ := strconv.ParseInt(fs[1], 10, 64)
			tot += v
		}
	}
	return time.Duration(tot)
}
