package e2e

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// TestBinariesTwoRegionsAsTheReadme is the run that found the gateway
// enforcing the whole global limit in every region (2.0 x): two regions,
// each with its own redis-server, `quotient coordinator` and
// `quotient gateway` with the README's flags and default timing, one
// devkafka, one global policy of 20/s (burst 20), one API key sending
// 30 requests/s to each gateway for 40 s. One global limiter admits
// 20 x 40 + 20 = 820.
func TestBinariesTwoRegionsAsTheReadme(t *testing.T) {
	inTurn(t)
	dir := t.TempDir()
	quotient := bin(t, "quotient")
	up := upstreamURL(t)
	kafka := startBroker(t, dir)
	policies := filepath.Join(dir, "policies.json")
	require.NoError(t, os.WriteFile(policies, []byte(`[{"id":"global-api","algorithm":"token_bucket","rate_per_sec":20,"burst":20,"scope":"global"}]`), 0o600))
	keys := filepath.Join(dir, "keys.json")
	require.NoError(t, os.WriteFile(keys, []byte(`{"k1":{"tier":"pro"}}`), 0o600))

	gw := map[string]string{}
	for _, name := range []string{"east", "west"} {
		rd := redistest.StartServer(t)
		caddr := freeAddr(t)
		start(t, dir, "coordinator-"+name, quotient, nil, "coordinator", "--region", name, "--regions", "east,west",
			"--redis", rd.Addr(), "--kafka", kafka, "--listen", caddr, "--policies", policies)
		waitHTTP(t, "http://"+caddr+"/readyz", 60*time.Second, nil)
		g := start(t, dir, "gateway-"+name, quotient, nil, "gateway", "--region", name, "--regions", "east,west",
			"--listen", "127.0.0.1:0", "--upstream", up, "--redis", rd.Addr(), "--policies", policies, "--keys", keys)
		gw[name] = "http://" + g.waitLog(t, regexp.MustCompile(`listening on (\S+)`), 30*time.Second)
		waitHTTP(t, gw[name]+"/readyz", 30*time.Second, nil) // warm: no request is decided before
	}
	const d = 40 * time.Second
	out := newOutcome(d)
	var wg sync.WaitGroup
	sendFlows(time.Now().Add(100*time.Millisecond), []flow{
		{"k1", "/v1/x", "east", 30, 0, d},
		{"k1", "/v1/x", "west", 30, 0, d},
	}, gw, out, &wg)
	wg.Wait()
	admitted := 0
	for _, n := range out.admitted["k1"] {
		admitted += n
	}
	const ideal = 20*40 + 20
	t.Logf("two regions, 30/s each for 40 s against 20/s: admitted %d (east %d, west %d), one global limiter %d: %+.1f%%",
		admitted, out.perReg["k1/east"], out.perReg["k1/west"], ideal, 100*(float64(admitted)-ideal)/ideal)
	assert.Zero(t, out.errors.Load(), "requests answered neither 200 nor 429 (last: %v)", out.errLast.Load())
	assert.LessOrEqual(t, math.Abs(float64(admitted)-ideal)/ideal, maxError, fmt.Sprintf("admitted %d, ideal %d", admitted, ideal))
}
