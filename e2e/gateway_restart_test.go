package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBinariesGatewayRestarted restarts us-east's only gateway twice
// while paced clients send through every gateway: with SIGTERM (a rolling
// deploy: it drains and flushes its usage) and then with SIGKILL (a
// crash: the usage counted since its last flush is lost). One global
// token bucket "g" of 30/s, demand 30 + 15 + 10 /s.
//
// Measured for each restart: the time from the signal to the new
// process's /readyz "ready: redis warm", the requests of us-east that
// failed meanwhile (one gateway per region here, so its clients meet a
// closed port; behind a load balancer with several gateways they would
// go to the others), and the fallback decisions of the new process.
// Asserted: the new gateway is warm within 30 s, no request took 1 s or
// more from the client, Σ of the enforced shares ≤ L at every 100 ms
// sample, and no 20 s window from 10 s on over-admits the global limit by more than
// 5 %: the bucket state and the share records live in the region's
// Redis, so a restarted gateway resumes them instead of starting full.
func TestBinariesGatewayRestarted(t *testing.T) {
	inTurn(t)
	const (
		rate   = 30.0
		termAt = 20 * time.Second
		killAt = 40 * time.Second
		runTo  = 65 * time.Second
	)
	d := deployLab(t, fmt.Sprintf(`[
		{"id":"g","match":{"routes":["/g/*"]},"algorithm":"token_bucket","rate_per_sec":%v,"burst":%v,"scope":"global"}]`, rate, rate),
		`{"k":{"tier":"pro"}}`, "--timeout", gatewayDeadline.String())
	us := d.regions["us-east"]
	fallback := regexp.MustCompile(`^quotient_limiter_decisions_total\{.*source="fallback"`)
	readyz := us.readyz

	t0 := time.Now().Add(200 * time.Millisecond)
	shares := d.sampleShares(t0, "k", "g", rate)
	out := newOutcome(runTo)
	var wg sync.WaitGroup
	sendFlows(t0, []flow{
		{"k", "/g/x", "us-east", 30, 0, runTo},
		{"k", "/g/x", "eu-west", 15, 0, runTo},
		{"k", "/g/x", "ap-south", 10, 0, runTo},
	}, d.gateways(), out, &wg)

	type restart struct {
		sig      syscall.Signal
		at       time.Duration
		ready    time.Duration // signal to /readyz warm
		failed   int64         // requests that failed from the signal to warm
		fallback float64       // fallback decisions of the new process until the next restart or the end
	}
	restarts := []*restart{{sig: syscall.SIGTERM, at: termAt}, {sig: syscall.SIGKILL, at: killAt}}
	for i, r := range restarts {
		time.Sleep(time.Until(t0.Add(r.at))) // the schedule
		if i > 0 {
			restarts[i-1].fallback = metricSum(t, us.gateway+"/metrics", fallback)
		}
		errs := out.errors.Load()
		began := time.Now()
		d.restartGateway(us, r.sig)
		for time.Since(began) < 30*time.Second && r.ready == 0 {
			if strings.HasPrefix(readyz(), "200 ready: redis warm") {
				r.ready = time.Since(began)
				break
			}
			time.Sleep(20 * time.Millisecond) // bounded poll of a real process
		}
		r.failed = out.errors.Load() - errs
		require.Positive(t, r.ready, "the gateway restarted after %v was not warm within 30 s: %s", r.sig, readyz())
	}
	wg.Wait()
	restarts[len(restarts)-1].fallback = metricSum(t, us.gateway+"/metrics", fallback)
	shares.stop()
	logMetrics(t, "gateway-us-east", us.gateway+"/metrics", "quotient_limiter_decisions_total", "quotient_limiter_store_errors_total", "quotient_gateway_ready")

	for _, r := range restarts {
		t.Logf("%v at %v: /readyz warm %v after the signal; us-east requests failed meanwhile: %d; fallback decisions of the new process: %.0f",
			r.sig, r.at, r.ready.Round(10*time.Millisecond), r.failed, r.fallback)
	}
	t.Logf("Σ shares ≤ L: %d violations of %d samples (%d incomplete)", shares.violations.Load(), shares.samples.Load(), shares.incomplete.Load())
	assert.Positive(t, shares.samples.Load())
	assert.Zero(t, shares.violations.Load(), "Σ shares > L in %d of %d samples; first %v", shares.violations.Load(), shares.samples.Load(), shares.first.Load())
	t.Logf("us-east requests that took 1 s or more (client side): %d; failed requests in all: %d (last: %v)", out.slow["us-east"], out.errors.Load(), out.errLast.Load())
	assert.Zero(t, out.slow["us-east"], "us-east requests that took 1 s or more")
	var failed int64
	for _, r := range restarts {
		failed += r.failed
	}
	assert.Equal(t, failed, out.errors.Load(), "requests failed outside the restarts (last: %v)", out.errLast.Load())
	for _, w := range windowsOf(10, int(runTo/time.Second), 20, 10) { // from 10 s: the start, like the other rows, is not this row's fault
		e, under := sideErrors(out, "k", rate, w, [][]string{{"us-east"}, {"eu-west", "ap-south"}})
		t.Logf("window [%ds, %ds): global error %+.1f%%; under-service us-east %.1f%%, eu-west+ap-south %.1f%% (of L)", w[0], w[1], 100*e, 100*under[0], 100*under[1])
		assert.LessOrEqual(t, e, 0.05, "over-admission beyond 5%% in window [%ds, %ds)", w[0], w[1])
	}
}
