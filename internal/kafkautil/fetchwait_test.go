package kafkautil_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/internal/kafkautil/slowkafka"
)

// TestPartitionReaderDefaultsToALongPoll: with ReaderConfig's defaults, a
// partition reader of a broker one round trip (RTT, 400 ms) away reads a
// record produced while its fetch is held idle, one RTT after the produce
// is sent at most 2.5 RTT (the fetch may be on its way back empty), and
// Close returns promptly although the broker holds the next fetch 4 s.
// Under the former 500 ms default kafka-go gave up on every idle fetch
// (the broker holds it 375 ms, the answer is 200 ms away) and the record
// was not read within 25 RTT.
func TestPartitionReaderDefaultsToALongPoll(t *testing.T) {
	const oneWay = 200 * time.Millisecond
	const rtt = 2 * oneWay
	inRTT := func(d time.Duration) float64 { return float64(d) / float64(rtt) }
	brokers := slowkafka.Start(t, oneWay)
	cl, err := kafkautil.New(kafkautil.DefaultConfig(brokers...))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, cl.EnsureTopics(ctx, kafkautil.RetainedTopic("far", 1, 1, time.Hour)))
	produce(t, cl, "far", 0, "first")

	r, err := cl.NewPartitionReader("far", 0, kafka.FirstOffset, kafkautil.ReaderConfig{})
	require.NoError(t, err)
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = r.Close()
		}
	})
	read := func() (kafka.Message, error) {
		rctx, cancel := context.WithTimeout(ctx, 25*rtt)
		defer cancel()
		return r.ReadMessage(rctx)
	}
	m, err := read()
	require.NoError(t, err)
	require.Equal(t, "first", string(m.Value))

	time.Sleep(3 * rtt) // the reader's next fetch is held idle at the broker; not a wait for a result
	t0 := time.Now()
	produce(t, cl, "far", 0, "second")
	m, err = read()
	took := time.Since(t0)
	require.NoError(t, err, "a record produced while the fetch was held")
	require.Equal(t, "second", string(m.Value))
	t.Logf("read %.2f RTT after the produce was sent", inRTT(took))
	assert.Less(t, inRTT(took), 2.5)

	time.Sleep(rtt) // the next fetch is on its way or held
	t0 = time.Now()
	require.NoError(t, r.Close())
	closed = true
	t.Logf("Close returned after %v", time.Since(t0).Round(time.Millisecond))
	assert.Less(t, time.Since(t0), 2*time.Second, "Close should not wait for the fetch the broker holds (4 s)")
}

// TestReaderConfigFetchWaitBounds: a fetch wait below MinFetchWait (or
// negative) is refused before any I/O, by NewPartitionReader and by
// ConsumeTopics, with an error naming the wait; zero means the default.
func TestReaderConfigFetchWaitBounds(t *testing.T) {
	assert.Equal(t, 5*time.Second, kafkautil.DefaultFetchWait)
	assert.Equal(t, 2*time.Second, kafkautil.MinFetchWait)
	// Nothing listens there: a config error must come before any dial.
	cl, err := kafkautil.New(kafkautil.DefaultConfig("127.0.0.1:1"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	for _, w := range []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, 1999 * time.Millisecond, -time.Second} {
		_, err := cl.NewPartitionReader("t", 0, kafka.FirstOffset, kafkautil.ReaderConfig{MaxWait: w})
		require.ErrorIs(t, err, kafkautil.ErrConfig, "max wait %v", w)
		assert.ErrorContains(t, err, "fetch wait (max wait) "+w.String()+": want at least 2s")

		err = kafkautil.ConsumeTopics(context.Background(), cl, kafkautil.ConsumeConfig{Topics: []string{"t"}, Reader: kafkautil.ReaderConfig{MaxWait: w}},
			func(context.Context, string, int, kafka.Message) error { return nil })
		require.ErrorIs(t, err, kafkautil.ErrConfig, "max wait %v", w)
		assert.ErrorContains(t, err, "fetch wait (max wait) "+w.String())
	}
	_, err = cl.NewPartitionReader("t", 0, kafka.FirstOffset, kafkautil.ReaderConfig{MaxBytes: -1})
	require.ErrorIs(t, err, kafkautil.ErrConfig)
	assert.ErrorContains(t, err, "max bytes -1")

	r, err := cl.NewPartitionReader("t", 0, kafka.FirstOffset, kafkautil.ReaderConfig{MaxWait: kafkautil.MinFetchWait})
	require.NoError(t, err)
	assert.Equal(t, kafkautil.MinFetchWait, r.Config().MaxWait)
	require.NoError(t, r.Close())
	r, err = cl.NewPartitionReader("t", 0, kafka.FirstOffset, kafkautil.ReaderConfig{})
	require.NoError(t, err)
	assert.Equal(t, kafkautil.DefaultFetchWait, r.Config().MaxWait)
	assert.Equal(t, 4<<20, r.Config().MaxBytes)
	require.NoError(t, r.Close())
}
