package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/region/admin"
	"github.com/quotientlabs/quotient/region/policysync"
)

// syncBuffer is an io.Writer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var listeningRe = regexp.MustCompile(`listening on (\S+)`)

// startGateway runs `quotient gateway args...` in process, waits until
// its /readyz answers 200 and returns its base URL, its stderr, and a stop
// function that waits for exit status 0.
func startGateway(t *testing.T, args ...string) (string, *syncBuffer, func()) {
	t.Helper()
	base, stderr, stop := launchGateway(t, args...)
	waitReady(t, base, stderr, 20*time.Second)
	return base, stderr, stop
}

// launchGateway runs `quotient gateway args...` in process and returns as
// soon as it listens (before it is ready).
func launchGateway(t *testing.T, args ...string) (string, *syncBuffer, func()) {
	t.Helper()
	addr, stderr, stop := startServing(t, "gateway", nil, args...)
	return "http://" + addr, stderr, stop
}

// startServing runs `quotient sub --listen 127.0.0.1:0 args...` in process
// (lookupEnv nil: an empty environment) until its stdout says where it
// listens, and returns that address, its stderr, and a stop function
// (registered with t.Cleanup) that cancels it and waits for exit status 0.
func startServing(t *testing.T, sub string, lookupEnv func(string) (string, bool), args ...string) (string, *syncBuffer, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	if lookupEnv == nil {
		lookupEnv = func(string) (string, bool) { return "", false }
	}
	env := environment{stdout: stdout, stderr: stderr, lookupEnv: lookupEnv}
	done := make(chan int, 1)
	go func() { done <- run(ctx, env, append([]string{sub, "--listen", "127.0.0.1:0"}, args...)) }()
	deadline := time.Now().Add(10 * time.Second)
	var addr string
	for addr == "" {
		if m := listeningRe.FindStringSubmatch(stdout.String()); m != nil {
			addr = m[1]
			break
		}
		select {
		case code := <-done:
			cancel()
			t.Fatalf("%s exited with %d: %s", sub, code, stderr.String())
		case <-time.After(5 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "%s did not start: %s", sub, stderr.String())
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case code := <-done:
			assert.Equal(t, 0, code, stderr.String())
		case <-time.After(15 * time.Second):
			t.Errorf("%s did not shut down", sub)
		}
	}
	t.Cleanup(stop)
	return addr, stderr, stop
}

func gwFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

const gatewayPolicies = `[
 {"id":"pro-burst","match":{"tier":"pro"},"algorithm":"token_bucket","rate_per_sec":0.01,"burst":5,"class":"quota"},
 {"id":"anon","subject":"ip","match":{"tier":"anonymous"},"algorithm":"fixed_window","limit":1000,"window_s":60},
 {"id":"login","subject":"ip","match":{"routes":["/login"]},"algorithm":"sliding_window_log","limit":3,"window_s":60,"class":"security"}
]`

const gatewayKeys = `{"k1":{"tier":"pro","account":"acme"},"k2":{"tier":"pro","account":"acme"}}`

func upstream(t *testing.T) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello "+r.URL.Path)
	}))
	t.Cleanup(up.Close)
	return up
}

func get(t *testing.T, c *http.Client, url string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp, body
}

