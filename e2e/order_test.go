package e2e

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// longestFirst lists the parallel tests by how long each ran in make e2e
// (out/e2e.log of the last runs, build of the binaries included), longest
// first. The tests start in this order, -parallel of them at a time
// (longest-processing-time scheduling): with Go's own order, which is
// arbitrary once the paused tests are released, the two longest started
// last and the package took 281 s where these durations (164, 151, 112,
// 91, 86, 66, 51, 34, 21 s) fit four slots in about 200 s. A test not
// listed starts after the listed ones. The order changes how long the run
// takes, never what a test checks.
var longestFirst = []string{
	"TestDeployedMatchesVirtual",
	"TestBinariesGlobalLimits",
	"TestBinariesRegionCutOff",
	"TestBinariesBrokerDown",
	"TestBinariesRedisKilled",
	"TestBinariesGatewayRestarted",
	"TestBinariesTwoRegionsAsTheReadme",
	"TestBinariesTransferAfterShift",
	"TestBinariesRLSGlobalLimitTwoRegions",
	"TestBinariesLeaderKilled",
}

// turns hands out the parallel slots in longestFirst order. Go's own
// -parallel limit is lifted in TestMain (every parallel test passes
// t.Parallel at once) and enforced here instead, so that a test Go
// happened to release first cannot hold a slot a longer test needs.
var turns struct {
	mu      sync.Mutex
	cond    *sync.Cond
	slots   int      // the -parallel the run asked for
	running int      // tests holding a slot
	pending []string // selected tests of longestFirst not started yet, in order
}

// orderWait bounds how long a test waits for an earlier test of
// longestFirst that -run selects but that has not asked for its turn (the
// name filter here is simpler than go test's): after it, the waiting test
// starts anyway, so a mismatch costs time, never a hang.
const orderWait = 30 * time.Second

func TestMain(m *testing.M) {
	flag.Parse()
	slots := 1
	if f := flag.Lookup("test.parallel"); f != nil {
		if n, err := strconv.Atoi(f.Value.String()); err == nil && n > 0 {
			slots = n
		}
	}
	turns.cond = sync.NewCond(&turns.mu)
	turns.slots = slots
	turns.pending = selected(longestFirst)
	// Every parallel test must reach inTurn for the order to hold; the
	// slots above are the limit the run asked for.
	if err := flag.Set("test.parallel", strconv.Itoa(len(longestFirst)+slots)); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: lifting -parallel:", err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// selected is the part of names that -test.run selects and -test.skip
// does not, matching only the top-level part of each pattern.
func selected(names []string) []string {
	match := func(flagName string) *regexp.Regexp {
		f := flag.Lookup(flagName)
		if f == nil || f.Value.String() == "" {
			return nil
		}
		top, _, _ := strings.Cut(f.Value.String(), "/")
		re, err := regexp.Compile(top)
		if err != nil {
			return nil
		}
		return re
	}
	run, skip := match("test.run"), match("test.skip")
	var out []string
	for _, n := range names {
		if (run == nil || run.MatchString(n)) && (skip == nil || !skip.MatchString(n)) {
			out = append(out, n)
		}
	}
	return out
}

// inTurn is t.Parallel for the tests of this package: it returns once every
// selected test listed before t's in longestFirst has started and a slot is
// free, and frees the slot when t ends. Call it first in the test, before
// any skip, so that a skipped test takes and frees its turn too.
func inTurn(t *testing.T) {
	t.Parallel()
	name := t.Name()
	deadline := time.Now().Add(orderWait)
	wake := time.AfterFunc(orderWait, func() {
		turns.mu.Lock()
		turns.cond.Broadcast()
		turns.mu.Unlock()
	})
	defer wake.Stop()
	turns.mu.Lock()
	defer turns.mu.Unlock()
	for {
		i := slices.Index(turns.pending, name)
		first := i == 0 || (i < 0 && len(turns.pending) == 0)
		if turns.running < turns.slots && (first || !time.Now().Before(deadline)) {
			break
		}
		turns.cond.Wait()
	}
	turns.running++
	if i := slices.Index(turns.pending, name); i >= 0 {
		turns.pending = slices.Delete(turns.pending, i, i+1)
	}
	turns.cond.Broadcast()
	t.Cleanup(func() {
		turns.mu.Lock()
		turns.running--
		turns.cond.Broadcast()
		turns.mu.Unlock()
	})
}

// TestPerUTCDaySplitsAtMidnight: the daily window's check splits a run
// across midnight into its two UTC days (a run of TestBinariesGlobalLimits
// that crossed midnight read 2,000 of one day plus 1,401 of the next as an
// overshoot of one window).
func TestPerUTCDaySplitsAtMidnight(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 23, 59, 58, 500e6, time.UTC)
	got := perUTCDay(t0, []int{1, 2, 3, 4}, []int{1, 1, 0, 4})
	require.Equal(t, []dayCount{{"2026-12-01", 3, 2}, {"2026-12-02", 7, 4}}, got)
	require.Equal(t, []dayCount{{"2026-12-02", 10, 6}}, perUTCDay(t0.Add(time.Hour), []int{1, 2, 3, 4}, []int{1, 1, 0, 4}))
}
