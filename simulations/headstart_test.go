package simulations

import (
	"testing"

	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/stretchr/testify/assert"
)

// TestHeadStartCoversTheWarmup: the coordinators start the default
// warm-up before the traffic, so a run measures a running fleet.
func TestHeadStartCoversTheWarmup(t *testing.T) {
	assert.Equal(t, rebalancer.DefaultConfig().WarmupEpochs, int64(HeadStartEpochs))
}
