package kafkarepl_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/dailyquota"
	"github.com/quotientlabs/quotient/dailyquota/kafkarepl"
	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/internal/kafkautil/slowkafka"
)

// TestCountDeliveryRoundTrips: through a broker one round trip (RTT = 2 x
// the injected one-way delay, 400 ms) away, a count published by one
// region reaches another region's Run about one RTT after Publish is
// called, whatever the phase of the consumer's fetches: at most 3 RTT
// each (2 when a fetch is on its way back empty as the record arrives,
// plus up to one RTT, 400 ms, for the machine: the race suite runs beside
// it, and one count took 2.54 RTT on a loaded machine), at most 1.5 RTT
// for the median. The failure these bounds catch is an order of magnitude
// larger (below). With kafkautil's former 500 ms
// fetch wait, kafka-go's reader gave up on every fetch that found nothing
// before the broker answered it (it holds it 375 ms, the answer then takes
// 200 ms more), dropped the connection and fetched again: no count, not
// even the one on the topic before Run, was delivered within 25 RTT. Run
// returns within 3 s of its context ending although fetches are held 4 s.
func TestCountDeliveryRoundTrips(t *testing.T) {
	const oneWay = 200 * time.Millisecond
	const rtt = 2 * oneWay
	inRTT := func(d time.Duration) float64 { return float64(d) / float64(rtt) }
	brokers := slowkafka.Start(t, oneWay)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	newBus := func() *kafkarepl.Bus {
		cl, err := kafkautil.New(kafkautil.DefaultConfig(brokers...))
		require.NoError(t, err)
		cfg := kafkarepl.DefaultConfig()
		cfg.Partitions, cfg.ReplicationFactor = 3, 1
		b, err := kafkarepl.New(cl, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Close(); _ = cl.Close() })
		return b
	}
	count := func(n int64) []dailyquota.Count {
		return []dailyquota.Count{{
			Key:      dailyquota.Key{Subject: "k:k1", Policy: "daily", StartMs: 0, Region: "us"},
			WindowMs: 86_400_000, N: n, UpdatedMs: n,
		}}
	}
	pub, sub := newBus(), newBus()
	require.NoError(t, pub.Publish(ctx, count(1))) // creates the topic

	got := make(chan dailyquota.Count, 16)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx, func(c dailyquota.Count) { got <- c }) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			t.Error("Run did not return within 3 s of its context ending: it waited for the fetches the broker holds (4 s)")
		}
	})
	next := func() dailyquota.Count {
		t.Helper()
		select {
		case c := <-got:
			return c
		case err := <-done:
			t.Fatalf("Run returned: %v", err)
		case <-time.After(25 * rtt):
			t.Fatalf("no count delivered within %v (25 RTT)", 25*rtt)
		}
		return dailyquota.Count{}
	}
	require.EqualValues(t, 1, next().N) // the consumer is reading

	const n = 6
	var deliveries []time.Duration
	for i := range n {
		time.Sleep(rtt * time.Duration(3+i%3) / 2) // phase spread over the fetch cycle, not a wait for a result
		t0 := time.Now()
		require.NoError(t, pub.Publish(ctx, count(int64(2+i))))
		c := next()
		deliveries = append(deliveries, time.Since(t0))
		require.EqualValues(t, 2+i, c.N)
	}
	for i, d := range deliveries {
		t.Logf("count %d: delivered %.2f RTT after Publish was called", i, inRTT(d))
	}
	for i, d := range deliveries {
		require.Less(t, inRTT(d), 3.0, "count %d: delivery should cost one round trip, two when the consumer's fetch was on its way back", i)
	}
	slices.Sort(deliveries)
	require.Less(t, inRTT(deliveries[n/2]), 1.5, "median delivery should cost one round trip")
}
