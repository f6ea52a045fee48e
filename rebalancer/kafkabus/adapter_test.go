package kafkabus_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
	"github.com/quotientlabs/quotient/shares"
)

func TestAdapterConversionRoundTrip(t *testing.T) {
	r := &rebalancer.Report{
		Region: "eu", Epoch: 42, Seq: 42,
		Heard: []rebalancer.Heard{{Region: "eu", Epoch: 42}, {Region: "us", Epoch: 41}},
		Keys: []rebalancer.KeyReport{{
			Key:    rebalancer.Key{PolicyID: "g", Subject: "k:a"},
			Demand: 10, Admitted: 7, SmoothedDemandMilli: 1500,
			Share: shares.Share{RateMilli: 100_000, BurstMilli: 200_000}, Want: shares.Share{RateMilli: 5, BurstMilli: 6},
		}},
	}
	sent := time.UnixMilli(425_123)
	p := kafkabus.ToProto(r, 10*time.Second, sent)
	assert.Equal(t, int64(10_000), p.GetEpochMs())
	assert.Equal(t, int64(425_123), p.GetSentUnixMs())
	back, err := kafkabus.FromProto(p, 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, r, back)
}

func TestAdapterFromProtoRejects(t *testing.T) {
	ok := func() *quotientv1.UsageReport {
		return &quotientv1.UsageReport{Region: "eu", Epoch: 1, EpochMs: 1000, Seq: 1,
			Heard: []*quotientv1.RegionHeard{{Region: "eu", LastEpoch: 1}}, Keys: []*quotientv1.KeyUsage{{PolicyId: "g", Subject: "k:a"}}}
	}
	_, err := kafkabus.FromProto(ok(), time.Second)
	require.NoError(t, err)
	for want, mutate := range map[string]func(*quotientv1.UsageReport){
		"epoch_ms 1000, this region uses 2000": nil,
		"part 1 of 2":                          func(p *quotientv1.UsageReport) { p.Part, p.Parts = 1, 2 },
		"keys[0] is nil":                       func(p *quotientv1.UsageReport) { p.Keys[0] = nil },
		"heard[0] is nil":                      func(p *quotientv1.UsageReport) { p.Heard[0] = nil },
	} {
		p, epoch := ok(), time.Second
		if mutate == nil {
			epoch = 2 * time.Second
		} else {
			mutate(p)
		}
		_, err := kafkabus.FromProto(p, epoch)
		assert.ErrorContains(t, err, want)
	}
	_, err = kafkabus.FromProto(&quotientv1.UsageReport{EpochMs: 1000}, 2*time.Second)
	assert.ErrorIs(t, err, kafkabus.ErrEpochMismatch)
	_, err = kafkabus.NewAdapter(nil, time.Second, nil)
	assert.ErrorIs(t, err, kafkabus.ErrConfig)
}
