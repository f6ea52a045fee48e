package simulations

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func loadScenario(tb testing.TB, name string) *Scenario {
	tb.Helper()
	data, err := os.ReadFile("scenarios/" + name + ".json")
	require.NoError(tb, err)
	sc, err := ParseScenario(data)
	require.NoError(tb, err)
	return sc
}

// cpuTime is the process's user+system CPU time so far: on a shared
// machine it measures the work, where wall time also measures the
// neighbours.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	require.NoError(tb, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchScenario runs a standard scenario with the default coordinator and
// reports decisions per wall-clock second and per CPU second (run with
// GOMAXPROCS=1 for the one-core figure).
func benchScenario(b *testing.B, name string) {
	sc := loadScenario(b, name)
	var decisions int64
	cpu0 := cpuTime(b)
	for b.Loop() {
		rep, err := Run(context.Background(), sc, Options{})
		require.NoError(b, err)
		decisions += rep.Decisions
	}
	b.ReportMetric(float64(decisions)/b.Elapsed().Seconds(), "decisions/s")
	b.ReportMetric(float64(decisions)/(cpuTime(b)-cpu0).Seconds(), "decisions/cpu-s")
}

// BenchmarkZipf runs the 1,000-key Zipf scenario (600 simulated seconds,
// about 3.1 million decisions). Targets: under 30 s per run, at least 1e6
// decisions per second on one core.
func BenchmarkZipf(b *testing.B) { benchScenario(b, "zipf-many-keys") }

// BenchmarkEvenSpread is one named key in three regions (600 s).
func BenchmarkEvenSpread(b *testing.B) { benchScenario(b, "even-spread") }
