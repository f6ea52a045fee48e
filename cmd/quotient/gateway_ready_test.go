package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
)

// waitReady polls base/readyz until it answers 200, failing t after limit.
func waitReady(t *testing.T, base string, stderr *syncBuffer, limit time.Duration) string {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(limit)
	for {
		resp, body := get(t, c, base+"/readyz", nil)
		if resp.StatusCode == http.StatusOK {
			return string(body)
		}
		require.True(t, time.Now().Before(deadline), "not ready after %v: %d %s\nstderr:\n%s", limit, resp.StatusCode, body, stderr.String())
		time.Sleep(10 * time.Millisecond) // polling a real server with a deadline
	}
}

// waitMetric polls base/metrics until it holds line (a whole sample line).
func waitMetric(t *testing.T, base, line string, limit time.Duration) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(limit)
	for {
		_, body := get(t, c, base+"/metrics", nil)
		if strings.Contains(string(body), line+"\n") {
			return
		}
		require.True(t, time.Now().Before(deadline), "no %q in /metrics after %v", line, limit)
		time.Sleep(10 * time.Millisecond) // polling a real server with a deadline
	}
}

// decisionRe matches one sampled decision in the gateway's log (limiter
// SlogSink, --event-sample 1): its time, path, outcome, source and delay.
var decisionRe = regexp.MustCompile(`msg="limiter decision" .*?time=(\S+) method=\S+ path=(\S+) tier=\S+ allowed=(\w+) source=(\w+) delay=(\S+)`)

type loggedDecision struct {
	at      time.Time
	allowed bool
	source  string
	delay   time.Duration
}

// decisionsOf returns the logged decisions of path.
func decisionsOf(t *testing.T, log, path string) []loggedDecision {
	t.Helper()
	var out []loggedDecision
	for _, m := range decisionRe.FindAllStringSubmatch(log, -1) {
		if m[2] != path {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		require.NoError(t, err, m[0])
		delay, err := time.ParseDuration(m[5])
		require.NoError(t, err, m[0])
		out = append(out, loggedDecision{at: at, allowed: m[3] == "true", source: m[4], delay: delay})
	}
	return out
}

// burst sends n requests for path with API key key at one instant (every
// client waits on one channel) and returns the status codes.
func burst(t *testing.T, base, path, key string, n int) []int {
	t.Helper()
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	// Open the connections first, so the burst measures the gateway, not
	// the test's dialling.
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() { defer wg.Done(); get(t, c, base+"/healthz", nil) }()
	}
	wg.Wait()
	codes := make([]int, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, _ := get(t, c, base+path, map[string]string{"X-API-Key": key})
			codes[i] = resp.StatusCode
		}()
	}
	close(start)
	wg.Wait()
	sort.Ints(codes)
	return codes
}

// admittedDelays returns the delays of the admitted decisions in queue
// order (the k-th admitted waits for the k ahead of it, so the delays grow
// with k), and checks that every admission came from source and every
// rejection from source or the deny cache that the first one filled.
func admittedDelays(t *testing.T, ds []loggedDecision, source string) []loggedDecision {
	t.Helper()
	var out []loggedDecision
	for _, d := range ds {
		if !d.allowed {
			if d.source != "deny_cache" {
				assert.Equal(t, source, d.source, "a rejection")
			}
			continue
		}
		assert.Equal(t, source, d.source, "an admission")
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].delay < out[j].delay })
	return out
}

// assertSpaced checks that the k-th admitted request is forwarded k x
// perReq after the first, to within 10 ms: its delay plus the time its
// decision was made (at[k], on one clock) after the first one's.
func assertSpaced(t *testing.T, delays []time.Duration, at []time.Time, perReq time.Duration) {
	t.Helper()
	require.Equal(t, len(delays), len(at))
	for k := range delays {
		got := delays[k] + at[k].Sub(at[0])
		assert.InDelta(t, float64(time.Duration(k)*perReq), float64(got), float64(10*time.Millisecond),
			"request %d of the queue is forwarded %v after the first, want %v", k, got, time.Duration(k)*perReq)
	}
}

// monitor is a MONITOR connection to a redis-server: it records the time
// (the server's clock) at which the server ran each EVALSHA.
type monitor struct {
	conn net.Conn
	rd   *bufio.Reader
}

