package kafkautil_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/internal/kafkautil"
)

func newCluster(t *testing.T) *kafkautil.Cluster {
	t.Helper()
	fake, err := kfake.NewCluster(kfake.NumBrokers(2))
	require.NoError(t, err)
	t.Cleanup(fake.Close)
	cl, err := kafkautil.New(kafkautil.DefaultConfig(fake.ListenAddrs()...))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// TestEnsureTopicsThenWriteAtOnce: topics created through EnsureTopics are
// writable at once by a writer of the same Cluster (no metadata-TTL wait),
// and creating them again is a no-op.
func TestEnsureTopicsThenWriteAtOnce(t *testing.T) {
	cl := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	_, err := cl.Partitions(ctx, "policies")
	require.ErrorIs(t, err, kafkautil.ErrUnknownTopic)

	// The writer exists (and has cached metadata) before the topics do.
	w, err := cl.NewWriter(kafkautil.DefaultWriterConfig("policies"))
	require.NoError(t, err)
	defer w.Close()

	specs := []kafkautil.TopicSpec{
		kafkautil.CompactedTopic("policies", 1, 1),
		kafkautil.RetainedTopic("usage", 4, 1, time.Hour),
	}
	require.NoError(t, cl.EnsureTopics(ctx, specs...))
	require.NoError(t, cl.EnsureTopics(ctx, specs...), "already existing topics are fine")

	ids, err := cl.Partitions(ctx, "usage")
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 2, 3}, ids)

	start := time.Now()
	require.NoError(t, w.WriteMessages(ctx, kafka.Message{Key: []byte("p1"), Value: []byte("v1")}))
	t.Logf("first write after creation took %v", time.Since(start))
}

// TestOffsetsAt: the offset of the first record at or after a time, and the
// end offset when no record is that new.
func TestOffsetsAt(t *testing.T) {
	cl := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, cl.EnsureTopics(ctx, kafkautil.RetainedTopic("t", 1, 1, time.Hour)))
	w, err := cl.NewWriter(kafkautil.DefaultWriterConfig("t"))
	require.NoError(t, err)
	defer w.Close()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 5 {
		require.NoError(t, w.WriteMessages(ctx, kafka.Message{Value: []byte{byte(i)}, Time: t0.Add(time.Duration(i) * time.Minute)}))
	}
	for _, tc := range []struct {
		at   time.Time
		want int64
	}{
		{t0.Add(-time.Hour), 0},
		{t0, 0},
		{t0.Add(90 * time.Second), 2},
		{t0.Add(4 * time.Minute), 4},
		{t0.Add(time.Hour), 5}, // nothing that new: the end
	} {
		got, err := cl.OffsetsAt(ctx, "t", []int{0}, tc.at)
		require.NoError(t, err)
		assert.Equal(t, map[int]int64{0: tc.want}, got, "at %v", tc.at)
	}

	r, err := cl.NewPartitionReader("t", 0, 3, kafkautil.ReaderConfig{})
	require.NoError(t, err)
	defer r.Close()
	m, err := r.ReadMessage(ctx)
	require.NoError(t, err)
	assert.Equal(t, []byte{3}, m.Value)
}

func TestRetryUnknownTopicIsBounded(t *testing.T) {
	calls := 0
	unknown := func() error { calls++; return kafka.UnknownTopicOrPartition }
	b := kafkautil.Backoff{Min: time.Millisecond, Max: 2 * time.Millisecond, Total: 10 * time.Millisecond}
	err := kafkautil.RetryUnknownTopic(context.Background(), b, unknown)
	require.ErrorIs(t, err, kafka.UnknownTopicOrPartition)
	assert.Greater(t, calls, 1)

	// Other errors are not retried.
	calls = 0
	other := errors.New("boom")
	err = kafkautil.RetryUnknownTopic(context.Background(), b, func() error { calls++; return other })
	require.ErrorIs(t, err, other)
	assert.Equal(t, 1, calls)

	// A cancelled context stops the wait and says why.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = kafkautil.RetryUnknownTopic(ctx, kafkautil.DefaultBackoff(), unknown)
	require.ErrorIs(t, err, context.Canceled)
	assert.True(t, kafkautil.IsUnknownTopic(err))
}

func TestConfigErrorsNameTheField(t *testing.T) {
	_, err := kafkautil.New(kafkautil.Config{})
	require.ErrorIs(t, err, kafkautil.ErrConfig)
	assert.Contains(t, err.Error(), "brokers")

	_, err = kafkautil.New(kafkautil.DefaultConfig("localhost"))
	require.ErrorIs(t, err, kafkautil.ErrConfig)
	assert.Contains(t, err.Error(), `brokers[0] "localhost"`)

	cfg := kafkautil.DefaultConfig("127.0.0.1:9092")
	cfg.DialTimeout = -time.Second
	_, err = kafkautil.New(cfg)
	assert.ErrorContains(t, err, "dial timeout")
	cfg = kafkautil.DefaultConfig("127.0.0.1:9092")
	cfg.IdleTimeout = -time.Second
	_, err = kafkautil.New(cfg)
	assert.ErrorContains(t, err, "idle timeout")

	cl, err := kafkautil.New(kafkautil.DefaultConfig("127.0.0.1:9092"))
	require.NoError(t, err)
	err = cl.EnsureTopics(context.Background(), kafkautil.TopicSpec{Name: "x", Partitions: 0, ReplicationFactor: 1})
	require.ErrorIs(t, err, kafkautil.ErrConfig)
	assert.Contains(t, err.Error(), `topic "x": partitions 0`)
	_, err = cl.NewWriter(kafkautil.WriterConfig{})
	assert.ErrorIs(t, err, kafkautil.ErrConfig)
}
