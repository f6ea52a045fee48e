package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/limiter"
)

// TestGatewayUsageMaxKeys: `quotient gateway --usage-max-keys 2` counts the
// usage of two keys per epoch; the third key's usage is dropped, counted
// in quotient_limiter_usage_overflow_keys_total, and its epoch is marked
// incomplete in Redis (limiter.UsageOverflowKey) for the coordinator.
// A bad value is refused with the flag's name, by quotient rls too.
func TestGatewayUsageMaxKeys(t *testing.T) {
	up := upstream(t)
	dir := t.TempDir()
	policies := gwFile(t, dir, "p.json", globalPolicy)
	keys := gwFile(t, dir, "k.json", `{"k1":{"tier":"pro"},"k2":{"tier":"pro"},"k3":{"tier":"pro"},"k4":{"tier":"pro"},"k5":{"tier":"pro"},"k6":{"tier":"pro"},"k7":{"tier":"pro"},"k8":{"tier":"pro"},"k9":{"tier":"pro"}}`)
	srv := redistest.StartServer(t)

	env := environment{stdout: &syncBuffer{}, stderr: &syncBuffer{}, lookupEnv: func(string) (string, bool) { return "", false }}
	code := run(context.Background(), env, []string{"gateway", "--listen", "127.0.0.1:0", "--upstream", up.URL, "--redis", srv.Addr(),
		"--policies", policies, "--regions", "eu,us", "--region", "eu", "--usage-max-keys", "0"})
	assert.Equal(t, 2, code, "a usage error")
	assert.Contains(t, env.stderr.(*syncBuffer).String(), "--usage-max-keys must be >= 1, got 0")
	env.stderr = &syncBuffer{}
	code = run(context.Background(), env, []string{"rls", "--listen", "127.0.0.1:0", "--redis", srv.Addr(), "--config-dir", dir, "--usage-max-keys", "-5"})
	assert.Equal(t, 2, code, "quotient rls shares the flag")
	assert.Contains(t, env.stderr.(*syncBuffer).String(), "--usage-max-keys must be >= 1, got -5")

	const epoch = time.Hour // one epoch for the whole test, unless it straddles an hour
	base, _, stop := startGateway(t, "--upstream", up.URL, "--redis", srv.Addr(), "--policies", policies, "--keys", keys,
		"--regions", "eu,us", "--region", "eu", "--timeout", "1s", "--epoch", epoch.String(), "--usage-flush", "500ms",
		"--usage-max-keys", "2")
	c := &http.Client{Timeout: 5 * time.Second}
	ctx := context.Background()
	overflowed := func() int {
		_, metrics := get(t, c, base+"/metrics", nil)
		var n int
		for _, line := range strings.Split(string(metrics), "\n") {
			if v, ok := strings.CutPrefix(line, `quotient_limiter_usage_overflow_keys_total{region="eu"} `); ok {
				_, err := fmt.Sscan(v, &n)
				require.NoError(t, err, line)
			}
		}
		return n
	}
	// Three keys within one flush interval: the third overflows. A flush
	// that comes between two of the requests (the machine is slow) empties
	// the held counts, so nothing overflows: try three other keys, as when
	// the requests straddle an epoch boundary.
	var e int64
	sent := 0   // keys sent in epoch e
	before := 0 // keys overflowed before the attempt
	for attempt := 0; ; attempt++ {
		require.Less(t, attempt, 3, "three attempts straddled an epoch boundary or a flush")
		now := time.Now().UnixMilli() / epoch.Milliseconds()
		if now != e {
			e, sent = now, 0
		}
		for _, k := range []string{fmt.Sprintf("k%d", 3*attempt+1), fmt.Sprintf("k%d", 3*attempt+2), fmt.Sprintf("k%d", 3*attempt+3)} {
			resp, body := get(t, c, base+"/v1/orders", map[string]string{"X-API-Key": k})
			require.Equal(t, 200, resp.StatusCode, string(body))
		}
		sent += 3
		after := overflowed()
		if time.Now().UnixMilli()/epoch.Milliseconds() == e && after == before+1 {
			break
		}
		before = after
	}
	// The flusher writes every 500 ms: wait (bounded) for the marker.
	var ovf limiter.UsageOverflow
	require.Eventually(t, func() bool {
		o, ok, err := limiter.CollectUsageOverflow(ctx, srv.Client(), e)
		require.NoError(t, err)
		ovf = o
		return ok
	}, 10*time.Second, 20*time.Millisecond, "no overflow marker for epoch %d", e)
	assert.Equal(t, limiter.UsageOverflow{Epoch: e, Keys: 1, Requests: 1}, ovf)
	require.Eventually(t, func() bool {
		totals, err := limiter.CollectUsageTotals(ctx, srv.Client(), e, limiter.DefaultUsageShards)
		require.NoError(t, err)
		return len(totals) == sent-1
	}, 10*time.Second, 20*time.Millisecond, "the keys that fit are flushed")

	_, metrics := get(t, c, base+"/metrics", nil)
	assert.Contains(t, string(metrics), fmt.Sprintf(`quotient_limiter_usage_overflow_keys_total{region="eu"} %d`+"\n", before+1))
	assert.Contains(t, string(metrics), fmt.Sprintf(`quotient_limiter_usage_overflow_requests_total{region="eu"} %d`+"\n", before+1))
	assert.True(t, strings.Contains(string(metrics), "quotient_limiter_usage_dropped_total"))
	stop()
}