func startMonitor(t *testing.T, addr string) *monitor {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = conn.Write([]byte("MONITOR\r\n"))
	require.NoError(t, err)
	m := &monitor{conn: conn, rd: bufio.NewReader(conn)}
	line, err := m.rd.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "+OK\r\n", line)
	return m
}

var monitorRe = regexp.MustCompile(`^\+(\d+)\.(\d{6}) \[\d+ [^\]]+\] "(?i:evalsha)" (.*)$`)

// evalTimes stops the monitor and returns, in order, the server times of
// the EVALSHAs whose arguments contain match. It first sends a PING with a
// marker through its own connection and reads up to it, so that every
// command run before is seen.
func (m *monitor) evalTimes(t *testing.T, addr, match string) []time.Time {
	t.Helper()
	marker := fmt.Sprintf("end-of-burst-%d", time.Now().UnixNano())
	ping, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer ping.Close()
	_, err = fmt.Fprintf(ping, "PING %s\r\n", marker)
	require.NoError(t, err)
	var out []time.Time
	for {
		line, err := m.rd.ReadString('\n')
		require.NoError(t, err, "MONITOR ended before the marker")
		if strings.Contains(line, marker) {
			break
		}
		mm := monitorRe.FindStringSubmatch(strings.TrimRight(line, "\r\n"))
		if mm == nil || !strings.Contains(mm[3], match) {
			continue
		}
		sec, _ := strconv.ParseInt(mm[1], 10, 64)
		usec, _ := strconv.ParseInt(mm[2], 10, 64)
		out = append(out, time.Unix(sec, usec*1000))
	}
	_ = m.conn.Close()
	return out
}

const shapePolicies = `[{"id":"shape","match":{"tier":"pro"},"algorithm":"leaky_bucket","rate_per_sec":5,"burst":10}]`

const shapeKeys = `{"k1":{"tier":"pro"},"k2":{"tier":"pro"},"k3":{"tier":"pro"}}`

// serverWork is what one redis-server did on behalf of its clients:
// connections accepted, NOSCRIPT errors and EVAL calls (script sources
// sent and compiled) since it started.
type serverWork struct{ conns, noscript, evals int64 }

var (
	connsRe    = regexp.MustCompile(`(?m)^total_connections_received:(\d+)`)
	noscriptRe = regexp.MustCompile(`(?m)^errorstat_NOSCRIPT:count=(\d+)`)
	evalRe     = regexp.MustCompile(`(?m)^cmdstat_eval:calls=(\d+)`)
)

func workOf(t *testing.T, srv *redistest.Server) serverWork {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := srv.Client().Info(ctx, "stats", "errorstats", "commandstats").Result()
	require.NoError(t, err)
	n := func(re *regexp.Regexp) int64 {
		m := re.FindStringSubmatch(info)
		if m == nil {
			return 0 // the server has not seen any yet
		}
		v, err := strconv.ParseInt(m[1], 10, 64)
		require.NoError(t, err)
		return v
	}
	return serverWork{conns: n(connsRe), noscript: n(noscriptRe), evals: n(evalRe)}
}

