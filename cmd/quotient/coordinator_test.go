package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/internal/redistest"
)

func coordinatorEnvOf(vars map[string]string) (environment, *syncBuffer) {
	errb := &syncBuffer{}
	return environment{stdout: io.Discard, stderr: errb, lookupEnv: func(k string) (string, bool) { v, ok := vars[k]; return v, ok }}, errb
}

func writePolicies(t *testing.T, body string) string {
	path := filepath.Join(t.TempDir(), "policies.json")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o644))
	return path
}

const globalPolicy = `[{"id":"g","algorithm":"token_bucket","rate_per_sec":100,"scope":"global"}]`

// TestCoordinatorBadInput: every bad flag, environment value or policy
// file exits 2 with a message naming what was wrong.
func TestCoordinatorBadInput(t *testing.T) {
	good := writePolicies(t, globalPolicy)
	bad := writePolicies(t, `[{"id":"g","algorithm":"token_bucket","rate_per_sec":-1,"scope":"global"}]`)
	regional := writePolicies(t, `[{"id":"r","algorithm":"token_bucket","rate_per_sec":1}]`)
	base := []string{"--region", "a", "--regions", "a,b", "--listen", "127.0.0.1:0"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no region", []string{"--regions", "a", "--policies", good}, nil, "--region is required"},
		{"no regions", []string{"--region", "a", "--policies", good}, nil, "--regions is required"},
		{"no policies", base, nil, "--policies is required"},
		{"missing file", append(base, "--policies", "/nonexistent/p.json"), nil, "--policies: open /nonexistent/p.json"},
		{"bad policy", append(base, "--policies", bad), nil, "policies[0].rate_per_sec"},
		{"no global policy", append(base, "--policies", regional), nil, "no global token_bucket or leaky_bucket policy"},
		{"region not listed", []string{"--region", "z", "--regions", "a,b", "--policies", good}, nil, `does not contain Region "z"`},
		{"bad env", append(base, "--policies", good), map[string]string{"QUOTIENT_EPOCH": "ten"}, `QUOTIENT_EPOCH="ten"`},
		{"cluster with two", append(base, "--policies", good, "--redis", "a:1,b:2", "--redis-cluster"), nil, "--redis-cluster wants one configuration endpoint"},
		{"bad log level", append(base, "--policies", good, "--log-level", "loud"), nil, "--log-level"},
		{"bad shards", append(base, "--policies", good, "--usage-shards", "0"), nil, "--usage-shards 0"},
		{"bad pressure interval", append(base, "--policies", good, "--pressure-interval", "0s"), nil, "--pressure-interval 0s: want a positive duration"},
		{"transfer topic is the usage topic", append(base, "--policies", good, "--transfer-topic", "quotient.usage"), nil, `--transfer-topic "quotient.usage" is --topic`},
		{"unknown flag", append(base, "--nope"), nil, "flag provided but not defined: -nope"},
		{"parts not dividing the shards", append(base, "--policies", good, "--parts", "3"), nil, "--parts 3 does not divide --usage-shards 16384"},
		{"parts with the split layout", append(base, "--policies", good, "--parts", "2"), nil, "--parts 2 needs --usage-split-shards 0"},
		{"no parts", append(base, "--policies", good, "--parts", "0"), nil, "--parts 0: want at least 1"},
		{"missing tokens", append(base, "--admin-tokens-file", "/nonexistent/tokens"), nil, "--admin-tokens-file: open /nonexistent/tokens"},
		{"bad tokens", append(base, "--admin-tokens-file", writePolicies(t, "ops superuser 0123456789abcdef0123\n")), nil, "line 1"},
		{"seeds without bind", append(base, "--policy-log", "--gossip-seeds", "10.0.0.1:7946"), nil, "--gossip-seeds needs --gossip-bind"},
		{"bad gossip bind", append(base, "--policy-log", "--gossip-bind", "7946"), nil, `--gossip-bind "7946": want host:port`},
		{"bad gossip port", append(base, "--policy-log", "--gossip-bind", ":port"), nil, `port "port" is not in 0..65535`},
		{"tokens need unique names", append(base, "--admin-tokens-file", writePolicies(t, "ops admin 0123456789abcdef0123\nops read abcdef0123456789abcd\n")), nil, "--admin-tokens-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, errb := coordinatorEnvOf(tc.env)
			code := run(t.Context(), env, append([]string{"coordinator"}, tc.args...))
			assert.Equal(t, 2, code)
			assert.Contains(t, errb.String(), tc.want)
		})
	}
	env, _ := coordinatorEnvOf(nil)
	assert.Equal(t, 0, run(t.Context(), env, []string{"coordinator", "-h"}))
}

