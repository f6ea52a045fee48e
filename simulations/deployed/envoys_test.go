package deployed

import (
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/simulations"
)

// A scenario with Envoys (the RLQS tier, virtual time only) is refused by
// name instead of being run through gateways.
func TestCheckRefusesEnvoys(t *testing.T) {
	data, err := os.ReadFile("../scenarios/rlqs-abrupt-shift.json")
	require.NoError(t, err)
	sc, err := simulations.ParseScenario(data)
	require.NoError(t, err)
	var serr *simulations.ScenarioError
	require.True(t, errors.As(Check(sc), &serr))
	found := false
	for _, p := range serr.Problems {
		found = found || p.Path == "envoys"
	}
	assert.True(t, found, "%v", serr.Problems)
}