// TestGatewayEndToEnd runs the gateway as a user would: redis-server, a
// plain upstream and `quotient gateway`.
func TestGatewayEndToEnd(t *testing.T) {
	srv := redistest.StartServer(t)
	up := upstream(t)
	dir := t.TempDir()
	const timeout = 20 * time.Millisecond
	base, _, stop := startGateway(t,
		"--upstream", up.URL, "--redis", srv.Addr(),
		"--policies", gwFile(t, dir, "p.json", gatewayPolicies),
		"--keys", gwFile(t, dir, "k.json", gatewayKeys),
		"--timeout", timeout.String(), "--region", "eu-test")
	c := &http.Client{Timeout: 10 * time.Second}

	var codes []int
	var last *http.Response
	var lastBody []byte
	for range 8 {
		resp, body := get(t, c, base+"/v1/orders", map[string]string{"X-API-Key": "k1"})
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode == 200 {
			assert.Equal(t, "hello /v1/orders", string(body))
		}
		for _, name := range []string{"RateLimit-Policy", "RateLimit"} {
			list, err := httpsfv.UnmarshalList(resp.Header.Values(name))
			require.NoError(t, err, "%s: %q", name, resp.Header.Values(name))
			require.Len(t, list, 1)
			assert.Equal(t, "pro-burst", list[0].(httpsfv.Item).Value)
		}
		last, lastBody = resp, body
	}
	assert.Equal(t, []int{200, 200, 200, 200, 200, 429, 429, 429}, codes)
	assert.Equal(t, "application/problem+json", last.Header.Get("Content-Type"))
	ra, err := strconv.Atoi(last.Header.Get("Retry-After"))
	require.NoError(t, err)
	assert.Greater(t, ra, 60, "one token at 0.01/s takes 100 s")
	rl, err := httpsfv.UnmarshalList(last.Header.Values("RateLimit"))
	require.NoError(t, err)
	tv, _ := rl[0].(httpsfv.Item).Params.Get("t")
	assert.LessOrEqual(t, tv.(int64), int64(ra), "Retry-After never earlier than the reset")
	var prob map[string]any
	require.NoError(t, json.Unmarshal(lastBody, &prob))
	assert.Equal(t, float64(429), prob["status"])
	assert.Equal(t, []any{"pro-burst"}, prob["violated-policies"])
	for _, k := range []string{"type", "title", "detail", "instance"} {
		assert.NotEmpty(t, prob[k], k)
	}

	resp, _ := get(t, c, base+"/metrics", nil)
	require.Equal(t, 200, resp.StatusCode)

	// Redis goes away: quota traffic keeps flowing within the deadline,
	// security traffic is refused with 503.
	srv.Stop()
	for i := range 20 {
		start := time.Now()
		resp, _ := get(t, c, base+"/v1/orders", map[string]string{"Authorization": "Bearer k2"})
		el := time.Since(start)
		if i < 10 {
			assert.Equal(t, 200, resp.StatusCode, "request %d: fails open at burst 5 x 2", i)
		}
		assert.Less(t, el, timeout+500*time.Millisecond, "request %d", i)
	}
	resp, body := get(t, c, base+"/login", nil)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, string(body))
	assert.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	assert.Empty(t, resp.Header.Get("RateLimit"), "security policies are not exposed")

	_, metrics := get(t, c, base+"/metrics", nil)
	assert.Contains(t, string(metrics), `quotient_limiter_decisions_total{decision="rejected",policy="pro-burst",region="eu-test",source="store"}`)
	assert.Contains(t, string(metrics), `quotient_limiter_store_errors_total{region="eu-test"}`)
	stop()
}

// replaceFile replaces path's content atomically: a temporary file beside
// it, renamed over it.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(content), 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

func TestGatewayReloadsPoliciesAndKeepsTheLastGood(t *testing.T) {
	srv := redistest.StartServer(t)
	up := upstream(t)
	dir := t.TempDir()
	pfile := gwFile(t, dir, "p.json", `[{"id":"tiny","subject":"ip","algorithm":"token_bucket","rate_per_sec":0.01,"burst":1}]`)
	base, stderr, _ := startGateway(t, "--upstream", up.URL, "--redis", srv.Addr(), "--policies", pfile,
		"--reload-interval", "20ms", "--timeout", "1s")
	c := &http.Client{Timeout: 10 * time.Second}
	resp, _ := get(t, c, base+"/a", nil)
	require.Equal(t, 200, resp.StatusCode)
	resp, _ = get(t, c, base+"/a", nil)
	require.Equal(t, 429, resp.StatusCode)

	// Replaced atomically, as the README asks: a file written in place can be
	// read half-written (one more failed reload in the metric).
	replaceFile(t, pfile, `[{"id":"roomy","subject":"ip","algorithm":"token_bucket","rate_per_sec":100,"burst":100}]`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, _ = get(t, c, base+"/a", nil)
		if resp.StatusCode == 200 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the new policies never took effect")
		time.Sleep(10 * time.Millisecond) // polling a real server with a deadline
	}
	assert.Contains(t, resp.Header.Get("RateLimit-Policy"), `"roomy"`)

	replaceFile(t, pfile, `[{"id":"broken","algorithm":"token_bucket","rate_per_sec":-1}]`)
	for !regexp.MustCompile(`policy reload failed`).MatchString(stderr.String()) {
		require.True(t, time.Now().Before(deadline.Add(10*time.Second)), "the bad file was never read")
		time.Sleep(10 * time.Millisecond)
	}
	assert.Contains(t, stderr.String(), "rate_per_sec", "the log names the field")
	resp, _ = get(t, c, base+"/a", nil)
	assert.Equal(t, 200, resp.StatusCode, "the last good policies stay")
	assert.Contains(t, resp.Header.Get("RateLimit-Policy"), `"roomy"`)
	_, metrics := get(t, c, base+"/metrics", nil)
	assert.Contains(t, string(metrics), `quotient_gateway_policy_reloads_total{region="local",result="error"} 1`)
	assert.Contains(t, string(metrics), `quotient_gateway_policy_reloads_total{region="local",result="ok"} 1`)
}

