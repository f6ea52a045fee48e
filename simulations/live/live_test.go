package live_test

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/simulations"
	"github.com/quotientlabs/quotient/simulations/live"
)

// The comparison the live mode must pass against virtual time (issue 5),
// for every tracked key and policy, against the virtual-time run of the
// same (rate-scaled) scenario: every window's error, the worst
// over-admission, the worst under-service and the mean absolute window
// error are each within tolerance (5 points of the window allowance).
const tolerance = 0.05

// The scales of the end-to-end runs (timeScale, rateScale) are in
// scales_race_test.go and scales_norace_test.go: the race detector slows
// the in-process coordinators, Kafka clients and gateways several times,
// so a race build runs at half the time scale and half the requests.

func loadScenario(t *testing.T, name string) *simulations.Scenario {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "scenarios", name+".json"))
	require.NoError(t, err)
	sc, err := simulations.ParseScenario(data)
	require.NoError(t, err)
	return sc
}

// startInfra starts one kfake broker and one redis-server per region.
func startInfra(t *testing.T, regions []string) live.Config {
	t.Helper()
	cfg := live.DefaultConfig()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	cfg.KafkaBrokers = kc.ListenAddrs()
	cfg.RedisAddrs = map[string]string{}
	for _, r := range regions {
		cfg.RedisAddrs[r] = redistest.StartServer(t).Addr()
	}
	return cfg
}

func TestLiveMatchesVirtual(t *testing.T) {
	if testing.Short() {
		t.Skip("runs scenarios in scaled real time, about 75 s; not in -short")
	}
	for _, name := range liveScenarios {
		t.Run(name, func(t *testing.T) {
			sc, err := live.ScaleRates(loadScenario(t, name), rateScale)
			require.NoError(t, err)
			virtual, err := simulations.Run(t.Context(), sc, simulations.Options{})
			require.NoError(t, err)

			cfg := startInfra(t, sc.Regions)
			cfg.TimeScale = timeScale
			rep, st, err := live.Run(t.Context(), sc, cfg)
			require.NoError(t, err)
			// With -artifacts, both runs' outputs stay for a look.
			require.NoError(t, virtual.WriteFiles(filepath.Join(t.ArtifactDir(), "virtual")))
			require.NoError(t, rep.WriteFiles(filepath.Join(t.ArtifactDir(), "live")))
			t.Logf("live: %d requests in %v, fallback %d, deny cache %d, max lateness %v, late %d",
				st.Requests, rep.Wall.Round(time.Millisecond), st.Fallback, st.DenyCache, st.MaxLateness, st.Late)
			for r, cs := range st.CoordinatorStats {
				t.Logf("coordinator %s: %+v", r, cs)
			}
			assert.Equal(t, virtual.Decisions, rep.Decisions, "same schedule, same requests")
			assert.Equal(t, virtual.Decisions, st.Requests)
			require.Len(t, rep.Keys, len(virtual.Keys))
			faithful, why := st.Faithful()
			for i, v := range virtual.Keys {
				l := rep.Keys[i]
				require.Equal(t, v.Key, l.Key)
				t.Logf("%s/%s: virtual over %.3f under %.3f mean |e| %.3f; live over %.3f under %.3f mean |e| %.3f",
					v.Key, v.Policy, v.MaxOver, v.MaxUnder, v.MeanAbsError, l.MaxOver, l.MaxUnder, l.MeanAbsError)
				ve, le := virtual.WindowErrors(i), rep.WindowErrors(i)
				worst := 0.0
				for w := range ve {
					worst = math.Max(worst, math.Abs(ve[w]-le[w]))
				}
				t.Logf("window errors virtual %.3f", ve)
				t.Logf("window errors live    %.3f (largest difference %.3f)", le, worst)
				if !faithful {
					continue
				}
				for w := range ve {
					assert.InDelta(t, ve[w], le[w], tolerance, "window %d (from %d s)", w, virtual.WindowStarts()[w])
				}
				assert.InDelta(t, v.MaxOver, l.MaxOver, tolerance, "worst over-admission")
				assert.InDelta(t, v.MaxUnder, l.MaxUnder, tolerance, "worst under-service")
				assert.InDelta(t, v.MeanAbsError, l.MeanAbsError, tolerance, "mean absolute error")
			}
			for r, s := range st.Coordinators {
				assert.Zero(t, s.Unwritten, "region %s: share updates written", r)
				assert.False(t, s.LastDecision.IsZero(), "region %s decided", r)
			}
			if !faithful {
				// Real time on a shared machine: a run that could not keep
				// its schedule measures the machine, not Quotient.
				t.Skipf("the machine did not keep the real-time schedule (%s); accuracy not compared", why)
			}
		})
	}
}
