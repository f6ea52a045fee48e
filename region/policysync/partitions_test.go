package policysync_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/region/admin"
	"github.com/quotientlabs/quotient/region/policysync"
)

// TestFollowerReadsPartitionsAddedLater: a Follower started on a topic of
// one partition reads the records of a partition added to the topic while
// it runs (operators add partitions; the log's producer then writes some
// policies there), and is Ready by the records on the topic at start.
// Before it read through kafkautil.ConsumeTopics it read only the
// partitions it found at start, so the added partition's record never
// arrived.
func TestFollowerReadsPartitionsAddedLater(t *testing.T) {
	fake, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(fake.Close)
	cl, err := kafkautil.New(kafkautil.DefaultConfig(fake.ListenAddrs()...))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec := policysync.TopicSpec(1) // one partition
	require.NoError(t, cl.EnsureTopics(ctx, spec))

	produce := func(partition int, v int64) {
		t.Helper()
		b, err := policysync.Encode(admin.Record{Kind: admin.KindPolicy, ID: fmt.Sprintf("p%d", v), Version: v,
			Document: []byte(`{"v":1}`), Author: "t", UnixMs: v})
		require.NoError(t, err)
		resp, err := cl.Client().Produce(ctx, &kafka.ProduceRequest{
			Topic: policysync.Topic, Partition: partition, RequiredAcks: kafka.RequireAll,
			Records: kafka.NewRecordReader(kafka.Record{Value: kafka.NewBytes(b)}),
		})
		require.NoError(t, err)
		require.NoError(t, resp.Error)
	}
	produce(0, 1)
	produce(0, 2)

	f := policysync.NewFollower(cl, policysync.Topic, admin.NewCatalog(), nil, nil)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(runCtx) }()
	require.Eventually(t, f.Ready, 30*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 2, f.Records(), "ready means every record on the topic at start was read")

	resp, err := cl.Client().CreatePartitions(ctx, &kafka.CreatePartitionsRequest{
		Topics: []kafka.TopicPartitionsConfig{{Name: policysync.Topic, Count: 2}},
	})
	require.NoError(t, err)
	require.NoError(t, resp.Errors[policysync.Topic])
	require.Eventually(t, func() bool {
		ids, err := cl.Partitions(ctx, policysync.Topic)
		return err == nil && len(ids) == 2
	}, 30*time.Second, 20*time.Millisecond)
	produce(1, 3)
	// ConsumeTopics looks for added partitions every 5 s.
	require.Eventually(t, func() bool { return f.Records() == 3 }, 30*time.Second, 20*time.Millisecond,
		"the record of the added partition")

	stop()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10 s of its context's end")
	}
}
