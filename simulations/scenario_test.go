package simulations

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/limiter"
)

// minimal is a valid scenario that the table below breaks one field at a
// time.
const minimal = `{
  "name": "t",
  "seed": 3,
  "duration_s": 120,
  "regions": ["a", "b"],
  "policies": [{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 10, "burst": 20}],
  "traffic": [{"key": "k", "policies": ["p"], "rate": {"a": [[0, 5]]}}]
}`

// patch returns minimal with top-level fields replaced (nil deletes).
func patch(t *testing.T, fields map[string]any) []byte {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(minimal), &m))
	for k, v := range fields {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	data, err := json.Marshal(m)
	require.NoError(t, err)
	return data
}

func raw(s string) json.RawMessage { return json.RawMessage(s) }

func TestParseScenarioDefaults(t *testing.T) {
	sc, err := ParseScenario([]byte(minimal))
	require.NoError(t, err)
	assert.Equal(t, "t", sc.Name)
	assert.Equal(t, int64(3), sc.Seed)
	assert.Equal(t, int64(10), sc.EpochSec)
	assert.Equal(t, int64(60), sc.WindowSec)
	assert.Equal(t, int64(60), sc.WarmupSec, "warmup defaults to one window")
	assert.Equal(t, Target{MaxOver: 0.15, MaxUnder: 0.15}, sc.Target)
	assert.Equal(t, []int64{0, 0}, sc.ClockSkewMs)
	require.Len(t, sc.Traffic, 1)
	tr := sc.Traffic[0]
	assert.Equal(t, Poisson, tr.Arrivals)
	assert.Equal(t, int64(1), tr.Cost)
	assert.Equal(t, [][]Step{{{AtSec: 0, Rate: 5}}, nil}, tr.Rate)
	require.Len(t, sc.Policies, 1)
	assert.Equal(t, limiter.ScopeGlobal, sc.Policies[0].Scope)
	assert.Equal(t, int64(10_000), sc.Policies[0].RateMilli())
}

func TestParseScenarioStandardSuite(t *testing.T) {
	files, err := filepath.Glob("scenarios/*.json")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		sc, err := ParseScenario(data)
		require.NoError(t, err, f)
		assert.Equal(t, strings.TrimSuffix(filepath.Base(f), ".json"), sc.Name, "file name matches the scenario name")
	}
}

func TestParseScenarioGroup(t *testing.T) {
	data := patch(t, map[string]any{"traffic": raw(`[{"key_prefix": "free-", "count": 10, "policies": ["p"], "arrivals": "uniform", "cost": 2,
		"total_rate": [[0, 50], [30, 0]], "zipf_s": 1.1, "region_mix": {"a": 0.25, "b": 0.75}}]`)})
	sc, err := ParseScenario(data)
	require.NoError(t, err)
	tr := sc.Traffic[0]
	assert.False(t, tr.Named())
	assert.Equal(t, 10, tr.Count)
	assert.Equal(t, Uniform, tr.Arrivals)
	assert.Equal(t, int64(2), tr.Cost)
	assert.Equal(t, []Step{{0, 50}, {30, 0}}, tr.TotalRate)
	assert.Equal(t, []float64{0.25, 0.75}, tr.RegionMix)
}

