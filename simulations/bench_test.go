package simulations

import (
	"context"
	"os"
	"testing"

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

// BenchmarkZipf runs the 1,000-key Zipf scenario (600 simulated seconds,
// about 3.1 million decisions) and reports decisions per wall-clock second.
// Target: under 30 s per run, at least 1e6 decisions/s.
func BenchmarkZipf(b *testing.B) {
	sc := loadScenario(b, "zipf-many-keys")
	var decisions int64
	b.ResetTimer()
	for b.Loop() {
		rep, err := Run(context.Background(), sc, Options{})
		require.NoError(b, err)
		decisions += rep.Decisions
	}
	b.ReportMetric(float64(decisions)/b.Elapsed().Seconds(), "decisions/s")
}

// BenchmarkEvenSpread is one named key in three regions (600 s).
func BenchmarkEvenSpread(b *testing.B) {
	sc := loadScenario(b, "even-spread")
	var decisions int64
	for b.Loop() {
		rep, err := Run(context.Background(), sc, Options{})
		require.NoError(b, err)
		decisions += rep.Decisions
	}
	b.ReportMetric(float64(decisions)/b.Elapsed().Seconds(), "decisions/s")
}
