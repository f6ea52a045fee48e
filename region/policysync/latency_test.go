package policysync_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/internal/kafkautil/slowkafka"
	"github.com/quotientlabs/quotient/region/admin"
	"github.com/quotientlabs/quotient/region/policysync"
)

// TestFollowerRoundTrips: through a broker one round trip (RTT = 2 x the
// injected one-way delay, 400 ms) away,
//
//   - after KafkaLog.Prepare, every Append (the first too) costs one
//     produce round trip (at most 1.5 RTT);
//   - a Follower started on a topic holding records is Ready (it has read
//     them all) within 16 RTT of Run: partitions (2 RTT measured), end
//     offsets (3), kafka-go's reader start (leader lookup, dial, first and
//     last offsets: ~7) and one fetch, 13 RTT measured; waiting for an
//     empty fetch to tell the end of the log would add 12.5 RTT (5 s);
//   - a record appended later reaches it about one RTT after Append is
//     called, whatever the phase of its fetches: at most 2.5 RTT each, at
//     most 1.5 RTT for the median;
//   - Run returns promptly (well within the 5 s a fetch is held) when its
//     context ends.
//
// With the former 100 ms fetch wait kafka-go's reader gave up on every
// fetch that found nothing after 100 ms, long before the broker's answer
// came back, dropped its connection and fetched again, so records appended
// after start-up did not arrive.
func TestFollowerRoundTrips(t *testing.T) {
	const oneWay = 200 * time.Millisecond
	const rtt = 2 * oneWay
	inRTT := func(d time.Duration) float64 { return float64(d) / float64(rtt) }
	brokers := slowkafka.Start(t, oneWay)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	newCluster := func() *kafkautil.Cluster {
		cl, err := kafkautil.New(kafkautil.DefaultConfig(brokers...))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	require.NoError(t, newCluster().EnsureTopics(ctx, policysync.TopicSpec(1)))
	// The log's cluster has not seen the topic yet, as in a region whose
	// topic Terraform (or another region) created.
	klog, err := policysync.NewKafkaLog(newCluster(), policysync.Topic)
	require.NoError(t, err)
	t.Cleanup(func() { _ = klog.Close() })
	rec := func(v int64) admin.Record {
		// The document is not a valid policy: the Catalog refuses it
		// (Follower.Bad), which is all this test needs of it.
		return admin.Record{Kind: admin.KindPolicy, ID: "p", Version: v, Document: []byte(fmt.Sprintf(`{"v":%d}`, v)), Author: "t", UnixMs: v}
	}
	t0 := time.Now()
	require.NoError(t, klog.Prepare(ctx))
	t.Logf("prepare (metadata, leader connection): %.2f RTT", inRTT(time.Since(t0)))
	const before = 3
	for v := range int64(before) {
		t0 := time.Now()
		require.NoError(t, klog.Append(ctx, rec(1+v)))
		took := time.Since(t0)
		t.Logf("append %d: %.2f RTT", v+1, inRTT(took))
		require.Less(t, inRTT(took), 1.5, "after Prepare an Append costs one produce round trip")
	}

	f := policysync.NewFollower(newCluster(), policysync.Topic, admin.NewCatalog(), nil, nil)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	t0 = time.Now()
	go func() { done <- f.Run(runCtx) }()
	// waitFor polls cond every 5 ms (1/80 RTT) up to 25 RTT.
	waitFor := func(what string, cond func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for !cond() {
			select {
			case err := <-done:
				t.Fatalf("%s: Run returned: %v", what, err)
			case <-time.After(5 * time.Millisecond):
			}
			if time.Since(start) > 25*rtt {
				t.Fatalf("%s: not within %v (25 RTT)", what, 25*rtt)
			}
		}
		return time.Since(start)
	}
	waitFor("ready", f.Ready)
	ready := time.Since(t0)
	t.Logf("ready %.2f RTT after Run, %d records read", inRTT(ready), f.Records())
	require.EqualValues(t, before, f.Records(), "ready means every record on the topic at start was read")
	require.Less(t, inRTT(ready), 16.0, "start-up should not wait for an empty fetch")

	const n = 6
	var deliveries []time.Duration
	for i := range n {
		time.Sleep(rtt * time.Duration(3+i%3) / 2) // phase spread over the fetch cycle, not a wait for a result
		want := int64(before + i + 1)
		t0 := time.Now()
		require.NoError(t, klog.Append(ctx, rec(want)))
		waitFor(fmt.Sprintf("record %d", want), func() bool { return f.Records() >= want })
		deliveries = append(deliveries, time.Since(t0))
		require.Equal(t, want, f.Records())
	}
	for i, d := range deliveries {
		t.Logf("record %d: read %.2f RTT after Append was called", before+i+1, inRTT(d))
	}
	for i, d := range deliveries {
		require.Less(t, inRTT(d), 2.5, "record %d: delivery should cost one round trip, two when the fetch was on its way back", before+i+1)
	}
	slices.Sort(deliveries)
	require.Less(t, inRTT(deliveries[n/2]), 1.5, "median delivery should cost one round trip")

	t0 = time.Now()
	stop()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(3 * time.Second):
		t.Fatal("Run did not return within 3 s of its context ending: it waited for the fetch the broker holds")
	}
	t.Logf("Run returned %v after its context ended", time.Since(t0).Round(time.Millisecond))
}
