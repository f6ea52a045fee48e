package kafkabus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
	"github.com/quotientlabs/quotient/shares"
)

// deltaReport is a delta of region us, epoch 9 against base 6, with n
// changed keys and one removed.
func deltaReport(n int) *rebalancer.Report {
	r := &rebalancer.Report{Region: "us", Epoch: 9, Seq: 9, Base: 6, AcceptsDelta: true, Started: 3,
		Heard: []rebalancer.Heard{{Region: "eu", Epoch: 8}, {Region: "us", Epoch: 9}}}
	for i := range n {
		r.Keys = append(r.Keys, rebalancer.KeyReport{Key: rebalancer.Key{PolicyID: "g", Subject: fmt.Sprintf("k:%05d", i)},
			Demand: 10, Admitted: 7, SmoothedDemandMilli: 1500,
			Share: shares.Share{RateMilli: 100_000, BurstMilli: 200_000}, Want: shares.Share{RateMilli: 5, BurstMilli: 6}})
	}
	r.Keys = append(r.Keys, rebalancer.KeyReport{Key: rebalancer.Key{PolicyID: "g", Subject: "zz"}, Removed: true})
	return r
}

// oldFromProto is the check of a receiver that predates deltas (FromProto
// before issue 15): the epoch length must be the receiver's.
func oldFromProto(p *quotientv1.UsageReport, epoch time.Duration) error {
	if p.GetEpochMs() != epoch.Milliseconds() {
		return fmt.Errorf("epoch_ms %d, this region uses %d", p.GetEpochMs(), epoch.Milliseconds())
	}
	return nil
}

// TestDeltaConversionRoundTrip: a delta goes on the wire with epoch_ms 0,
// its epoch length in delta_epoch_ms, its base and removed keys, and comes
// back equal; a receiver that predates deltas rejects it; a delta with
// another epoch length, or epoch_ms set, is an epoch mismatch.
func TestDeltaConversionRoundTrip(t *testing.T) {
	r := deltaReport(2)
	p := kafkabus.ToProto(r, 10*time.Second, time.UnixMilli(1))
	assert.Zero(t, p.GetEpochMs())
	assert.Equal(t, int64(10_000), p.GetDeltaEpochMs())
	assert.Equal(t, int64(6), p.GetBaseEpoch())
	assert.True(t, p.GetAcceptsDelta())
	assert.True(t, p.GetKeys()[2].GetRemoved())
	back, err := kafkabus.FromProto(p, 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, r, back)
	require.Error(t, oldFromProto(p, 10*time.Second), "an old receiver rejects a delta")

	_, err = kafkabus.FromProto(p, time.Second)
	require.ErrorIs(t, err, kafkabus.ErrEpochMismatch)
	p.EpochMs = 10_000
	_, err = kafkabus.FromProto(p, 10*time.Second)
	require.ErrorIs(t, err, kafkabus.ErrEpochMismatch, "a delta carries epoch_ms 0")

	full := *r
	full.Base, full.Keys = 0, full.Keys[:2]
	p = kafkabus.ToProto(&full, 10*time.Second, time.UnixMilli(1))
	assert.Equal(t, int64(10_000), p.GetEpochMs())
	assert.Zero(t, p.GetDeltaEpochMs())
	require.NoError(t, oldFromProto(p, 10*time.Second), "a full report is what it was")
}

// TestDeltaArrivesWhole: a delta split into many parts by Publish is
// assembled whole with its delta fields on every part, converts back to
// the report published; Publish refuses a delta whose header is
// inconsistent.
func TestDeltaArrivesWhole(t *testing.T) {
	brokers := startKafka(t)
	small := func(c *kafkabus.Config) { c.MaxMessageBytes = 16 << 10 }
	pub := newBus(t, brokers, small)
	sub := newBus(t, brokers, small)
	c := consume(t, sub)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	r := deltaReport(3000)
	p := kafkabus.ToProto(r, time.Second, time.UnixMilli(1))
	before := proto.Clone(p)
	require.NoError(t, pub.Publish(ctx, p))
	require.True(t, proto.Equal(before, p), "Publish modified the caller's report")
	got := c.next(t)
	require.True(t, proto.Equal(p, got), "assembled delta differs from the published one")
	assert.Greater(t, pub.Stats().PublishedParts, int64(5))
	back, err := kafkabus.FromProto(got, time.Second)
	require.NoError(t, err)
	assert.Equal(t, r, back)

	for name, mutate := range map[string]func(*quotientv1.UsageReport){
		"epoch_ms set":      func(p *quotientv1.UsageReport) { p.EpochMs = 1000 },
		"no delta_epoch_ms": func(p *quotientv1.UsageReport) { p.DeltaEpochMs = 0 },
		"negative base":     func(p *quotientv1.UsageReport) { p.BaseEpoch = -1 },
	} {
		bad := proto.Clone(before).(*quotientv1.UsageReport)
		mutate(bad)
		err := pub.Publish(ctx, bad)
		assert.ErrorIs(t, err, kafkabus.ErrInvalidReport, name)
	}
}