func TestGatewayFlagsAndEnvironment(t *testing.T) {
	env := func(vars map[string]string) environment {
		return environment{stdout: io.Discard, stderr: &syncBuffer{}, lookupEnv: func(k string) (string, bool) { v, ok := vars[k]; return v, ok }}
	}
	e := env(nil)
	assert.Equal(t, 2, run(context.Background(), e, []string{"gateway", "--redis", "x:1", "--policies", "p"}))
	assert.Contains(t, e.stderr.(*syncBuffer).String(), "--upstream is required")

	cfg, err := parseGatewayFlags(env(map[string]string{
		"QUOTIENT_UPSTREAM": "http://127.0.0.1:1", "QUOTIENT_REDIS": "a:1,b:2", "QUOTIENT_POLICIES": "p.json",
		"QUOTIENT_TRUSTED_PROXIES": "10.0.0.0/8", "QUOTIENT_TIMEOUT": "7ms",
	}), []string{"--region", "us"})
	require.NoError(t, err)
	assert.Equal(t, "a:1,b:2", cfg.redis)
	assert.Equal(t, 7*time.Millisecond, cfg.timeout)
	assert.Equal(t, "us", cfg.region)
	assert.Equal(t, "10.0.0.0/8", cfg.trusted)

	_, err = parseGatewayFlags(env(map[string]string{"QUOTIENT_TIMEOUT": "soon"}), nil)
	assert.ErrorContains(t, err, "QUOTIENT_TIMEOUT")

	dir := t.TempDir()
	_, err = loadKeys(gwFile(t, dir, "k.json", `{"k":{"tier":"pro","plan":"x"}}`))
	assert.ErrorContains(t, err, "plan")
	_, err = loadKeys(gwFile(t, dir, "k2.json", `{"k":{"account":"a"}}`))
	assert.ErrorContains(t, err, "tier is required")
}

