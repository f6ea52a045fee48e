package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/internal/redistest"
)

func TestSimulateLiveBadFlags(t *testing.T) {
	dir := t.TempDir()
	file := writeScenario(t, dir, "light", passing)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--kafka", "127.0.0.1:9092"}, "--kafka needs --live"},
		{[]string{"--redis", "a=127.0.0.1:6379"}, "--redis needs --live"},
		{[]string{"--live", "--redis", "a=127.0.0.1:6379"}, "--live needs --kafka"},
		{[]string{"--live", "--kafka", "127.0.0.1:9092"}, "--live needs --redis"},
		{[]string{"--live", "--kafka", "k:1", "--redis", "a"}, `--redis "a": want REGION=host:port`},
		{[]string{"--live", "--kafka", "k:1", "--redis", "a=x:1,a=y:2"}, `region "a" given twice`},
		{[]string{"--live", "--kafka", "k:1", "--redis", "a=x:1", "--time-scale", "0"}, "--time-scale 0"},
		{[]string{"--live", "--kafka", "k:1", "--redis", "a=x:1", "--rate-scale", "-1"}, "--rate-scale -1"},
		{[]string{"--live", "--cold-start", "--kafka", "k:1", "--redis", "a=x:1"}, "--cold-start is for virtual time"},
		{[]string{"--rate-scale", "0"}, "--rate-scale 0: want a number > 0"},
		{[]string{"--time-scale", "5"}, "--time-scale applies to --live and --deployed only"},
		{[]string{"--time-scale", "5", "--rate-scale", "5"}, "--time-scale applies to --live and --deployed only"},
	} {
		code, _, stderr := simulate(t, append(tc.args, file)...)
		assert.Equal(t, 2, code, "%v", tc.args)
		assert.Contains(t, stderr, tc.want, "%v", tc.args)
	}
}

// A scenario live mode does not support is rejected before any connection,
// naming the field.
func TestSimulateLiveUnsupportedField(t *testing.T) {
	dir := t.TempDir()
	file := writeScenario(t, dir, "heavy", failing)
	code, _, stderr := simulate(t, "--live", "--kafka", "127.0.0.1:1", "--redis", "a=127.0.0.1:1,b=127.0.0.1:2", "--out", filepath.Join(dir, "out"), file)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, file+": network.partitions: not supported in live mode")
}

// A short scenario end to end: redis-servers, kfake, coordinators; the
// outputs of virtual time are written.
func TestSimulateLiveRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a scenario in real time (about 5 s); not in -short")
	}
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	a, b := redistest.StartServer(t), redistest.StartServer(t)
	dir := t.TempDir()
	const short = `{"name": "short", "seed": 1, "duration_s": 40, "regions": ["a", "b"], "window_s": 10, "warmup_s": 10,
  "policies": [{"id": "p", "scope": "global", "algorithm": "token_bucket", "rate_per_sec": 100, "burst": 100}],
  "traffic": [{"key": "k", "policies": ["p"], "rate": {"a": [[0, 5]], "b": [[0, 5]]}}]}`
	out := filepath.Join(dir, "out")
	code, stdout, stderr := simulate(t, "--live", "--kafka", kc.ListenAddrs()[0], "--redis", "a="+a.Addr()+",b="+b.Addr(),
		"--out", out, writeScenario(t, dir, "short", short))
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `short\s+PASS`, stdout)
	for _, suffix := range []string{".summary.json", ".windows.csv", ".seconds.csv", ".svg"} {
		_, err := os.Stat(filepath.Join(out, "short"+suffix))
		assert.NoError(t, err, suffix)
	}
}