// TestGatewayWarmBurstIsShaped is issue #20's burst: `quotient gateway
// --redis-pipeline 0` with one leaky
// bucket (5/s, burst 10); 14 clients send one request each at one
// instant, right after the gateway reports ready, and again right after
// redis-server restarts: once the moment it accepts connections, and once
// the gateway reports it warm again. From ready (and from warm again)
// every decision comes from the store (quotient_limiter_store_errors_total
// unchanged by the burst): 10 admitted with delays 0, 0.2 ... 1.8 s, 4
// rejected.
//
// The request path does none of the cold-path work that made the first
// calls miss their deadline: redis-server accepts no connection, answers
// no NOSCRIPT and compiles no EVAL during the bursts (counted by the
// server itself); right after the restart the gateway bypasses the store
// (its watch connection ended with the server) until it has warmed the
// new server, so the restarted server sees no NOSCRIPT and no EVAL at all.
// The shaping is checked against the times redis-server ran each script
// call (MONITOR), the clock the script decides with.
//
// The store deadline is 250 ms, not the default 5 ms, for a measured
// reason: at the default this test passed on a quiet machine and failed
// whenever other jobs loaded the 2 cores, with every decision that fell
// back explained by the machine, not by the gateway: 0 dials, 0 NOSCRIPT,
// 0 EVAL on the server, and the test process's goroutines waiting up to
// 16.8 to 67 ms to run during the burst (runtime/metrics
// /sched/latencies; 278 ms of run-queue wait over 1.8 s; load 4.5 to 5
// under -race), so a reply that had arrived in time was read after the
// deadline. Each burst logs those figures (loadProbe). The cold-path work
// the default deadline missed is caught by the server's counters at any
// deadline, and limiter's TestWarmerBypassesStoreUntilRedisIsWarmAgain
// checks the bypass without timing.
func TestGatewayWarmBurstIsShaped(t *testing.T) {
	srv := redistest.StartServer(t)
	up := upstream(t)
	dir := t.TempDir()
	base, stderr, _ := startGateway(t, "--upstream", up.URL, "--redis", srv.Addr(), "--redis-pipeline", "0",
		"--policies", gwFile(t, dir, "p.json", shapePolicies), "--keys", gwFile(t, dir, "k.json", shapeKeys),
		"--event-sample", "1", "--timeout", "250ms") // measured reason above
	c := &http.Client{Timeout: 5 * time.Second}
	want := []int{200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429, 429, 429, 429}
	errorsNow := func() string {
		_, m := get(t, c, base+"/metrics", nil)
		return regexp.MustCompile(`(?m)^quotient_limiter_store_errors_total\{region="local"\} \S+$`).FindString(string(m))
	}
	check := func(when, path, key string) {
		t.Helper()
		mon := startMonitor(t, srv.Addr())
		before, errsBefore := workOf(t, srv), errorsNow()
		load := startLoadProbe()
		start := time.Now()
		assert.Equal(t, want, burst(t, base, path, key, 14), when)
		took := time.Since(start)
		machine := load.stop()
		after := workOf(t, srv)
		ran := mon.evalTimes(t, srv.Addr(), key)
		assert.Equal(t, before, after, "%s: no dial, no NOSCRIPT, no EVAL on the request path", when)
		ds := decisionsOf(t, stderr.String(), path)
		require.Len(t, ds, 14, when)
		adm := admittedDelays(t, ds, "store")
		require.Len(t, adm, 10, "%s; %s", when, machine)
		// The script decides at Redis TIME when it runs: the k-th
		// admission is the k-th script call the server ran.
		require.GreaterOrEqual(t, len(ran), 10, "%s: script calls seen by MONITOR", when)
		delays := make([]time.Duration, 10)
		for k := range adm {
			delays[k] = adm[k].delay
		}
		assertSpaced(t, delays, ran[:10], 200*time.Millisecond)
		assert.Equal(t, errsBefore, errorsNow(), "%s: no store call failed; %s", when, machine)
		_, m := get(t, c, base+"/metrics", nil)
		t.Logf("%s: burst answered in %v; %s; %s", when, took.Round(time.Millisecond), checkLatency(string(m)), machine)
	}

	check("after start", "/after-start", "k1")

	srv.Restart(t)
	// The moment the restarted server accepts connections: the gateway
	// bypasses it (or has already warmed it); either way the request path
	// makes it load no script.
	burst(t, base, "/right-after-restart", "k3", 14)
	assert.Equal(t, serverWork{}, serverWork{noscript: workOf(t, srv).noscript, evals: workOf(t, srv).evals},
		"right after the restart: no NOSCRIPT, no EVAL")
	for _, d := range decisionsOf(t, stderr.String(), "/right-after-restart") {
		assert.Contains(t, []string{"store", "fallback", "deny_cache"}, d.source)
	}
	// From the moment /readyz says warm again, the store decides. "Warm
	// again" is a warm-up after the first that the restarted server saw:
	// the count alone is not enough, because under load the warmer can
	// also warm the old server between its SIGTERM and its exit (CI saw
	// "3 warm-ups" for one restart), so the wait also asks the new server
	// whether it holds the scripts (SCRIPT LOAD is a warm-up's last step,
	// after its connections are open).
	t0 := time.Now()
	body := waitWarmAgain(t, base, srv, 10*time.Second)
	t.Logf("warm again %v after the restarted server answered: %s", time.Since(t0).Round(time.Millisecond), strings.TrimSpace(body))
	check("after a restart", "/after-restart", "k2")
}

// checkLatency summarises the store-sourced Check latency histogram.
func checkLatency(metrics string) string {
	re := regexp.MustCompile(`(?m)^quotient_limiter_check_duration_seconds_(sum|count)\{region="local",source="store"\} (\S+)$`)
	var sum, count float64
	for _, m := range re.FindAllStringSubmatch(metrics, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		if m[1] == "sum" {
			sum = v
		} else {
			count = v
		}
	}
	if count == 0 {
		return "no store decisions"
	}
	return fmt.Sprintf("store Checks so far: %.0f, mean %.2f ms", count, sum/count*1000)
}

// TestGatewayLeakyBucketInFallbackStillShapes: redis-server is killed;
// the fallback answers and still shapes, at its own rate: 5/s x 2 with a
// queue of 10 x 2 (OpenFactor 2), so 20 of 25 admitted 100 ms apart.
// /readyz stays 200 and says the gateway is in fallback.
func TestGatewayLeakyBucketInFallbackStillShapes(t *testing.T) {
	srv := redistest.StartServer(t)
	up := upstream(t)
	dir := t.TempDir()
	base, stderr, _ := startGateway(t, "--upstream", up.URL, "--redis", srv.Addr(),
		"--policies", gwFile(t, dir, "p.json", shapePolicies), "--keys", gwFile(t, dir, "k.json", shapeKeys),
		"--event-sample", "1", "--warm-interval", "50ms", "--timeout", "250ms")
	srv.Kill()
	// The gateway's watch connection ends with the server: it bypasses
	// the store (no request waits for a dead Redis), so the burst goes
	// straight to the fallback and each request is decided at its own
	// time, with the circuit breaker left closed.
	c := &http.Client{Timeout: 5 * time.Second}
	waitReadyzSays(t, base, "Redis was lost: every decision comes from the in-process fallback, without a Redis call", 10*time.Second)
	codes := burst(t, base, "/killed", "k3", 25)
	admitted := 0
	for _, code := range codes {
		if code == 200 {
			admitted++
		}
	}
	assert.Equal(t, 20, admitted, "a queue of 20: %v", codes)
	ds := decisionsOf(t, stderr.String(), "/killed")
	require.Len(t, ds, 25)
	adm := admittedDelays(t, ds, "fallback")
	require.Len(t, adm, 20)
	// The fallback decides at the gateway's clock, the logged time.
	delays, at := make([]time.Duration, 20), make([]time.Time, 20)
	for k := range adm {
		delays[k], at[k] = adm[k].delay, adm[k].at
	}
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	assertSpaced(t, delays, at, 100*time.Millisecond)

	// A gateway that loses Redis stays ready (the fallback answers) and
	// says why.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, body := get(t, c, base+"/readyz", nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		if strings.HasPrefix(string(body), "ready in fallback: redis "+srv.Addr()+" not warm") {
			break
		}
		require.True(t, time.Now().Before(deadline), "/readyz never said Redis is gone: %s", body)
		time.Sleep(10 * time.Millisecond) // polling a real server with a deadline
	}
	waitMetric(t, base, `quotient_gateway_ready{region="local"} 2`, 10*time.Second)
	_, m := get(t, c, base+"/metrics", nil)
	assert.Contains(t, string(m), "quotient_limiter_breaker_state{region=\"local\"} 0\n", "bypassed decisions make no store call and do not open the breaker")
}

// warmAgainRe reads the warm-up count of a warm gateway's /readyz.
var warmAgainRe = regexp.MustCompile(`ready: redis warm \(1 nodes, (\d+) warm-ups\)`)

// waitWarmAgain polls until base/readyz says warm after more than one
// warm-up and srv (restarted) holds every script the store runs.
func waitWarmAgain(t *testing.T, base string, srv *redistest.Server, limit time.Duration) string {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(limit)
	for {
		_, body := get(t, c, base+"/readyz", nil)
		if m := warmAgainRe.FindStringSubmatch(string(body)); m != nil {
			n, err := strconv.Atoi(m[1])
			require.NoError(t, err)
			if n >= 2 && cachedScripts(t, srv) >= 3 {
				return string(body)
			}
		}
		require.True(t, time.Now().Before(deadline), "/readyz never said warm again with the restarted server's scripts loaded: %s (server holds %d scripts)", body, cachedScripts(t, srv))
		time.Sleep(10 * time.Millisecond) // polling a real server with a deadline
	}
}

// cachedScripts is the number of scripts srv holds (INFO memory).
func cachedScripts(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := srv.Client().Info(ctx, "memory").Result()
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^number_of_cached_scripts:(\d+)`).FindStringSubmatch(info)
	require.NotNil(t, m, "INFO memory has number_of_cached_scripts")
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return n
}

// waitReadyzSays polls base/readyz until its body holds want.
func waitReadyzSays(t *testing.T, base, want string, limit time.Duration) string {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(limit)
	for {
		_, body := get(t, c, base+"/readyz", nil)
		if strings.Contains(string(body), want) {
			return string(body)
		}
		require.True(t, time.Now().Before(deadline), "/readyz never said %q: %s", want, body)
		time.Sleep(10 * time.Millisecond) // polling a real server with a deadline
	}
}

// TestGatewayReadyzWaitsForRedis: a gateway whose Redis is not up yet
// answers /readyz 503 with what it waits for, and every other request 503
// with Retry-After; once redis-server comes up it warms it and reports
// ready.
func TestGatewayReadyzWaitsForRedis(t *testing.T) {
	srv := redistest.StartServer(t)
	srv.Stop()
	up := upstream(t)
	dir := t.TempDir()
	base, stderr, _ := launchGateway(t, "--upstream", up.URL, "--redis", srv.Addr(),
		"--policies", gwFile(t, dir, "p.json", shapePolicies), "--warm-timeout", "1m", "--warm-interval", "50ms")
	c := &http.Client{Timeout: 5 * time.Second}

	resp, body := get(t, c, base+"/readyz", nil)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Contains(t, string(body), "warming up: waiting for redis "+srv.Addr()+" not warm")
	// Once the first attempt has failed, the reason says how.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(string(body), "connect: connection refused") {
		require.True(t, time.Now().Before(deadline), "the reason never names %s: %s", srv.Addr(), body)
		time.Sleep(10 * time.Millisecond) // polling a real server with a deadline
		resp, body = get(t, c, base+"/readyz", nil)
	}
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	resp, body = get(t, c, base+"/x", nil)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "no request is decided before ready")
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.Contains(t, string(body), "warming up")
	resp, _ = get(t, c, base+"/healthz", nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "alive while warming")
	_, m := get(t, c, base+"/metrics", nil)
	assert.Contains(t, string(m), "quotient_gateway_ready{region=\"local\"} 0\n")

	srv.Restart(t)
	body2 := waitReady(t, base, stderr, 10*time.Second)
	assert.Contains(t, body2, "ready: redis warm (1 nodes")
	_, m = get(t, c, base+"/metrics", nil)
	assert.Contains(t, string(m), "quotient_gateway_ready{region=\"local\"} 1\n")
	assert.Contains(t, string(m), "quotient_store_warm{region=\"local\"} 1\n")
	resp, _ = get(t, c, base+"/x", nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, stderr.String(), "gateway ready")
}

// TestGatewayStartsInFallbackWhenRedisIsDown: with Redis down for longer
// than --warm-timeout the gateway reports ready anyway, in fallback, and
// says why in /readyz, the log and quotient_gateway_ready; requests are
// decided by the fallback. When Redis comes back the gateway warms it and
// /readyz says so.
func TestGatewayStartsInFallbackWhenRedisIsDown(t *testing.T) {
	srv := redistest.StartServer(t)
	srv.Stop()
	up := upstream(t)
	dir := t.TempDir()
	start := time.Now()
	base, stderr, _ := launchGateway(t, "--upstream", up.URL, "--redis", srv.Addr(),
		"--policies", gwFile(t, dir, "p.json", shapePolicies), "--keys", gwFile(t, dir, "k.json", shapeKeys),
		"--warm-timeout", "300ms", "--warm-interval", "50ms")
	body := waitReady(t, base, stderr, 10*time.Second)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "not ready before the bound")
	assert.Contains(t, body, "ready in fallback: redis "+srv.Addr()+" not warm")
	assert.Contains(t, body, "connect: connection refused", "the reason")
	assert.Contains(t, body, "every decision comes from the in-process fallback, without a Redis call", "a refused Redis is bypassed")
	assert.Contains(t, stderr.String(), "gateway ready in fallback")
	c := &http.Client{Timeout: 5 * time.Second}
	_, m := get(t, c, base+"/metrics", nil)
	assert.Contains(t, string(m), "quotient_gateway_ready{region=\"local\"} 2\n")
	assert.Contains(t, string(m), "quotient_store_warm{region=\"local\"} 0\n")
	resp, _ := get(t, c, base+"/x", map[string]string{"X-API-Key": "k1"})
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the fallback admits")

	srv.Restart(t)
	waitMetric(t, base, `quotient_gateway_ready{region="local"} 1`, 10*time.Second)
	_, b := get(t, c, base+"/readyz", nil)
	assert.Contains(t, string(b), "ready: redis warm")
}

// TestGatewayWarmsEveryClusterNode: with a three-node Redis Cluster the
// gateway is ready only once every node holds the scripts and the warm
// connections, and the first bursts (8 concurrent requests, within the
// warm connections) pay no dial and no script load on any node.
func TestGatewayWarmsEveryClusterNode(t *testing.T) {
	cl := redistest.StartCluster(t)
	up := upstream(t)
	dir := t.TempDir()
	base, stderr, _ := startGateway(t, "--upstream", up.URL, "--redis", strings.Join(cl.Addrs(), ","), "--redis-pipeline", "0",
		"--policies", gwFile(t, dir, "p.json", shapePolicies), "--keys", gwFile(t, dir, "k.json", shapeKeys),
		"--timeout", "250ms")
	body := waitReady(t, base, stderr, 5*time.Second)
	assert.Contains(t, body, "ready: redis warm (3 nodes")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := map[string]serverWork{}
	for _, n := range cl.Nodes() {
		info, err := n.Client().Info(ctx, "clients").Result()
		require.NoError(t, err)
		m := regexp.MustCompile(`(?m)^connected_clients:(\d+)`).FindStringSubmatch(info)
		require.NotNil(t, m)
		clients, _ := strconv.Atoi(m[1])
		assert.GreaterOrEqual(t, clients, 10, "node %s: the gateway's warm connections: 16 (--warm-conns default with --redis-pipeline 0) capped at the cluster client's pool of 10 per node on 2 cores", n.Addr())
		before[n.Addr()] = workOf(t, n)
	}
	// Keys k1, k2 and k3 hash to slots on different nodes or not: every
	// node was warmed, so none pays a dial or an EVAL.
	for _, k := range []string{"k1", "k2", "k3"} {
		codes := burst(t, base, "/c-"+k, k, 8)
		assert.Equal(t, 8, countOf(codes, 200), "%s: %v", k, codes)
	}
	for _, n := range cl.Nodes() {
		assert.Equal(t, before[n.Addr()], workOf(t, n), "node %s: no dial, no NOSCRIPT, no EVAL on the request path", n.Addr())
	}
	_, m := get(t, &http.Client{Timeout: 5 * time.Second}, base+"/metrics", nil)
	assert.Contains(t, string(m), "quotient_limiter_store_errors_total{region=\"local\"} 0\n")
}

func countOf(codes []int, code int) int {
	n := 0
	for _, c := range codes {
		if c == code {
			n++
		}
	}
	return n
}

// TestGatewayWarmFlags: the warm-start flags have their documented
// defaults, read QUOTIENT_<FLAG>, and bad values are refused naming the
// flag.
func TestGatewayWarmFlags(t *testing.T) {
	env := func(vars map[string]string) environment {
		return environment{stdout: &syncBuffer{}, stderr: &syncBuffer{}, lookupEnv: func(k string) (string, bool) { v, ok := vars[k]; return v, ok }}
	}
	base := []string{"--upstream", "http://127.0.0.1:1", "--redis", "127.0.0.1:1", "--policies", "p.json"}
	cfg, err := parseGatewayFlags(env(nil), base)
	require.NoError(t, err)
	assert.Equal(t, warmFlags{timeout: 5 * time.Second, interval: time.Second, conns: 0}, cfg.warm)
	cfg, err = parseGatewayFlags(env(map[string]string{"QUOTIENT_WARM_TIMEOUT": "30s", "QUOTIENT_WARM_CONNS": "4"}), base)
	require.NoError(t, err)
	assert.Equal(t, 30*time.Second, cfg.warm.timeout)
	assert.Equal(t, 4, cfg.warm.conns)
	for flagArgs, want := range map[[2]string]string{
		{"--warm-timeout", "0s"}:   "--warm-timeout must be > 0",
		{"--warm-interval", "-1s"}: "--warm-interval must be > 0",
		{"--warm-conns", "-1"}:     "--warm-conns must be between 0 and 4096",
		{"--warm-conns", "5000"}:   "--warm-conns must be between 0 and 4096",
	} {
		_, err := parseGatewayFlags(env(nil), append(append([]string{}, base...), flagArgs[0], flagArgs[1]))
		assert.ErrorContains(t, err, want, "%v", flagArgs)
	}
}