// TestGatewayFollowsRedisPolicies: with --policy-source redis and no policy
// file, the gateway enforces the snapshot the coordinators materialise in
// its region's Redis (written here with policysync.WriteSnapshot, as the
// Materializer does), including a per-subject override, and follows a new
// snapshot on its notification. Every wait is bounded.
func TestGatewayFollowsRedisPolicies(t *testing.T) {
	srv := redistest.StartServer(t)
	up := upstream(t)
	dir := t.TempDir()
	base, stderr, _ := startGateway(t, "--upstream", up.URL, "--redis", srv.Addr(), "--policy-source", "redis",
		"--keys", gwFile(t, dir, "keys.json", gatewayKeys), "--timeout", "200ms")
	pol := json.RawMessage(`{"id":"pro-burst","version":1,"match":{"tier":"pro"},"algorithm":"token_bucket","rate_per_sec":0.01,"burst":2}`)
	snap := policysync.Snapshot{Generation: 1, Policies: []json.RawMessage{pol}, Overrides: []admin.Override{}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := policysync.WriteSnapshot(ctx, srv.Client(), snap)
	require.NoError(t, err)

	c := &http.Client{Timeout: 5 * time.Second}
	// admitted counts requests of key k until the first 429 (at most 20).
	admitted := func(k string) int {
		for i := range 20 {
			resp, _ := get(t, c, base+"/x", map[string]string{"X-API-Key": k})
			if resp.StatusCode == http.StatusTooManyRequests {
				return i
			}
		}
		return 20
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for !cond() {
			require.True(t, time.Now().Before(deadline), "%s: not by the deadline; stderr:\n%s", what, stderr.String())
			time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
		}
	}
	generation := func(n int) func() bool {
		return func() bool {
			_, body := get(t, c, base+"/metrics", nil)
			return strings.Contains(string(body), `quotient_policy_generation{region="local"} `+strconv.Itoa(n)+"\n")
		}
	}
	waitFor("generation 1 in force", generation(1))
	assert.Equal(t, 2, admitted("k1"), "the snapshot's burst of 2")

	// An override of k2 (burst 6) in a newer snapshot: k2 gets 6, k1 still none left.
	snap.Generation = 2
	snap.Overrides = []admin.Override{{ID: admin.OverrideID("pro-burst", "k:k2"), Subject: "k:k2", Policy: "pro-burst", Burst: 6, ExpiresAt: time.Now().Add(time.Hour).UTC(), Reason: "test"}}
	_, err = policysync.WriteSnapshot(ctx, srv.Client(), snap)
	require.NoError(t, err)
	waitFor("generation 2 in force", generation(2))
	assert.Equal(t, 6, admitted("k2"), "the override's burst of 6")
	assert.Equal(t, 0, admitted("k1"), "k1 has no override and its burst is spent")
}

// TestGatewayAllOrNothingAcrossSubjects is issue #19's example through the
// binary, on a standalone Redis and on a three-node cluster: a per-key
// burst of 5 and a per-account quota of 8 per hour; k3 sends 8 requests
// (200 x5, 429 x3); the three it was refused must not count against the
// account, so k4, another key of the account, is admitted 3 times and then
// refused by the account.
func TestGatewayAllOrNothingAcrossSubjects(t *testing.T) {
	const policies = `[
 {"id":"burst","subject":"api_key","algorithm":"token_bucket","rate_per_sec":0.01,"burst":5},
 {"id":"acct","subject":"account","algorithm":"fixed_window","limit":8,"window_s":3600}
]`
	const keys = `{"k3":{"tier":"pro","account":"acme"},"k4":{"tier":"pro","account":"acme"}}`
	for _, layout := range []string{"standalone", "cluster"} {
		t.Run(layout, func(t *testing.T) {
			var addr string
			if layout == "standalone" {
				addr = redistest.StartServer(t).Addr()
			} else {
				addr = strings.Join(redistest.StartCluster(t).Addrs(), ",")
			}
			// The account's window is the UTC hour: start well inside one,
			// waiting (at most 15 s) when the hour is about to end.
			if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 15*time.Second {
				t.Logf("waiting %v for the next hour", left)
				time.Sleep(left)
			}
			dir := t.TempDir()
			base, _, _ := startGateway(t,
				"--upstream", upstream(t).URL, "--redis", addr,
				"--policies", gwFile(t, dir, "p.json", policies),
				"--keys", gwFile(t, dir, "k.json", keys),
				"--timeout", "2s")
			c := &http.Client{Timeout: 10 * time.Second}
			send := func(key string, n int) (codes []int, last *http.Response) {
				for range n {
					resp, _ := get(t, c, base+"/v1/orders", map[string]string{"X-API-Key": key})
					codes = append(codes, resp.StatusCode)
					last = resp
				}
				return codes, last
			}
			codes, _ := send("k3", 8)
			assert.Equal(t, []int{200, 200, 200, 200, 200, 429, 429, 429}, codes, "k3")
			codes, last := send("k4", 4)
			assert.Equal(t, []int{200, 200, 200, 429}, codes, "k4: the account kept 3 for it")
			rl, err := httpsfv.UnmarshalList(last.Header.Values("RateLimit"))
			require.NoError(t, err)
			require.NotEmpty(t, rl)
			assert.Equal(t, "acct", rl[0].(httpsfv.Item).Value, "the account refused k4's fourth request")
			r, _ := rl[0].(httpsfv.Item).Params.Get("r")
			assert.Equal(t, int64(0), r)
		})
	}
}