func TestParseScenarioErrors(t *testing.T) {
	tests := []struct {
		name   string
		fields map[string]any
		path   string
		msg    string
	}{
		{"unknown top-level field", map[string]any{"colour": "red"}, "colour", "unknown field"},
		{"missing name", map[string]any{"name": nil}, "name", "required"},
		{"bad name", map[string]any{"name": "a/b"}, "name", "names the output files"},
		{"no regions", map[string]any{"regions": raw(`[]`)}, "regions", "1 to 16"},
		{"repeated region", map[string]any{"regions": raw(`["a", "a"]`)}, "regions[1]", "repeats"},
		{"negative duration", map[string]any{"duration_s": -5}, "duration_s", "between"},
		{"fractional duration", map[string]any{"duration_s": 1.5}, "duration_s", "whole number"},
		{"no evaluation window", map[string]any{"duration_s": 100}, "duration_s", "no evaluation window"},
		{"string epoch", map[string]any{"epoch_s": "10"}, "epoch_s", "want a number"},
		{"undeclared region in rate", map[string]any{"traffic": raw(`[{"key": "k", "policies": ["p"], "rate": {"a": [[0, 1]]}},
			{"key": "k2", "policies": ["p"], "rate": {"us-west": [[0, 1]]}}]`)}, "traffic[1].rate.us-west", "region not declared"},
		{"negative rate", map[string]any{"traffic": raw(`[{"key": "k", "policies": ["p"], "rate": {"a": [[0, -1]]}}]`)}, "traffic[0].rate.a[0][1]", "rate must be between 0"},
		{"empty schedule", map[string]any{"traffic": raw(`[{"key": "k", "policies": ["p"], "rate": {"a": []}}]`)}, "traffic[0].rate.a", "empty schedule"},
		{"times not increasing", map[string]any{"traffic": raw(`[{"key": "k", "policies": ["p"], "rate": {"a": [[10, 1], [5, 2]]}}]`)}, "traffic[0].rate.a[1][0]", "times must increase"},
		{"point not a pair", map[string]any{"traffic": raw(`[{"key": "k", "policies": ["p"], "rate": {"a": [[0, 1, 2]]}}]`)}, "traffic[0].rate.a[0]", "[t_s, requests_per_s]"},
		{"empty rate", map[string]any{"traffic": raw(`[{"key": "k", "policies": ["p"], "rate": {}}]`)}, "traffic[0].rate", "empty"},
		{"unknown traffic field", map[string]any{"traffic": raw(`[{"key": "k", "policies": ["p"], "rate": {"a": [[0, 1]]}, "burst": 3}]`)}, "traffic[0].burst", "unknown field"},
		{"group field on a named key", map[string]any{"traffic": raw(`[{"key": "k", "policies": ["p"], "rate": {"a": [[0, 1]]}, "zipf_s": 1}]`)}, "traffic[0].zipf_s", "unknown field"},
		{"key and prefix", map[string]any{"traffic": raw(`[{"key": "k", "key_prefix": "x", "policies": ["p"]}]`)}, "traffic[0]", "not both"},
		{"neither key nor prefix", map[string]any{"traffic": raw(`[{"policies": ["p"]}]`)}, "traffic[0]", "want key"},
		{"undeclared policy", map[string]any{"traffic": raw(`[{"key": "k", "policies": ["q"], "rate": {"a": [[0, 1]]}}]`)}, "traffic[0].policies[0]", "not declared"},
		{"no policies", map[string]any{"traffic": raw(`[{"key": "k", "policies": [], "rate": {"a": [[0, 1]]}}]`)}, "traffic[0].policies", "empty"},
		{"zero cost", map[string]any{"traffic": raw(`[{"key": "k", "policies": ["p"], "cost": 0, "rate": {"a": [[0, 1]]}}]`)}, "traffic[0].cost", "between 1"},
		{"unknown arrivals", map[string]any{"traffic": raw(`[{"key": "k", "policies": ["p"], "arrivals": "bursty", "rate": {"a": [[0, 1]]}}]`)}, "traffic[0].arrivals", "poisson or uniform"},
		{"mix not summing to 1", map[string]any{"traffic": raw(`[{"key_prefix": "f", "count": 3, "policies": ["p"], "total_rate": [[0, 1]], "region_mix": {"a": 0.5}}]`)}, "traffic[0].region_mix", "sum to 1"},
		{"mix undeclared region", map[string]any{"traffic": raw(`[{"key_prefix": "f", "count": 3, "policies": ["p"], "total_rate": [[0, 1]], "region_mix": {"zz": 1}}]`)}, "traffic[0].region_mix.zz", "region not declared"},
		{"group without count", map[string]any{"traffic": raw(`[{"key_prefix": "f", "policies": ["p"], "total_rate": [[0, 1]], "region_mix": {"a": 1}}]`)}, "traffic[0].count", "required"},
		{"empty traffic", map[string]any{"traffic": raw(`[]`)}, "traffic", "empty"},
		{"policy error keeps its field", map[string]any{"policies": raw(`[{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": -1, "burst": 20}]`)}, "policies[0].rate_per_sec", "must be > 0"},
		{"policy unknown field", map[string]any{"policies": raw(`[{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 1, "colour": 1}]`)}, "policies[0].colour", "unknown field"},
		{"region-scoped policy", map[string]any{"policies": raw(`[{"id": "p", "algorithm": "token_bucket", "rate_per_sec": 1}]`)}, "policies[0].scope", "global"},
		{"duplicate policy", map[string]any{"policies": raw(`[{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 1}, {"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 2}]`)}, "policies[1].id", "duplicate"},
		{"loss of 1", map[string]any{"network": raw(`{"loss": 1}`)}, "network.loss", "[0, 1)"},
		{"unknown network field", map[string]any{"network": raw(`{"bandwidth": 1}`)}, "network.bandwidth", "unknown field"},
		{"partition of unknown region", map[string]any{"network": raw(`{"partitions": [{"regions": ["zz"], "from_s": 1, "to_s": 2}]}`)}, "network.partitions[0].regions[0]", "not declared"},
		{"partition ends before it starts", map[string]any{"network": raw(`{"partitions": [{"regions": ["a"], "from_s": 5, "to_s": 2}]}`)}, "network.partitions[0].to_s", "after from_s"},
		{"skew of unknown region", map[string]any{"clock_skew_ms": raw(`{"zz": 5}`)}, "clock_skew_ms.zz", "region not declared"},
		{"unknown fault", map[string]any{"faults": raw(`[{"kind": "meteor", "region": "a", "from_s": 1, "to_s": 2}]`)}, "faults[0].kind", "unknown fault"},
		{"fault without region", map[string]any{"faults": raw(`[{"kind": "store_down", "from_s": 1, "to_s": 2}]`)}, "faults[0].region", "required"},
		{"negative target", map[string]any{"target": raw(`{"max_over": -0.1}`)}, "target.max_over", "must be in"},
		{"unknown target field", map[string]any{"target": raw(`{"max_error": 0.1}`)}, "target.max_error", "unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseScenario(patch(t, tt.fields))
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrInvalidScenario))
			var serr *ScenarioError
			require.ErrorAs(t, err, &serr)
			found := false
			for _, p := range serr.Problems {
				if p.Path == tt.path && strings.Contains(p.Msg, tt.msg) {
					found = true
				}
			}
			assert.True(t, found, "want %q at %s, got %v", tt.msg, tt.path, serr.Problems)
		})
	}
}

