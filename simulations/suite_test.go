package simulations

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStandardSuiteMeetsItsTargets runs every scenario of the standard
// suite (what `make simulate` runs) and requires each to meet its target,
// so that an accuracy regression fails `make test`, not only the table.
// A race build plays every third scenario (the whole suite takes some
// 90 s under the detector); `make test` runs it whole again without it.
func TestStandardSuiteMeetsItsTargets(t *testing.T) {
	files, err := filepath.Glob("scenarios/*.json")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for i, f := range files {
		if raceBuild && i%3 != 0 {
			continue
		}
		t.Run(filepath.Base(f), func(t *testing.T) {
			if testing.Short() && filepath.Base(f) == "zipf-many-keys.json" {
				t.Skip("3 million decisions; not in -short")
			}
			data, err := os.ReadFile(f)
			require.NoError(t, err)
			sc, err := ParseScenario(data)
			require.NoError(t, err)
			rep, err := Run(context.Background(), sc, Options{})
			require.NoError(t, err)
			assert.True(t, rep.Pass, "%s misses its target: %+v", sc.Name, rep.Worst)
		})
	}
}

// TestStandardSuiteHasTheSharedScenarios: every scenario of the project's
// shared folder (../shared/scenarios beside the repository, present in CI)
// is in the standard suite, unchanged.
func TestStandardSuiteHasTheSharedScenarios(t *testing.T) {
	shared, _ := filepath.Glob("../../shared/scenarios/*.json")
	if len(shared) == 0 {
		t.Skip("../shared/scenarios is not beside this repository")
	}
	for _, f := range shared {
		want, err := os.ReadFile(f)
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join("scenarios", filepath.Base(f)))
		require.NoError(t, err, "%s is missing from simulations/scenarios", filepath.Base(f))
		assert.True(t, bytes.Equal(want, got), "%s differs from the shared copy", filepath.Base(f))
	}
}
