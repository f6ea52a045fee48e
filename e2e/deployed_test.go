package e2e

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/netlab"
	"github.com/quotientlabs/quotient/simulations"
	"github.com/quotientlabs/quotient/simulations/deployed"
	"github.com/quotientlabs/quotient/simulations/live"
)

// The short deployed suite's scenario and scaling: abrupt-shift cut to
// its first 420 s (the shift at 300 s, its window and the one after it;
// the 300 s after those are steady state, which the virtual suite and
// make simulate-deployed cover) and time compressed 5 x (84 s of real
// time instead of 144 s: make test's time), rates divided by 5 (so the
// real request and policy rates are the scenario's own).
const (
	deployedScenario  = "abrupt-shift"
	deployedDuration  = 420 // s of the scenario's 720
	deployedTimeScale = 5
	deployedRateScale = 5
	deployedMaxDiff   = 0.05 // issue 12: every window within 5 points of virtual time
	// deployedStoreDeadline is the gateways' --timeout in this test (see
	// TestDeployedMatchesVirtual).
	deployedStoreDeadline = 50 * time.Millisecond
)

// TestDeployedMatchesVirtual runs one public scenario in deployed mode
// (quotient simulate --deployed's runner: each region a network namespace
// with its redis-server, coordinator and gateway, devkafka on its own
// host, the scenario's latency on a proxy per region) and checks every
// evaluation window's error against virtual time on the same scenario,
// within 5 points.
func TestDeployedMatchesVirtual(t *testing.T) {
	inTurn(t) // its own lab, ports inside its own namespaces
	if err := netlab.Available(); err != nil {
		t.Skipf("this machine lacks what network namespaces need: %v", err)
	}
	_, file, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "simulations", "scenarios", deployedScenario+".json"))
	require.NoError(t, err)
	sc, err := simulations.ParseScenario(data)
	require.NoError(t, err)
	require.Greater(t, sc.DurationSec, int64(deployedDuration), "the scenario got shorter than the test's cut")
	sc.DurationSec = deployedDuration
	sc, err = live.ScaleRates(sc, deployedRateScale)
	require.NoError(t, err)

	cfg := deployed.DefaultConfig()
	cfg.TimeScale = deployedTimeScale
	// This test compares the protocol with virtual time, not this
	// machine's scheduling: with the 5 ms default a stall of the two cores
	// under four parallel deployments opened a gateway's breaker for
	// seconds (a CI run of session 8: 1,085 fallback decisions, the shift's
	// window 14% under, 4 in a run alone). The store-down rows measure the
	// deadline itself.
	cfg.StoreDeadline = deployedStoreDeadline
	cfg.Quotient, cfg.Devkafka = bin(t, "quotient"), bin(t, "devkafka")
	cfg.Dir = t.TempDir()
	cfg.Logf = t.Logf
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dep, st, err := deployed.Run(ctx, sc, cfg)
	if err != nil {
		for _, name := range []string{"devkafka", "coordinator-us-east", "gateway-us-east"} {
			t.Logf("--- %s, last lines:\n%s", name, tail(filepath.Join(cfg.Dir, name+".log"), 20))
		}
	}
	require.NoError(t, err)
	t.Logf("deployed: %d requests answered, %d errors (last %q), %d store fallbacks, worst lateness %v, not applied: %v",
		st.Requests, st.Errors, st.LastError, st.Fallback, st.MaxLateness, st.NotApplied)
	ok, why := st.Faithful()
	require.True(t, ok, "the run did not keep its real-time schedule, so it measures the machine: %s", why)

	virt, err := simulations.Run(ctx, sc, simulations.Options{})
	require.NoError(t, err)
	c, err := deployed.Compare(dep, virt)
	require.NoError(t, err)
	var table strings.Builder
	require.NoError(t, c.WriteTable(&table, dep.WindowStarts(), 4))
	t.Logf("virtual worst over %.1f%% under %.1f%%; deployed worst over %.1f%% under %.1f%%\n%s",
		100*virt.Worst.MaxOver, 100*virt.Worst.MaxUnder, 100*dep.Worst.MaxOver, 100*dep.Worst.MaxUnder, table.String())
	starts := dep.WindowStarts()
	for _, k := range c.Keys {
		require.NotEmpty(t, k.Deployed)
		for w := range k.Deployed {
			assert.LessOrEqual(t, math.Abs(k.Deployed[w]-k.Virtual[w]), deployedMaxDiff,
				"%s/%s window at %d s: deployed %+.1f%%, virtual %+.1f%%", k.Key, k.Policy, starts[w], 100*k.Deployed[w], 100*k.Virtual[w])
		}
	}
	assert.Equal(t, virt.Decisions, dep.Decisions+st.Errors, "every request of the schedule was sent")
}
