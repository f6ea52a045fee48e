package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// passing is met by the static stand-in: demand far below every share.
const passing = `{"name": "light", "seed": 1, "duration_s": 120, "regions": ["a", "b"],
  "policies": [{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 100, "burst": 100}],
  "traffic": [{"key": "k", "policies": ["p"], "rate": {"a": [[0, 5]], "b": [[0, 5]]}}]}`

// failing misses its target: all demand in one region of two.
// failing cannot meet its target: region a, where all the demand is, is cut
// off from b for the whole run, so it never holds more than its default
// half of the limit.
const failing = `{"name": "heavy", "seed": 1, "duration_s": 120, "regions": ["a", "b"],
  "network": {"partitions": [{"regions": ["a"], "from_s": 0, "to_s": 120}]},
  "policies": [{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 100, "burst": 100}],
  "traffic": [{"key": "k", "policies": ["p"], "rate": {"a": [[0, 300]]}}],
  "target": {"max_over": 0.15, "max_under": 0.01}}`

const malformed = `{"name": "bad", "duration_s": 120, "regions": ["a"],
  "policies": [{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 1}],
  "traffic": [{"key": "k", "policies": ["p"], "rate": {"us-west": [[0, 1]]}}]}`

func writeScenario(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name+".json")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o644))
	return path
}

func simulate(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	env := environment{stdout: &stdout, stderr: &stderr, lookupEnv: func(string) (string, bool) { return "", false }}
	code := run(context.Background(), env, append([]string{"simulate"}, args...))
	return code, stdout.String(), stderr.String()
}

func TestSimulatePasses(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	code, stdout, stderr := simulate(t, "--out", out, writeScenario(t, dir, "light", passing))
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "scenario")
	assert.Contains(t, stdout, "worst over")
	assert.Regexp(t, `light\s+PASS\s+0\.0% \(max 15%\)\s+0\.0% \(max 15%\)\s+\d+`, stdout)
	for _, suffix := range []string{".summary.json", ".windows.csv", ".seconds.csv", ".svg"} {
		_, err := os.Stat(filepath.Join(out, "light"+suffix))
		assert.NoError(t, err, suffix)
	}
	assert.Empty(t, stderr, "no progress line when stderr is not a terminal")
}

func TestSimulateMissesTarget(t *testing.T) {
	dir := t.TempDir()
	code, stdout, _ := simulate(t, "--out", filepath.Join(dir, "out"), writeScenario(t, dir, "light", passing), writeScenario(t, dir, "heavy", failing))
	assert.Equal(t, 1, code)
	assert.Regexp(t, `light\s+PASS`, stdout)
	assert.Regexp(t, `heavy\s+FAIL`, stdout)
}

func TestSimulateBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := writeScenario(t, dir, "bad", malformed)
	code, stdout, stderr := simulate(t, "--out", filepath.Join(dir, "out"), bad, writeScenario(t, dir, "light", passing))
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, bad+": traffic[0].rate.us-west: region not declared")
	assert.Regexp(t, `light\s+PASS`, stdout, "valid files still run")

	code, _, stderr = simulate(t, filepath.Join(dir, "missing.json"))
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "missing.json")

	code, _, stderr = simulate(t, "--seed", "x", bad)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--seed")

	code, _, _ = simulate(t)
	assert.Equal(t, 2, code, "no files")
}

func TestSimulateSeedOverride(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	code, _, stderr := simulate(t, "--out", out, "--seed", "42", writeScenario(t, dir, "light", passing))
	require.Equal(t, 0, code, stderr)
	data, err := os.ReadFile(filepath.Join(out, "light.summary.json"))
	require.NoError(t, err)
	var s struct{ Seed int64 }
	require.NoError(t, json.Unmarshal(data, &s))
	assert.Equal(t, int64(42), s.Seed)
}

