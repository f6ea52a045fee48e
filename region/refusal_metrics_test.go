package region

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/rebalancer"
)

// refusedByReason returns quotient_coordinator_transfer_gives_refused_total
// by its reason label.
func refusedByReason(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "quotient_coordinator_transfer_gives_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			require.Len(t, m.GetLabel(), 1)
			require.Equal(t, "reason", m.GetLabel()[0].GetName())
			out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	return out
}

// Refused gives count by reason, one series per reason from the start;
// accepted gives and sent gives do not count.
func TestGiveRefusalsByReason(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(reg, []string{"a", "b"})
	want := map[string]float64{}
	for _, r := range rebalancer.GiveRefusals() {
		want[r.String()] = 0
	}
	require.Equal(t, want, refusedByReason(t, reg), "every reason is exported at 0")

	for i, r := range rebalancer.GiveRefusals() {
		info := rebalancer.TransferInfo{Kind: rebalancer.GiveReceived, Region: "a", Keys: 1, Reason: rebalancer.ReasonCore, Refusal: r}
		if r == rebalancer.RefusedInvalid {
			info.Reason, info.Err = rebalancer.ReasonError, assert.AnError
		}
		for range i + 1 {
			m.Transferred(info)
		}
		want[r.String()] = float64(i + 1)
	}
	m.Transferred(rebalancer.TransferInfo{Kind: rebalancer.GiveReceived, Region: "a", Keys: 1, Accepted: true})
	m.Transferred(rebalancer.TransferInfo{Kind: rebalancer.GiveSent, Region: "a", Keys: 1, Reason: rebalancer.ReasonPublish})
	assert.Equal(t, want, refusedByReason(t, reg))
}
