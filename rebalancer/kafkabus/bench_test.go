package kafkabus_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkPublishConsume100kKeys measures one epoch's exchange for one
// region: a 100,000-key report published in parts (1 MB messages, lz4,
// acks=all) and consumed whole, through kfake on loopback.
func BenchmarkPublishConsume100kKeys(b *testing.B) {
	brokers := startKafka(b)
	pub := newBus(b, brokers, nil)
	sub := newBus(b, brokers, nil)
	c := consume(b, sub)
	r := report("us", 1, 1, 100_000)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		r.Seq, r.Epoch = int64(i+1), int64(i+1)
		require.NoError(b, pub.Publish(ctx, r))
		got := c.next(b)
		require.Len(b, got.GetKeys(), 100_000)
	}
	b.StopTimer()
	s := pub.Stats()
	b.ReportMetric(float64(s.PublishedParts)/float64(s.PublishedReports), "parts/report")
	b.ReportMetric(float64(100_000*b.N)/b.Elapsed().Seconds(), "keys/s")
}