// TestCoordinatorRunsAndStops: configured from the environment against a
// real redis-server and kfake, the command serves /healthz and exits 0
// when its context ends (SIGTERM in main).
func TestCoordinatorRunsAndStops(t *testing.T) {
	testCoordinatorRuns(t, map[string]string{"QUOTIENT_POLICIES": writePolicies(t, globalPolicy)}, "/healthz", "", "")
}

// TestCoordinatorRunsParts: with --parts 4 (and the packed usage layout
// only) one replica, without gossip, runs every part of the key space:
// /healthz says so, part by part, once each part has collected an epoch.
func TestCoordinatorRunsParts(t *testing.T) {
	body := testCoordinatorRuns(t, map[string]string{
		"QUOTIENT_POLICIES": writePolicies(t, globalPolicy),
		"QUOTIENT_PARTS":    "4", "QUOTIENT_USAGE_SPLIT_SHARDS": "0",
	}, "/healthz", "", `"part":3,"last_epoch":`)
	assert.Contains(t, body, `"role":"parts"`)
	assert.Contains(t, body, `"parts":4`)
	for p := range 4 {
		assert.Contains(t, body, fmt.Sprintf(`"part":%d,`, p))
	}
}

// TestCoordinatorControlPlaneRunsAndStops: the same with the control plane
// from the environment (no policy file: the policy log, the admin API and
// gossip); /readyz answers 200 once the (empty) log is replayed and the
// admin API answers a read token.
func TestCoordinatorControlPlaneRunsAndStops(t *testing.T) {
	const tok = "read-token-0123456789"
	testCoordinatorRuns(t, map[string]string{
		"QUOTIENT_ADMIN_TOKENS_FILE": writePolicies(t, "viewer read "+tok+"\n"),
		"QUOTIENT_GOSSIP_BIND":       "127.0.0.1:0", "QUOTIENT_NODE_NAME": "a-1",
	}, "/readyz", tok, "")
}

// testCoordinatorRuns runs the coordinator with the environment extra,
// waits until probe answers 200 (and its body holds want, when want is
// not empty), checks the admin API with token (when not empty), stops it
// and returns probe's last body.
func testCoordinatorRuns(t *testing.T, extra map[string]string, probe, token, want string) string {
	srv := redistest.StartServer(t)
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	vars := map[string]string{
		"QUOTIENT_REGION": "a", "QUOTIENT_REGIONS": "a", "QUOTIENT_REDIS": srv.Addr(),
		"QUOTIENT_KAFKA": kc.ListenAddrs()[0], "QUOTIENT_LISTEN": addr, "QUOTIENT_EPOCH": "1s",
	}
	maps.Copy(vars, extra)
	env, errb := coordinatorEnvOf(vars)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	go func() { done <- run(ctx, env, []string{"coordinator"}) }()

	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var body []byte
	for {
		resp, err := http.Get("http://" + addr + probe)
		if err == nil {
			body, err = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err == nil && resp.StatusCode == http.StatusOK && strings.Contains(string(body), want) {
				break
			}
			err = fmt.Errorf("%s: %s", resp.Status, body)
		}
		require.True(t, time.Now().Before(deadline), "no /healthz by the deadline: %v\n%s", err, errb.String())
		select {
		case code := <-done:
			t.Fatalf("exited early with %d: %s", code, errb.String())
		case <-tick.C:
		}
	}
	if token != "" {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+"/v1/policies", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, 0, code, errb.String())
	case <-time.After(30 * time.Second):
		t.Fatal("coordinator did not stop within 30 s of cancel")
	}
	assert.Contains(t, errb.String(), "coordinator stopped")
	return string(body)
}
