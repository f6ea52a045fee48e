package limiter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// TestUsageOverflowIsCountedPerEpoch: usage dropped at UsageMaxKeys is
// remembered per epoch for the flusher (each key once per epoch, every
// attempt) and counted in the overflow metrics.
func TestUsageOverflowIsCountedPerEpoch(t *testing.T) {
	clock := newManualClock()
	reg := prometheus.NewRegistry()
	l, err := New(Config{Clock: clock, Metrics: reg, UsageMaxKeys: 2}, mustPolicies(t, usagePolicies))
	require.NoError(t, err)
	e := clock.Now().UnixMilli() / 10_000

	hammer(t, l, "a", "b", "c", "d") // 3 attempts each; c and d dropped
	assert.Equal(t, []UsageOverflow{{Epoch: e, Keys: 2, Requests: 6}}, l.usage.takeOverflow())
	assert.Empty(t, l.usage.takeOverflow(), "taken")
	require.Len(t, l.usage.take(), 2)

	// Room again, but the bound is full of nothing: new keys are counted.
	hammer(t, l, "c")
	assert.Empty(t, l.usage.takeOverflow(), "c fits after the flush took the counts")
	hammer(t, l, "x", "d") // x fits (2 held: c, x); d is dropped again this epoch
	assert.Equal(t, []UsageOverflow{{Epoch: e, Keys: 0, Requests: 3}}, l.usage.takeOverflow(),
		"d was dropped in this epoch already: a marker, not a new key")

	clock.Advance(10 * time.Second)
	hammer(t, l, "d") // a new epoch: d is a new key of its overflow
	assert.Equal(t, []UsageOverflow{{Epoch: e + 1, Keys: 1, Requests: 3}}, l.usage.takeOverflow())

	assert.Equal(t, 3.0, gatherValue(t, reg, "quotient_limiter_usage_overflow_keys_total", nil))
	assert.Equal(t, 12.0, gatherValue(t, reg, "quotient_limiter_usage_overflow_requests_total", nil))
	assert.Equal(t, 12.0, gatherValue(t, reg, "quotient_limiter_usage_dropped_total", nil))
}

// TestUsageOverflowReachesTheCoordinator: a flush writes the overflow
// marker of the epoch to Redis beside the counts, and
// CollectUsageOverflow reads it; an epoch without drops has none.
func TestUsageOverflowReachesTheCoordinator(t *testing.T) {
	for name, start := range map[string]func(t *testing.T) *usageServer{
		"standalone": startUsageStandalone, "cluster": startUsageCluster,
	} {
		t.Run(name, func(t *testing.T) {
			srv := start(t)
			clock := wallClock()
			l, err := New(Config{Clock: clock, UsageMaxKeys: 1}, mustPolicies(t, usagePolicies))
			require.NoError(t, err)
			f := NewUsageFlusher(l, NewRedisUsageSink(srv.client, 4, 10*time.Second, 3), UsageFlusherConfig{})
			ctx := context.Background()
			e := clock.Now().UnixMilli() / 10_000

			hammer(t, l, "a")
			require.NoError(t, f.Flush(ctx, clock.Now()))
			_, ok, err := CollectUsageOverflow(ctx, srv.client, e)
			require.NoError(t, err)
			assert.False(t, ok, "nothing dropped yet")

			hammer(t, l, "b", "c") // b fits (a was flushed); c is dropped
			require.NoError(t, f.Flush(ctx, clock.Now()))
			hammer(t, l, "d", "e") // d fits (b was flushed); e is dropped: the marker adds up
			require.NoError(t, f.Flush(ctx, clock.Now()))
			o, ok, err := CollectUsageOverflow(ctx, srv.client, e)
			require.NoError(t, err)
			require.True(t, ok)
			assert.Equal(t, UsageOverflow{Epoch: e, Keys: 2, Requests: 6}, o)
			ttl, err := srv.client.PTTL(ctx, UsageOverflowKey(e)).Result()
			require.NoError(t, err)
			assert.Greater(t, ttl, 25*time.Second, "expires with the epoch's usage")
			assert.LessOrEqual(t, ttl, 40*time.Second)

			totals, err := CollectUsageTotals(ctx, srv.client, e, 4)
			require.NoError(t, err, "the marker is no usage field")
			assert.Len(t, totals, 3, "a, b and d")
			_, ok, err = CollectUsageOverflow(ctx, srv.client, e+1)
			require.NoError(t, err)
			assert.False(t, ok)
		})
	}
}

// TestUsageOverflowMarkerIsRetried: a marker the sink could not write is
// written by the next flush, before that flush's counts.
func TestUsageOverflowMarkerIsRetried(t *testing.T) {
	clock := newManualClock()
	l, err := New(Config{Clock: clock, UsageMaxKeys: 1}, mustPolicies(t, usagePolicies))
	require.NoError(t, err)
	sink := &overflowSink{fail: 1}
	f := NewUsageFlusher(l, sink, UsageFlusherConfig{})
	ctx := context.Background()
	e := clock.Now().UnixMilli() / 10_000

	hammer(t, l, "a", "b")
	require.ErrorIs(t, f.Flush(ctx, clock.Now()), ErrStoreUnavailable)
	assert.Empty(t, sink.ovf)
	assert.Len(t, sink.counts, 1, "the counts are written all the same")
	require.NoError(t, f.Flush(ctx, clock.Now()))
	assert.Equal(t, []UsageOverflow{{Epoch: e, Keys: 1, Requests: 3}}, sink.ovf)
	assert.Equal(t, []string{"overflow", "counts", "overflow"}, sink.order)
}

type overflowSink struct {
	recordingSink
	fail  int
	ovf   []UsageOverflow
	order []string
}

var _ UsageOverflowSink = (*overflowSink)(nil)

func (s *overflowSink) WriteUsage(ctx context.Context, counts []UsageCount) ([]UsageCount, error) {
	s.order = append(s.order, "counts")
	return s.recordingSink.WriteUsage(ctx, counts)
}

func (s *overflowSink) WriteUsageOverflow(_ context.Context, ovf []UsageOverflow) error {
	s.order = append(s.order, "overflow")
	if s.fail > 0 {
		s.fail--
		return errors.Join(ErrStoreUnavailable, errors.New("test: overflow write fails"))
	}
	s.ovf = append(s.ovf, ovf...)
	return nil
}

type usageServer struct{ client redis.UniversalClient }

func startUsageStandalone(t *testing.T) *usageServer {
	return &usageServer{client: redistest.StartServer(t).Client()}
}

func startUsageCluster(t *testing.T) *usageServer {
	return &usageServer{client: redistest.StartCluster(t).Client()}
}
