package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/kafkautil"
)

// startFaulty runs devkafka with args and returns its address.
func startFaulty(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	lines := make(lineWriter, 8)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"--listen", "127.0.0.1:0", "--partitions", "1"}, args...), lines, testWriter{t})
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case addr := <-lines:
		return addr
	case err := <-done:
		t.Fatalf("run returned early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no listen address printed within 10s")
	}
	return ""
}

// produce writes n messages to topic, one produce request each, and
// returns the topic's end offset once it stops changing (bounded wait).
func produce(t *testing.T, addr, topic string, n int, want int64) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kafkautil.New(kafkautil.DefaultConfig(addr))
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.EnsureTopics(ctx, kafkautil.RetainedTopic(topic, 1, 1, time.Hour)))
	w, err := cl.NewWriter(kafkautil.DefaultWriterConfig(topic))
	require.NoError(t, err)
	for i := range n {
		require.NoError(t, w.WriteMessages(ctx, kafka.Message{Key: []byte{byte(i)}, Value: []byte("v")}), "every write is acknowledged")
	}
	require.NoError(t, w.Close())
	conn, err := kafka.DialLeader(ctx, "tcp", addr, topic, 0)
	require.NoError(t, err)
	defer conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		end, err := conn.ReadLastOffset()
		require.NoError(t, err)
		if end == want || time.Now().After(deadline) {
			return end
		}
		time.Sleep(20 * time.Millisecond) // bounded poll: the copies are written asynchronously
	}
}

// TestProduceFaults: with --drop-produce 1 every write to the fault topic
// is acknowledged and nothing is stored; with --duplicate-produce 1 every
// write is stored twice (the copy not again); other topics are untouched.
func TestProduceFaults(t *testing.T) {
	addr := startFaulty(t, "--drop-produce", "1", "--fault-topic", "lossy")
	assert.Equal(t, int64(0), produce(t, addr, "lossy", 3, 0), "lost writes are not stored")
	assert.Equal(t, int64(2), produce(t, addr, "other", 2, 2), "other topics keep every write")

	addr = startFaulty(t, "--duplicate-produce", "1", "--fault-topic", "dup")
	assert.Equal(t, int64(6), produce(t, addr, "dup", 3, 6), "each write stored twice")
}

func TestProduceFaultsRejectsBadFlags(t *testing.T) {
	for want, args := range map[string][]string{
		"--drop-produce 2: want a probability":       {"--drop-produce", "2"},
		"--duplicate-produce -1: want a probability": {"--duplicate-produce", "-1"},
		"more than 1": {"--drop-produce", "0.6", "--duplicate-produce", "0.6"},
	} {
		err := run(context.Background(), args, io.Discard, io.Discard)
		require.Error(t, err, "%v", args)
		assert.Contains(t, err.Error(), want)
	}
}

// testWriter logs the broker's stderr lines.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }
