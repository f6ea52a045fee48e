package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/kafkautil"
)

// lineWriter hands each written line to a channel.
type lineWriter chan string

func (w lineWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimSpace(string(p)), "\n") {
		w <- l
	}
	return len(p), nil
}

func TestRunServesKafkaUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lines := make(lineWriter, 8)
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--partitions", "2"}, lines, io.Discard) }()

	var addr string
	select {
	case addr = <-lines:
	case err := <-done:
		t.Fatalf("run returned early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no listen address printed within 10s")
	}
	require.True(t, strings.HasPrefix(addr, "127.0.0.1:"), "printed %q", addr)

	cl, err := kafkautil.New(kafkautil.DefaultConfig(addr))
	require.NoError(t, err)
	defer cl.Close()
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	require.NoError(t, cl.EnsureTopics(wctx, kafkautil.RetainedTopic("dev", 2, 1, time.Hour)))
	w, err := cl.NewWriter(kafkautil.DefaultWriterConfig("dev"))
	require.NoError(t, err)
	require.NoError(t, w.WriteMessages(wctx, kafka.Message{Key: []byte("k"), Value: []byte("v")}))
	require.NoError(t, w.Close())

	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return within 10s of cancel")
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	cases := map[string][]string{
		"want at least 1":  {"--partitions", "0"},
		"want host:port":   {"--listen", "localhost"},
		"not a number":     {"--listen", "127.0.0.1:http"},
		"unexpected argum": {"extra"},
	}
	for want, args := range cases {
		err := run(context.Background(), args, io.Discard, &bytes.Buffer{})
		require.Error(t, err, "%v", args)
		assert.Contains(t, err.Error(), want)
	}
}
