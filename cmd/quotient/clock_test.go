package main

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/internal/redistest"
	quotientv1 "github.com/quotientlabs/quotient/proto/quotient/v1"
	"github.com/quotientlabs/quotient/rebalancer/kafkabus"
	"github.com/quotientlabs/quotient/region/membership"
)

// epochAt is the epoch number of t for an epoch of length epoch.
func epochAt(t time.Time, epoch time.Duration) int64 {
	return t.UnixMilli() / epoch.Milliseconds()
}

// TestCoordinatorClockOffset: a coordinator started with --clock-offset
// (here -45 min, 2,700 epochs of 1 s) numbers its epochs by its shifted
// clock: the report it publishes to Kafka, the epoch it claims in the
// fence and its sent_unix_ms stamp all lie between the shifted times
// before its start and after the report was read, and none is near the
// unshifted clock's epoch.
func TestCoordinatorClockOffset(t *testing.T) {
	const offset = -45 * time.Minute
	const epoch = time.Second
	srv := redistest.StartServer(t)
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	env, errb := coordinatorEnvOf(map[string]string{"QUOTIENT_CLOCK_OFFSET": offset.String()})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan int, 1)
	before := time.Now()
	go func() {
		done <- run(ctx, env, []string{"coordinator", "--region", "a", "--regions", "a", "--redis", srv.Addr(),
			"--kafka", kc.ListenAddrs()[0], "--listen", addr, "--epoch", epoch.String(),
			"--policies", writePolicies(t, globalPolicy)})
	}()

	// Read the usage topic as a coordinator of another region would, with
	// a lookback that reaches the shifted stamps.
	cl, err := kafkautil.New(kafkautil.DefaultConfig(kc.ListenAddrs()[0]))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	bcfg := kafkabus.DefaultConfig()
	bcfg.Lookback = 2 * time.Hour
	bus, err := kafkabus.New(cl, bcfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = bus.Close() })
	var mu sync.Mutex
	var got *quotientv1.UsageReport
	first := make(chan struct{})
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	go func() {
		_ = bus.Run(rctx, func(r *quotientv1.UsageReport) {
			mu.Lock()
			defer mu.Unlock()
			if got == nil {
				got = r
				close(first)
			}
		})
	}()
	select {
	case <-first:
	case code := <-done:
		t.Fatalf("coordinator exited with %d: %s", code, errb.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("no report within 60 s: %s", errb.String())
	}
	after := time.Now()
	rcancel()
	mu.Lock()
	rep := got
	mu.Unlock()

	lo, hi := epochAt(before.Add(offset), epoch), epochAt(after.Add(offset), epoch)
	assert.Equal(t, "a", rep.GetRegion())
	assert.GreaterOrEqual(t, rep.GetEpoch(), lo, "report epoch by the shifted clock")
	assert.LessOrEqual(t, rep.GetEpoch(), hi, "report epoch by the shifted clock")
	assert.GreaterOrEqual(t, rep.GetSentUnixMs(), before.Add(offset).UnixMilli(), "sent_unix_ms by the shifted clock")
	assert.LessOrEqual(t, rep.GetSentUnixMs(), after.Add(offset).UnixMilli(), "sent_unix_ms by the shifted clock")
	last, ok, err := membership.NewFence(redis.NewClient(&redis.Options{Addr: srv.Addr()}), "a").Last(t.Context())
	require.NoError(t, err)
	require.True(t, ok, "the coordinator claimed an epoch")
	assert.GreaterOrEqual(t, last, rep.GetEpoch(), "fence claimed by the shifted clock")
	assert.LessOrEqual(t, last, epochAt(time.Now().Add(offset), epoch), "fence claimed by the shifted clock")
	assert.Less(t, last, epochAt(before, epoch)-2000, "not the unshifted clock's epoch")
	assert.Contains(t, errb.String(), "--clock-offset is set")

	// /healthz judges the last collection by the same clock: healthy.
	resp, err := http.Get("http://" + addr + "/healthz")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	cancel()
	select {
	case code := <-done:
		assert.Equal(t, 0, code, errb.String())
	case <-time.After(30 * time.Second):
		t.Fatal("coordinator did not stop within 30 s of cancel")
	}
}

// TestGatewayClockOffset: a gateway started with --clock-offset counts the
// usage of global policies in the epochs of its shifted clock: the usage
// hash it flushes to Redis (qv:{epoch:shard}) is numbered by the shifted
// clock, not the system's.
func TestGatewayClockOffset(t *testing.T) {
	const offset = 37 * time.Minute
	const epoch = time.Second
	srv := redistest.StartServer(t)
	up := upstream(t)
	dir := t.TempDir()
	before := time.Now()
	base, stderr, stop := startGateway(t,
		"--upstream", up.URL, "--redis", srv.Addr(), "--region", "a", "--regions", "a,b",
		"--policies", gwFile(t, dir, "p.json", `[{"id":"g","match":{"tier":"pro"},"algorithm":"token_bucket","rate_per_sec":100,"burst":100,"scope":"global"}]`),
		"--keys", gwFile(t, dir, "k.json", gatewayKeys),
		"--epoch", epoch.String(), "--usage-flush", "50ms", "--clock-offset", offset.String())
	c := &http.Client{Timeout: 10 * time.Second}
	resp, _ := get(t, c, base+"/v1/orders", map[string]string{"X-API-Key": "k1"})
	require.Equal(t, http.StatusOK, resp.StatusCode)

	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	var keys []string
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for len(keys) == 0 {
		var err error
		keys, err = rc.Keys(t.Context(), "qv:{*").Result()
		require.NoError(t, err)
		if len(keys) == 0 {
			require.True(t, time.Now().Before(deadline), "no usage flushed within 20 s: %s", stderr.String())
			<-tick.C
		}
	}
	after := time.Now()
	require.Len(t, keys, 1, "one request, one epoch")
	e, err := strconv.ParseInt(strings.SplitN(strings.TrimPrefix(keys[0], "qv:{"), ":", 2)[0], 10, 64)
	require.NoError(t, err, keys[0])
	assert.GreaterOrEqual(t, e, epochAt(before.Add(offset), epoch), "usage epoch by the shifted clock")
	assert.LessOrEqual(t, e, epochAt(after.Add(offset), epoch), "usage epoch by the shifted clock")
	assert.Contains(t, stderr.String(), "--clock-offset is set")
	stop()
}

// TestClockOffsetBadInput: an offset beyond ±1h, or not a duration, exits
// 2 naming the flag, on every command that has it.
func TestClockOffsetBadInput(t *testing.T) {
	good := writePolicies(t, globalPolicy)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"coordinator too far", []string{"coordinator", "--region", "a", "--regions", "a", "--policies", good, "--clock-offset", "2h"}, "--clock-offset 2h0m0s: want a duration within ±1h"},
		{"coordinator not a duration", []string{"coordinator", "--region", "a", "--regions", "a", "--policies", good, "--clock-offset", "soon"}, "-clock-offset"},
		{"rls too far", []string{"rls", "--redis", "x:1", "--config-dir", t.TempDir(), "--clock-offset", "3h"}, "--clock-offset 3h0m0s: want a duration within ±1h"},
		{"gateway too far", []string{"gateway", "--upstream", "http://127.0.0.1:1", "--redis", "x:1", "--policies", good, "--clock-offset", "-61m"}, "--clock-offset -1h1m0s: want a duration within ±1h"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, errb := coordinatorEnvOf(nil)
			assert.Equal(t, 2, run(t.Context(), env, tc.args))
			assert.Contains(t, errb.String(), tc.want)
		})
	}
}
