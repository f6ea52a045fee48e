package rebalancer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTransferRecordsLiveFromTheLastDecision: a share given or accepted
// between decisions is bounded by the last decision made, so its record
// above the default expires R epochs after that decision's epoch starts,
// not after the report period's: accepted before the decision of the
// period, one epoch sooner (package doc, "Share records and their
// lifetime"; the rise and silence proofs need it). Before, such a record
// took the period's lifetime (K+1 epochs from the period), one epoch
// longer than its bound.
func TestTransferRecordsLiveFromTheLastDecision(t *testing.T) {
	for _, decided := range []bool{true, false} {
		t.Run(map[bool]string{true: "after-the-decision", false: "before-the-decision"}[decided], func(t *testing.T) {
			p := newTransferPair(t)
			p.collect(80_000, 0)
			last := p.m - 1
			if decided {
				p.decide()
				last = p.m
			}
			now := EpochStart(p.m+1, 10*time.Second).Add(3 * time.Second)
			r := p.b.Config().RecordEpochs
			ask := p.b.Pressure(now, []Pressure{{Key: hot, DemandMilli: 100_000}})
			require.NotNil(t, ask)
			ups, give, err := p.a.ReceiveAsk(now, ask, nil)
			require.NoError(t, err)
			require.NotNil(t, give)
			require.Len(t, ups, 1)
			// a gives all but its floor: below the default, a record that
			// lives IdleTTLEpochs, also from the last decision.
			require.Less(t, ups[0].Share.RateMilli, xlim.Default().RateMilli, "%+v", ups[0])
			assert.Equal(t, EpochStart(last+p.a.Config().IdleTTLEpochs, 10*time.Second), ups[0].ExpireAt, "the giver's lowered record")
			ups, err = p.b.ReceiveGive(now, give)
			require.NoError(t, err)
			require.Len(t, ups, 1)
			require.True(t, xlim.AboveDefault(ups[0].Share), "%+v", ups[0])
			assert.Equal(t, EpochStart(last+r, 10*time.Second), ups[0].ExpireAt, "the receiver's raised record")
		})
	}
}
