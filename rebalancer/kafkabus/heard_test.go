package kafkabus_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
)

// TestAdapterCarriesTheHeardMatrix: Started and the relayed heard vectors
// survive the wire, and a report without them (an older sender) decodes
// with Started 0 and no relay, which the rebalancer never takes as
// evidence for the majority rule.
func TestAdapterCarriesTheHeardMatrix(t *testing.T) {
	r := &rebalancer.Report{
		Region: "eu", Epoch: 42, Seq: 42, Started: 30,
		Heard: []rebalancer.Heard{{Region: "eu", Epoch: 42}, {Region: "us", Epoch: 41}},
		Relay: []rebalancer.Relayed{
			{Region: "ap", Epoch: 40, Started: 3, Heard: []rebalancer.Heard{{Region: "ap", Epoch: 40}, {Region: "eu", Epoch: 39}}},
			{Region: "us", Epoch: 41, Heard: []rebalancer.Heard{}},
		},
		Keys: []rebalancer.KeyReport{},
	}
	p := kafkabus.ToProto(r, 10*time.Second, time.UnixMilli(1))
	b, err := proto.Marshal(p)
	require.NoError(t, err)
	var wire quotientv1.UsageReport
	require.NoError(t, proto.Unmarshal(b, &wire))
	back, err := kafkabus.FromProto(&wire, 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, r, back)

	// An older sender: fields 10 and 11 absent.
	old := proto.Clone(&wire).(*quotientv1.UsageReport)
	old.StartedEpoch, old.Relayed = 0, nil
	back, err = kafkabus.FromProto(old, 10*time.Second)
	require.NoError(t, err)
	assert.Zero(t, back.Started)
	assert.Empty(t, back.Relay)
	assert.Equal(t, r.Heard, back.Heard)

	wire.Relayed[0].Heard[1] = nil
	_, err = kafkabus.FromProto(&wire, 10*time.Second)
	assert.ErrorContains(t, err, "relayed[0].heard[1] is nil")
	wire.Relayed[0] = nil
	_, err = kafkabus.FromProto(&wire, 10*time.Second)
	assert.ErrorContains(t, err, "relayed[0] is nil")
}