func TestParseScenarioReportsEveryProblem(t *testing.T) {
	data := patch(t, map[string]any{"colour": 1, "epoch_s": 0, "traffic": raw(`[{"key": "k", "policies": ["p"], "rate": {"zz": [[0, 1]]}}]`)})
	_, err := ParseScenario(data)
	var serr *ScenarioError
	require.ErrorAs(t, err, &serr)
	var paths []string
	for _, p := range serr.Problems {
		paths = append(paths, p.Path)
	}
	assert.Equal(t, []string{"colour", "epoch_s", "traffic[0].rate.zz"}, paths)
}

func TestParseScenarioMalformedJSON(t *testing.T) {
	for name, in := range map[string]string{
		"truncated":     `{"name": "t"`,
		"not an object": `[1, 2]`,
		"empty":         ``,
		"repeated key":  `{"name": "t", "name": "u"}`,
		"nested repeat": `{"network": {"loss": 0, "loss": 0.1}}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseScenario([]byte(in))
			var serr *ScenarioError
			require.ErrorAs(t, err, &serr)
			require.NotEmpty(t, serr.Problems)
		})
	}
	_, err := ParseScenario([]byte(`{"network": {"loss": 0, "loss": 0.1}}`))
	assert.ErrorContains(t, err, `network.loss: field "loss" appears twice`)
}

// FuzzParseScenario checks that the parser never panics, that every
// rejection names at least one field, and that what it accepts is
// internally consistent (what the engine relies on).
func FuzzParseScenario(f *testing.F) {
	files, _ := filepath.Glob("scenarios/*.json")
	for _, file := range files {
		if data, err := os.ReadFile(file); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(minimal))
	f.Add([]byte(`{"name": "x", "traffic": [{"key_prefix": "a", "count": 2}]}`))
	f.Add([]byte(`{"network": {"partitions": [{"regions": [1]}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		sc, err := ParseScenario(data)
		if err != nil {
			var serr *ScenarioError
			require.ErrorAs(t, err, &serr)
			require.NotEmpty(t, serr.Problems)
			for _, p := range serr.Problems {
				require.NotEmpty(t, p.Path, "every problem names a field: %s", p.Msg)
			}
			return
		}
		n := len(sc.Regions)
		require.True(t, n >= 1 && n <= MaxRegions)
		require.Len(t, sc.ClockSkewMs, n)
		require.True(t, sc.WarmupSec+sc.WindowSec <= sc.DurationSec)
		require.NotEmpty(t, sc.Traffic)
		ids := map[string]bool{}
		for _, p := range sc.Policies {
			ids[p.ID] = true
		}
		for _, tr := range sc.Traffic {
			require.NotEmpty(t, tr.Policies)
			for _, id := range tr.Policies {
				require.True(t, ids[id])
			}
			require.GreaterOrEqual(t, tr.Cost, int64(1))
			if tr.Named() {
				require.Len(t, tr.Rate, n)
			} else {
				require.Len(t, tr.RegionMix, n)
				require.NotEmpty(t, tr.TotalRate)
				require.Positive(t, tr.Count)
			}
		}
	})
}
