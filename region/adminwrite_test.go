package region_test

import (
	"bytes"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/quotientlabs/quotient/region"
)

// TestAdminWriteReachesTheShares: a policy written through this
// coordinator's own admin API is the limit its share computation uses as
// soon as the write returns. The API applies its record to the catalog at
// once, so the policy-log follower that reads it back later sees nothing
// new; without a notification from the API itself the coordinator kept
// computing shares from the old limit (found by the end-to-end test of the
// binaries: the region that took the write stayed at the old default while
// the others grew into the raised limit, Σ 43.3 of 40/s).
func TestAdminWriteReachesTheShares(t *testing.T) {
	c, kc, _ := runControlPlane(t, "eu", "us")
	base := "http://" + c.Addr()
	until(t, wait, "ready", func() bool { code, _ := get(t, base+"/readyz"); return code == http.StatusOK })
	put := func(expected int, rate int) {
		t.Helper()
		body := []byte(`{"expected_version":` + strconv.Itoa(expected) + `,"enforce":true,"policy":{"algorithm":"token_bucket","rate_per_sec":` + strconv.Itoa(rate) + `,"burst":` + strconv.Itoa(rate) + `,"scope":"global"}}`)
		req, err := http.NewRequestWithContext(t.Context(), "PUT", base+"/v1/policies/g", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Less(t, resp.StatusCode, 300, "PUT answered %d", resp.StatusCode)
	}
	put(0, 20)
	lim, ok := region.PolicyLimit(c, "g")
	require.True(t, ok, "the first write is in force when the PUT returns")
	assert.Equal(t, int64(20_000), lim.RateMilli)
	// The follower now lags (every fetch waits until the test ends), as a
	// coordinator reading the log over a real network may: the write must
	// not wait for it.
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	kc.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		kc.SleepControl(func() { <-release })
		return nil, nil, false
	})
	put(1, 40)
	lim, ok = region.PolicyLimit(c, "g")
	require.True(t, ok)
	assert.Equal(t, int64(40_000), lim.RateMilli, "the raise is in force when the PUT returns")
}
