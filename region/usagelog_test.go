package region

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
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
	require.NoError(t, client.HSet(ctx, key, "g:k:good", 3<<32+2, "g:zz:unknown-kind", 5<<32).Err()) // packed: demand<<32 + admitted

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
	assert.Contains(t, logs.String(), "g:zz:unknown-kind")

	// The next epoch without bad fields logs nothing more.
	logs.Reset()
	_, err = u.Usage(ctx, epoch+1)
	require.NoError(t, err)
	assert.Empty(t, logs.String())
}

// An old epoch's usage that the source could not unlink is counted in a
// metric: here the coordinator's Redis user may not run UNLINK, so every
// collection's unlink fails while the usage itself is still read.
func TestUnlinkFailuresAreCounted(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin := srv.Client()
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "coordinator", "on", ">pw", "~*", "&*", "+@all", "-unlink").Err())
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "coordinator", Password: "pw"})
	t.Cleanup(func() { _ = client.Close() })
	epoch := time.Now().UnixMilli() / 10_000
	require.NoError(t, admin.HSet(ctx, limiter.UsageKey(epoch, 0), "g:k:good", 3<<32+2).Err()) // packed: demand<<32 + admitted
	old := limiter.UsageKey(epoch-redisio.UnlinkLagEpochs, 0)
	require.NoError(t, admin.HSet(ctx, old, "g:k:good", 1<<32).Err())

	reg := prometheus.NewRegistry()
	u := newLoggedUsage(redisio.NewSource(client, 1), slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	got, err := u.Usage(ctx, epoch)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, int64(3), got[0].Demand)
	n, err := admin.Exists(ctx, old).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "the old epoch's hash is still there (UNLINK denied)")
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP quotient_coordinator_usage_unlink_failures_total Collections whose deletion (UNLINK) of the usage hashes and overflow marker of the epoch two before failed: those keys were not freed in the background and will expire by themselves, which frees them on redis-server's main thread unless lazyfree-lazy-expire is yes (README, "Expiry of usage hashes").
# TYPE quotient_coordinator_usage_unlink_failures_total counter
quotient_coordinator_usage_unlink_failures_total 1
`), "quotient_coordinator_usage_unlink_failures_total"))
}