// --rate-scale in virtual time runs the scenario at 1/F of its request
// and policy rates: the same file at F = 5 makes about a fifth of the
// decisions, and a scale the policies cannot take is refused naming it.
func TestSimulateRateScaleInVirtualTime(t *testing.T) {
	dir := t.TempDir()
	file := writeScenario(t, dir, "light", passing)
	decisions := func(args ...string) int64 {
		out := filepath.Join(dir, strings.Join(args, "")+"out")
		code, _, stderr := simulate(t, append(append([]string{"--out", out}, args...), file)...)
		require.Equal(t, 0, code, stderr)
		data, err := os.ReadFile(filepath.Join(out, "light.summary.json"))
		require.NoError(t, err)
		var s struct{ Decisions int64 }
		require.NoError(t, json.Unmarshal(data, &s))
		require.Positive(t, s.Decisions)
		return s.Decisions
	}
	full, fifth := decisions(), decisions("--rate-scale", "5")
	assert.InDelta(t, 0.2, float64(fifth)/float64(full), 0.05, "%d of %d decisions", fifth, full)

	code, _, stderr := simulate(t, "--out", filepath.Join(dir, "x"), "--rate-scale", "1e9", file)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "rate_per_sec", "a rate below what a policy takes names the field")
}

func TestSimulateSameSeedSameOutputs(t *testing.T) {
	dir := t.TempDir()
	file := writeScenario(t, dir, "light", passing)
	read := func(out string) map[string]string {
		code, _, stderr := simulate(t, "--out", out, file)
		require.Equal(t, 0, code, stderr)
		files := map[string]string{}
		for _, suffix := range []string{".windows.csv", ".seconds.csv", ".svg", ".summary.json"} {
			data, err := os.ReadFile(filepath.Join(out, "light"+suffix))
			require.NoError(t, err)
			s := string(data)
			if suffix == ".summary.json" { // wall_s is the one field that differs
				var lines []string
				for _, l := range strings.Split(s, "\n") {
					if !strings.Contains(l, `"wall_s"`) {
						lines = append(lines, l)
					}
				}
				s = strings.Join(lines, "\n")
			}
			files[suffix] = s
		}
		return files
	}
	assert.Equal(t, read(filepath.Join(dir, "one")), read(filepath.Join(dir, "two")))
}

// TestSimulateDeployedRefuses: what deployed mode cannot run, bad flag
// combinations and a missing binary exit 2 with a message naming them,
// before anything starts.
func TestSimulateDeployedRefuses(t *testing.T) {
	dir := t.TempDir()
	light := writeScenario(t, dir, "light", passing)
	hourly := writeScenario(t, dir, "hourly", `{"name": "hourly", "duration_s": 3600, "regions": ["a", "b"], "window_s": 3600, "warmup_s": 0,
	  "policies": [{"id": "h", "scope": "global", "algorithm": "fixed_window", "limit": 100, "window_s": 3600}],
	  "traffic": [{"key": "k", "policies": ["h"], "rate": {"a": [[0, 1]]}}]}`)

	code, _, stderr := simulate(t, "--deployed", hourly)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, hourly+": policies[0].algorithm: fixed_window: deployed mode runs token and leaky buckets only")

	code, _, stderr = simulate(t, "--deployed", "--live", light)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--deployed and --live exclude each other")

	code, _, stderr = simulate(t, "--bin", "/x/quotient", light)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--bin and --devkafka need --deployed")

	fake := filepath.Join(dir, "quotient")
	require.NoError(t, os.WriteFile(fake, []byte("#!/bin/sh\n"), 0o755))
	missing := filepath.Join(dir, "nowhere", "devkafka")
	code, _, stderr = simulate(t, "--deployed", "--bin", fake, "--devkafka", missing, light)
	assert.Equal(t, 2, code)
	if os.Geteuid() != 0 {
		assert.Contains(t, stderr, "needs root", "without root the lab's need is named first")
		return
	}
	assert.Contains(t, stderr, missing+" is not an executable file", "the missing binary is named")
}
