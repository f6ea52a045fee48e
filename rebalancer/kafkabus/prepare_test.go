package kafkabus_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
)

// Both buses prepare their producer the same way: Prepare creates the
// topic and succeeds on a live cluster; after Close it fails with
// ErrClosed, and each failure counts in PrepareErrors.
func TestPrepareOfBothBuses(t *testing.T) {
	brokers := startKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cluster := func(t *testing.T) *kafkautil.Cluster {
		cl, err := kafkautil.New(kafkautil.DefaultConfig(brokers...))
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, cl.Close()) })
		return cl
	}
	check := func(t *testing.T, prepare func(context.Context) error, errs func() int64, closeBus func() error) {
		require.NoError(t, prepare(ctx))
		assert.Zero(t, errs())
		require.NoError(t, closeBus())
		assert.ErrorIs(t, prepare(ctx), kafkabus.ErrClosed)
		assert.ErrorIs(t, prepare(ctx), kafkabus.ErrClosed)
		assert.Equal(t, int64(2), errs())
	}
	t.Run("reports", func(t *testing.T) {
		cfg := kafkabus.DefaultConfig()
		cfg.Topic = "prep.reports"
		b, err := kafkabus.New(cluster(t), cfg)
		require.NoError(t, err)
		check(t, b.Prepare, func() int64 { return b.Stats().PrepareErrors }, b.Close)
	})
	t.Run("transfers", func(t *testing.T) {
		cfg := kafkabus.DefaultTransferConfig()
		cfg.Topic = "prep.transfers"
		b, err := kafkabus.NewTransferBus(cluster(t), cfg)
		require.NoError(t, err)
		check(t, b.Prepare, func() int64 { return b.Stats().PrepareErrors }, b.Close)
	})
}

// A TransferBus's Run waits for a consumed topic that does not exist and
// counts it in MissingTopics, as a Bus's does.
func TestTransferBusCountsMissingTopics(t *testing.T) {
	brokers := startKafka(t)
	b, _ := newTransferBus(t, brokers, func(c *kafkabus.TransferConfig) {
		c.ConsumeTopics = []string{"no.such.topic"}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx, func(*quotientv1.TransferMessage) {}) }()
	require.Eventually(t, func() bool { return b.Stats().MissingTopics == 1 }, wait, 10*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(wait):
		t.Fatalf("Run did not return within %v of cancel", wait)
	}
}
