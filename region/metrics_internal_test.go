package region

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/shares"
)

// gathered returns the value of the unlabelled gauge or counter name.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		if g := m.GetGauge(); g != nil {
			return g.GetValue()
		}
		return m.GetCounter().GetValue()
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestHeldEpochsGauge: quotient_coordinator_held_epochs counts the epochs
// decided in a row without growth; a second decision of an epoch that
// grows (Again), a grow or a fallback decision resets it.
func TestHeldEpochsGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(reg, []string{"a", "b"})
	decide := func(epoch int64, mode shares.Mode, again bool) float64 {
		m.Decided(rebalancer.DecideInfo{Decision: rebalancer.Decision{Epoch: epoch, Mode: mode, Again: again}})
		return gathered(t, reg, "quotient_coordinator_held_epochs")
	}
	assert.Equal(t, 1.0, decide(10, shares.Hold, false))
	assert.Equal(t, 2.0, decide(11, shares.Hold, false))
	assert.Equal(t, 0.0, decide(11, shares.Grow, true), "the second decision of 11 grew")
	assert.Equal(t, 1.0, decide(12, shares.Hold, false))
	assert.Equal(t, 2.0, decide(13, shares.Hold, false))
	assert.Equal(t, 0.0, decide(14, shares.Fallback, false))
	assert.Equal(t, 1.0, decide(15, shares.Hold, false))
	assert.Equal(t, 0.0, decide(16, shares.Grow, false))
	assert.Equal(t, 1.0, gathered(t, reg, "quotient_coordinator_again_decisions_total"))
}

// TestIncompleteUsageMetric: an epoch collected as incomplete (a gateway
// dropped usage at its key bound) counts in
// quotient_coordinator_usage_incomplete_epochs_total, not as a failed
// usage read; an unknown one counts as both unknown and a read error.
func TestIncompleteUsageMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(reg, []string{"a", "b"})
	readErrors := func() float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() != "quotient_coordinator_errors_total" {
				continue
			}
			for _, mt := range mf.GetMetric() {
				for _, l := range mt.GetLabel() {
					if l.GetName() == "kind" && l.GetValue() == "usage_read" {
						return mt.GetCounter().GetValue()
					}
				}
			}
		}
		t.Fatal("no usage_read errors series")
		return 0
	}
	m.Collected(rebalancer.CollectInfo{UsageErr: rebalancer.ErrUsageIncomplete, UsageIncomplete: true})
	assert.Equal(t, 1.0, gathered(t, reg, "quotient_coordinator_usage_incomplete_epochs_total"))
	assert.Equal(t, 0.0, gathered(t, reg, "quotient_coordinator_usage_unknown_epochs_total"))
	assert.Equal(t, 0.0, readErrors())
	m.Collected(rebalancer.CollectInfo{UsageErr: assert.AnError, UsageUnknown: true})
	assert.Equal(t, 1.0, gathered(t, reg, "quotient_coordinator_usage_incomplete_epochs_total"))
	assert.Equal(t, 1.0, gathered(t, reg, "quotient_coordinator_usage_unknown_epochs_total"))
	assert.Equal(t, 1.0, readErrors())
}
