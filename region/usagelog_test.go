package region

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
	"github.com/quotientlabs/quotient/rebalancer/redisio"
)

// A usage field the coordinator cannot parse is no longer silent: it is
// counted in a metric and logged, and the fields that parse still count.
func TestSkippedUsageFieldsAreCountedAndLogged(t *testing.T) {
	client := redistest.StartServer(t).Client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	epoch := time.Now().UnixMilli() / 10_000
	key := limiter.UsageKey(epoch, 0)
	require.NoError(t, client.HSet(ctx, key, "d:g:k:good", 3, "a:g:k:good", 2, "d:g:zz:unknown-kind", 5).Err())

	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	u := newLoggedUsage(redisio.NewSource(client, 1), slog.New(slog.NewTextHandler(&logs, nil)), reg)
	got, err := u.Usage(ctx, epoch)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, int64(3), got[0].Demand)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP quotient_coordinator_usage_bad_fields_total Usage entries read from this region's Redis and skipped because they do not parse (each epoch with any also logs the first one).
# TYPE quotient_coordinator_usage_bad_fields_total counter
quotient_coordinator_usage_bad_fields_total 1
`), "quotient_coordinator_usage_bad_fields_total"))
	assert.Contains(t, logs.String(), "usage fields skipped")
	assert.Contains(t, logs.String(), "d:g:zz:unknown-kind")

	// The next epoch without bad fields logs nothing more.
	logs.Reset()
	_, err = u.Usage(ctx, epoch+1)
	require.NoError(t, err)
	assert.Empty(t, logs.String())
}
