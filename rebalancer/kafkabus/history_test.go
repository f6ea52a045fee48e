package kafkabus_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
)

// TestPublishedTellsAFirstStartFromARestart: against kfake, a topic that
// does not exist yet holds no report (a first start); once region us
// published a report 30 s before the start, a driver starting now finds it
// in the span a restart needs (not a first start), while eu, which never
// reported, still finds none, and ap, whose last report is 200 s old
// (older than the span), finds none either.
func TestPublishedTellsAFirstStartFromARestart(t *testing.T) {
	brokers := startKafka(t)
	const epoch = 10 * time.Second
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := &fakeClock{t: t0}
	b := newBus(t, brokers, func(c *kafkabus.Config) { c.Now = clock.Now })
	a, err := kafkabus.NewAdapter(b, epoch, clock.Now)
	require.NoError(t, err)
	var _ rebalancer.ReportHistory = a
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	cfg := rebalancer.DefaultConfig()
	span := time.Duration(rebalancer.FirstStartEpochs(cfg)+1) * epoch // as the driver asks: one epoch of margin
	found, err := a.Published(ctx, "us", t0.Add(-span))
	require.NoError(t, err)
	assert.False(t, found, "a new topic: a first start")

	// Oldest first, as a topic's records are: the broker finds the first
	// offset at or after a timestamp, which assumes they grow with the
	// offset (a map's random order published us before ap now and then,
	// and ap's older report was then found after us's).
	for _, r := range []struct {
		region string
		ago    time.Duration
	}{{"ap", 200 * time.Second}, {"us", 30 * time.Second}} {
		region, ago := r.region, r.ago
		clock.Set(t0.Add(-ago))
		e := rebalancer.EpochOf(t0.Add(-ago), epoch) - 1
		require.NoError(t, a.Publish(ctx, &rebalancer.Report{Region: region, Epoch: e, Seq: e, Started: e - 20}))
	}
	clock.Set(t0)
	found, err = a.Published(ctx, "us", t0.Add(-span))
	require.NoError(t, err)
	assert.True(t, found, "us reported 30 s ago: a restart")
	found, err = a.Published(ctx, "eu", t0.Add(-span))
	require.NoError(t, err)
	assert.False(t, found, "eu never reported")
	found, err = a.Published(ctx, "ap", t0.Add(-span))
	require.NoError(t, err)
	assert.False(t, found, "ap's last report is older than the span: a first start")
	found, err = a.Published(ctx, "ap", t0.Add(-250*time.Second))
	require.NoError(t, err)
	assert.True(t, found, "ap's report, when the span reaches it")
	found, err = a.Published(ctx, "us", t0.Add(-20*time.Second))
	require.NoError(t, err)
	assert.False(t, found, "only records at or after since count")
}
