package kafkabus_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
)

// Both adapters refuse an epoch length that is not a positive whole
// number of milliseconds, naming the adapter.
func TestAdaptersCheckTheEpoch(t *testing.T) {
	bus := newBus(t, startKafka(t), nil)
	tbus, _ := newTransferBus(t, startKafka(t), nil)
	for _, epoch := range []time.Duration{0, -time.Second, 1500 * time.Microsecond} {
		_, err := kafkabus.NewAdapter(bus, epoch, nil)
		require.ErrorIs(t, err, kafkabus.ErrConfig)
		assert.ErrorContains(t, err, "adapter: epoch "+epoch.String()+" is not a positive whole number of milliseconds")
		_, err = kafkabus.NewTransferAdapter(tbus, epoch, nil)
		require.ErrorIs(t, err, kafkabus.ErrConfig)
		assert.ErrorContains(t, err, "transfer adapter: epoch "+epoch.String()+" is not a positive whole number of milliseconds")
	}
	_, err := kafkabus.NewTransferAdapter(nil, time.Second, nil)
	assert.ErrorIs(t, err, kafkabus.ErrConfig)
}

// Both adapters drop what comes with another epoch length, count it and
// pass its error to OnReject, and go on delivering.
func TestAdaptersRejectOtherEpochLengths(t *testing.T) {
	brokers := startKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	t.Run("reports", func(t *testing.T) {
		bus := newBus(t, brokers, func(c *kafkabus.Config) { c.Topic = "reject.reports" })
		a, err := kafkabus.NewAdapter(bus, 10*time.Second, nil)
		require.NoError(t, err)
		rejected := make(chan error, 4)
		a.OnReject = func(err error) { rejected <- err }
		done := runAdapter(ctx, a.Run)
		other := report("us", 7, 7, 1)
		other.EpochMs = 5_000
		require.NoError(t, bus.Publish(ctx, other))
		require.NoError(t, bus.Publish(ctx, report("us", 8, 8, 1)))
		r, err := a.Receive(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(8), r.Epoch, "the report of the same epoch length comes through")
		assert.ErrorIs(t, first(t, rejected), kafkabus.ErrEpochMismatch)
		assert.Equal(t, kafkabus.AdapterStats{Delivered: 1, Rejected: 1}, a.Stats())
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)
	})
	ctx, cancel = context.WithTimeout(context.Background(), wait)
	defer cancel()
	t.Run("transfers", func(t *testing.T) {
		bus, _ := newTransferBus(t, brokers, func(c *kafkabus.TransferConfig) { c.Topic = "reject.transfers" })
		a, err := kafkabus.NewTransferAdapter(bus, 10*time.Second, nil)
		require.NoError(t, err)
		rejected := make(chan error, 4)
		a.OnReject = func(err error) { rejected <- err }
		done := runAdapter(ctx, a.Run)
		other := ask("us", 1)
		other.EpochMs = 5_000
		require.NoError(t, bus.PublishAsk(ctx, other))
		require.NoError(t, bus.PublishAsk(ctx, ask("us", 2)))
		got, _, err := a.ReceiveTransfer(ctx)
		require.NoError(t, err)
		require.NotNil(t, got)
		assert.Len(t, got.Keys, 2, "the ask of the same epoch length comes through")
		assert.ErrorIs(t, first(t, rejected), kafkabus.ErrEpochMismatch)
		assert.Equal(t, int64(1), a.Rejected())
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)
	})
}

func runAdapter(ctx context.Context, run func(context.Context) error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	return done
}

// first returns the first error on ch, failing after wait.
func first(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(wait):
		t.Fatalf("nothing rejected within %v", wait)
		return nil
	}
}
