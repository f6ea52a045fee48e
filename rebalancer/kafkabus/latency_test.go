package kafkabus_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/kafkautil/slowkafka"
)

// TestReportDeliveryRoundTrips measures the real path of a report through a
// broker one round trip (RTT = 2 x the injected one-way delay) away, and
// holds it to what the path must cost:
//
//   - Prepare (topic created, metadata loaded, leader connection open)
//     takes the round trips the first Publish would otherwise spend inside
//     its deadline; after it, the first Publish costs one produce round
//     trip (acks = all).
//   - A report reaches another region's Run one RTT after Publish is
//     called (half an RTT to the broker, half back on the fetch the
//     consumer keeps waiting there), whatever the phase of its fetches:
//     at most 2 RTT each (a fetch may be on its way back empty), and at
//     most 1.5 RTT for the median. With the former 500 ms fetch wait,
//     kafka-go's reader gave up on a fetch that found nothing (and on its
//     connection) after 500 ms, before the broker answered it, and at this
//     RTT (and at 300 ms) it delivered no report within 30 s.
//
// Bounds are in round trips with a margin of half a round trip for the
// machine; the injected delay (the deployed runner's 250 ms per proxy and
// direction at --time-scale 5 for abrupt-shift-late-reports) is large
// enough that scheduling noise is small against it.
func TestReportDeliveryRoundTrips(t *testing.T) {
	const oneWay = 250 * time.Millisecond
	const rtt = 2 * oneWay
	brokers := slowkafka.Start(t, oneWay)
	inRTT := func(d time.Duration) float64 { return float64(d) / float64(rtt) }

	pub := newBus(t, brokers, nil)
	sub := newBus(t, brokers, nil)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	t0 := time.Now()
	require.NoError(t, pub.Prepare(ctx))
	t.Logf("prepare (create topic, metadata, leader connection): %.2f RTT", inRTT(time.Since(t0)))

	c := consume(t, sub)
	t0 = time.Now()
	require.NoError(t, pub.Publish(ctx, report("us", 1, 1, 10)))
	first := time.Since(t0)
	t.Logf("first publish after prepare: %.2f RTT", inRTT(first))
	require.Less(t, inRTT(first), 1.5, "the first Publish after Prepare should cost one produce round trip")
	c.next(t) // the consumer is reading

	// Reports at phases spread over the consumer's fetch cycle.
	const n = 8
	var acks, deliveries []time.Duration
	for i := range n {
		time.Sleep(rtt * time.Duration(3+i%3) / 2) // phase spread over the fetch cycle, not a wait for a result
		t0 = time.Now()
		require.NoError(t, pub.Publish(ctx, report("us", int64(2+i), int64(2+i), 10)))
		acks = append(acks, time.Since(t0))
		got := c.next(t)
		deliveries = append(deliveries, time.Since(t0))
		require.EqualValues(t, 2+i, got.GetEpoch())
	}
	for i := range n {
		t.Logf("report %d: publish acknowledged after %.2f RTT, delivered after %.2f RTT", i, inRTT(acks[i]), inRTT(deliveries[i]))
	}
	for i := range n {
		require.Less(t, inRTT(acks[i]), 1.5, "report %d: Publish should cost one produce round trip", i)
		require.Less(t, inRTT(deliveries[i]), 2.5, "report %d: delivery should cost one round trip, two when the consumer's fetch was on its way back", i)
	}
	slices.Sort(deliveries)
	require.Less(t, inRTT(deliveries[n/2]), 1.5, "median delivery should cost one round trip")
}
