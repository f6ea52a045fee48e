package deployed

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/simulations"
)

func parse(t *testing.T, doc string) *simulations.Scenario {
	t.Helper()
	sc, err := simulations.ParseScenario([]byte(doc))
	require.NoError(t, err)
	return sc
}

const twoEntries = `{"name": "two", "seed": 1, "duration_s": 120, "regions": ["a", "b"],
  "policies": [{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 100, "burst": 200},
               {"id": "q", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 0.5, "burst": 20}],
  "traffic": [{"key": "k", "policies": ["p"], "rate": {"a": [[0, 5]]}},
              {"key": "k", "policies": ["p", "q"], "cost": 10, "rate": {"b": [[0, 1]]}}]}`

// TestCheckNamesWhatCannotRun: fixed windows and loss plus duplication
// above 1 are refused with the path of the field; a bucket scenario
// passes.
func TestCheckNamesWhatCannotRun(t *testing.T) {
	require.NoError(t, Check(parse(t, twoEntries)))
	bad := parse(t, `{"name": "bad", "duration_s": 3600, "regions": ["a", "b"], "window_s": 3600, "warmup_s": 0,
	  "network": {"loss": 0.5, "duplicate": 0.6},
	  "policies": [{"id": "h", "scope": "global", "algorithm": "fixed_window", "limit": 100, "window_s": 3600}],
	  "traffic": [{"key": "k", "policies": ["h"], "rate": {"a": [[0, 1]]}}]}`)
	err := Check(bad)
	var serr *simulations.ScenarioError
	require.True(t, errors.As(err, &serr), "%v", err)
	var paths []string
	for _, p := range serr.Problems {
		paths = append(paths, p.Path)
	}
	assert.Equal(t, []string{"policies[0].algorithm", "network"}, paths)
}

// TestPolicyDocs: each policy matches the routes of the entries naming it,
// with their cost, and its rate is multiplied by the time scale (bursts
// unchanged), so the gateways load what the scenario means.
func TestPolicyDocs(t *testing.T) {
	data, err := policyDocs(parse(t, twoEntries), 5)
	require.NoError(t, err)
	ps, err := limiter.ParsePolicies(data)
	require.NoError(t, err)
	require.Len(t, ps, 2)
	assert.Equal(t, []string{"/t0/x", "/t1/x"}, ps[0].Match.Routes)
	assert.Equal(t, map[string]int64{"GET /t1/x": 10}, ps[0].Cost)
	assert.InDelta(t, 500, ps[0].RatePerSec, 1e-9)
	assert.InDelta(t, 200, ps[0].Burst, 1e-9)
	assert.Equal(t, []string{"/t1/x"}, ps[1].Match.Routes)
	assert.InDelta(t, 2.5, ps[1].RatePerSec, 1e-9)
	assert.InDelta(t, 20, ps[1].Burst, 1e-9)
	assert.Equal(t, limiter.ScopeGlobal, ps[1].Scope)
	var keys map[string]map[string]string
	data, err = keyDoc(parse(t, twoEntries))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &keys))
	assert.Equal(t, map[string]map[string]string{"k": {"tier": "sim", "account": "k"}}, keys)
}

// TestTimingScalesTheBinariesDefaults: every delay of the binaries is the
// default of the unscaled epoch divided by the scale; an epoch that does
// not divide into whole milliseconds is refused.
func TestTimingScalesTheBinariesDefaults(t *testing.T) {
	sc := parse(t, twoEntries)
	cfg := DefaultConfig()
	tm, err := cfg.validate(sc)
	require.NoError(t, err)
	assert.Equal(t, timing{scale: 5, epoch: 2 * time.Second, second: 200 * time.Millisecond,
		maxWait: 400 * time.Millisecond, collect: 200 * time.Millisecond, flush: 200 * time.Millisecond}, tm)
	cfg = Config{TimeScale: 3}
	_, err = cfg.validate(sc)
	assert.ErrorIs(t, err, ErrConfig)
	assert.ErrorContains(t, err, "epoch_s 10 / 3")
}

// TestAvailableNamesAMissingBinary: a devkafka that is not there is named.
func TestAvailableNamesAMissingBinary(t *testing.T) {
	dir := t.TempDir()
	q := filepath.Join(dir, "quotient")
	require.NoError(t, os.WriteFile(q, []byte("#!/bin/sh\n"), 0o755))
	cfg := Config{Quotient: q, Devkafka: filepath.Join(dir, "devkafka")}
	err := cfg.findBinaries()
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.ErrorContains(t, err, filepath.Join(dir, "devkafka"))
}

// TestClockSkewIsScaledAndSaid: each region's clock_skew_ms becomes its
// processes' clock offset divided by the time scale (as every duration of
// the scenario is), the run says so per region and names what keeps the
// machine's clock, and clocks further apart than the protocol's allowance
// are warned about.
func TestClockSkewIsScaledAndSaid(t *testing.T) {
	doc := func(skew string) *simulations.Scenario {
		return parse(t, `{"name": "s", "seed": 1, "duration_s": 120, "regions": ["a", "b", "c"], "clock_skew_ms": `+skew+`,
		  "policies": [{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 100, "burst": 200}],
		  "traffic": [{"key": "k", "policies": ["p"], "rate": {"a": [[0, 5]]}}]}`)
	}
	cfg := DefaultConfig()
	sc := doc(`{"a": 800, "c": -600}`)
	tm, err := cfg.validate(sc)
	require.NoError(t, err)
	assert.Equal(t, []time.Duration{160 * time.Millisecond, 0, -120 * time.Millisecond},
		[]time.Duration{clockOffset(sc, 0, tm.scale), clockOffset(sc, 1, tm.scale), clockOffset(sc, 2, tm.scale)})
	applied, notApplied, warnings := skewNotes(sc, tm)
	assert.Equal(t, []string{
		"clock_skew_ms.a (800 ms): --clock-offset 160ms on its coordinator and gateway (the skew / time scale 5)",
		"clock_skew_ms.c (-600 ms): --clock-offset -120ms on its coordinator and gateway (the skew / time scale 5)",
	}, applied)
	require.Len(t, notApplied, 1)
	assert.Contains(t, notApplied[0], "redis-server keeps the machine's clock")
	assert.Empty(t, warnings, "1.4 s apart on a 10 s epoch")

	applied, notApplied, warnings = skewNotes(doc(`{}`), tm)
	assert.Empty(t, applied)
	assert.Empty(t, notApplied)
	assert.Empty(t, warnings)

	// 7 s apart: an epoch of 10 s minus 1 s of collect delay and 2 s of max
	// wait leaves less than that.
	_, _, warnings = skewNotes(doc(`{"a": 4000, "b": -3000}`), tm)
	require.Len(t, warnings, 1)
	assert.Contains(t, warnings[0], "the clocks are 1.4s apart (real)")
}
