package main

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/internal/tlsconfig/tlstest"
)

// tlsGet sends GET url with hdr on a new connection (a new handshake:
// no connection is kept), with cfg as the client's TLS (nil: plain HTTP).
func tlsGet(url string, cfg *tls.Config, hdr map[string]string) (*http.Response, string, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return nil, "", err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, string(body), err
}

// waitReadyTLS polls https://addr/readyz with cfg until it answers 200,
// within limit.
func waitReadyTLS(t *testing.T, addr string, cfg *tls.Config, stderr *syncBuffer, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		resp, body, err := tlsGet("https://"+addr+"/readyz", cfg, nil)
		if err == nil && resp.StatusCode == http.StatusOK {
			return
		}
		require.True(t, time.Now().Before(deadline), "not ready over TLS after %v: %v %s\nstderr:\n%s", limit, err, body, stderr.String())
		time.Sleep(10 * time.Millisecond) // polling a real server with a deadline
	}
}

// tlsGateway is a `quotient gateway` with TLS listeners in front of its
// own redis-server and a plain upstream that counts what it answers, with
// gatewayPolicies (key k1: a burst of 5).
type tlsGateway struct {
	addr, metricsAddr string // --listen, --metrics-listen
	stderr            *syncBuffer
	stop              func()
	hits              atomic.Int64 // requests the upstream answered
}

// startTLSGateway starts the gateway with tlsArgs (the --listen-tls-*
// flags) and waits until client (a TLS configuration it accepts) reads
// /readyz 200.
func startTLSGateway(t *testing.T, client *tls.Config, tlsArgs ...string) *tlsGateway {
	t.Helper()
	rs := redistest.StartServer(t)
	g := &tlsGateway{metricsAddr: freeAddr(t)}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.hits.Add(1)
		_, _ = io.WriteString(w, "hello "+r.URL.Path)
	}))
	t.Cleanup(up.Close)
	dir := t.TempDir()
	g.addr, g.stderr, g.stop = startServing(t, "gateway", nil, append([]string{"--upstream", up.URL, "--redis", rs.Addr(),
		"--policies", gwFile(t, dir, "p.json", gatewayPolicies), "--keys", gwFile(t, dir, "k.json", gatewayKeys),
		"--timeout", "1s", "--metrics-listen", g.metricsAddr}, tlsArgs...)...)
	waitReadyTLS(t, g.addr, client, g.stderr, 20*time.Second)
	return g
}

var k1 = map[string]string{"X-API-Key": "k1"}

// answered checks that a request of k1 with client is answered by the
// upstream.
func (g *tlsGateway) answered(t *testing.T, client *tls.Config) {
	t.Helper()
	resp, body, err := tlsGet("https://"+g.addr+"/v1/orders", client, k1)
	require.NoError(t, err, g.stderr.String())
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "hello /v1/orders", body)
}

// restOfBurst checks, after one admitted request of k1, that 4 more are
// admitted and the sixth is not (so the connections refused in between
// spent nothing) and that the upstream saw only the 5.
func (g *tlsGateway) restOfBurst(t *testing.T, client *tls.Config) {
	t.Helper()
	var codes []int
	for range 5 {
		resp, _, err := tlsGet("https://"+g.addr+"/v1/orders", client, k1)
		require.NoError(t, err)
		codes = append(codes, resp.StatusCode)
	}
	assert.Equal(t, []int{200, 200, 200, 200, 429}, codes, "the refused connections spent nothing of the burst of 5")
	assert.Equal(t, int64(5), g.hits.Load(), "requests that reached the upstream")
}

// TestGatewayListenerTLS drives `quotient gateway` with --listen-tls-cert
// and --listen-tls-key (no client CA): a TLS client that trusts the CA
// gets its answer from the upstream, on --listen and on --metrics-listen;
// a plaintext client and a client that does not trust the certificate
// are refused and reach neither the limiter nor the upstream.
func TestGatewayListenerTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "quotient")
	served := ca.Server(t, "gateway")
	trusting := ca.ClientConfig(t, nil)
	g := startTLSGateway(t, trusting, "--listen-tls-cert", served.CertFile, "--listen-tls-key", served.KeyFile)
	addr, metricsAddr := g.addr, g.metricsAddr
	g.answered(t, trusting)

	resp, body, err := tlsGet("http://"+addr+"/v1/orders", nil, k1)
	require.NoError(t, err, "net/http answers a plaintext request on a TLS listener itself")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "plaintext HTTP on the TLS listener: %s", body)
	_, _, err = tlsGet("https://"+addr+"/v1/orders", tlstest.NewCA(t, "other").ClientConfig(t, nil), k1)
	require.Error(t, err, "a client that does not trust the gateway's certificate")
	assert.Contains(t, err.Error(), "certificate signed by unknown authority")
	_, _, err = tlsGet("https://"+addr+"/v1/orders", &tls.Config{MinVersion: tls.VersionTLS12}, k1)
	require.Error(t, err, "the system's roots do not trust the test CA")
	g.restOfBurst(t, trusting)

	resp, body, err = tlsGet("https://"+metricsAddr+"/metrics", trusting, nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `quotient_limiter_decisions_total{decision="rejected",policy="pro-burst"`)
	resp, _, err = tlsGet("http://"+metricsAddr+"/metrics", nil, nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "plaintext HTTP on the TLS metrics listener")
	g.stop()
}

// TestGatewayListenerMutualTLS: with --listen-tls-client-ca every client
// of the gateway must present a certificate of that CA: one with such a
// certificate gets its answer; one without a certificate, or with one of
// another CA, is refused in the handshake and spends nothing, on --listen
// (proxy and /readyz alike) and on --metrics-listen. A certificate of a
// new CA written over the served files is what the next connection gets,
// without a restart.
func TestGatewayListenerMutualTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "quotient")
	served := servedCopy(t, ca.Server(t, "gateway")) // a copy, so that the test can rotate it
	client := ca.Client(t, "service")
	mtls := ca.ClientConfig(t, &client)
	g := startTLSGateway(t, mtls, "--listen-tls-cert", served.CertFile, "--listen-tls-key", served.KeyFile, "--listen-tls-client-ca", ca.CertFile)
	addr, metricsAddr := g.addr, g.metricsAddr
	g.answered(t, mtls)

	for _, path := range []string{"/v1/orders", "/readyz"} {
		_, _, err := tlsGet("https://"+addr+path, ca.ClientConfig(t, nil), k1)
		require.Error(t, err, "%s without a client certificate", path)
		assert.Contains(t, err.Error(), "certificate required", path)
	}
	stranger := tlstest.NewCA(t, "other").Client(t, "stranger")
	_, _, err := tlsGet("https://"+addr+"/v1/orders", ca.ClientConfig(t, &stranger), k1)
	require.Error(t, err, "a client certificate of another CA")
	resp, _, err := tlsGet("http://"+addr+"/v1/orders", nil, k1)
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "plaintext HTTP on the TLS listener")
	g.restOfBurst(t, mtls)

	resp, body, err := tlsGet("https://"+metricsAddr+"/metrics", mtls, nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, "quotient_limiter_decisions_total")
	_, _, err = tlsGet("https://"+metricsAddr+"/metrics", ca.ClientConfig(t, nil), nil)
	require.Error(t, err, "/metrics without a client certificate")

	// Rotation: a certificate of a new CA written over the served files.
	rotatedCA := tlstest.NewCA(t, "rotated")
	rotate(t, served, rotatedCA.Server(t, "gateway"))
	_, _, err = tlsGet("https://"+addr+"/healthz", mtls, nil)
	require.Error(t, err, "a client that trusts only the old CA rejects the rotated certificate")
	newCfg := rotatedCA.ClientConfig(t, &client) // trusts the new CA; its certificate is still of the client CA
	for _, url := range []string{"https://" + addr + "/healthz", "https://" + metricsAddr + "/metrics"} {
		resp, _, err = tlsGet(url, newCfg, nil)
		require.NoError(t, err, "%s: %s", url, g.stderr.String())
		assert.Equal(t, http.StatusOK, resp.StatusCode, url)
	}
	g.stop()
}

// TestGatewayUpstreamTLS: an https:// --upstream that requires a client
// certificate is reached with --upstream-tls-ca, --upstream-tls-cert and
// --upstream-tls-key; without the client certificate, without the CA or
// with another server name the request is 502 and the log names the flag
// to fix.
func TestGatewayUpstreamTLS(t *testing.T) {
	rs := redistest.StartServer(t)
	ca := tlstest.NewCA(t, "quotient")
	pair := ca.Server(t, "upstream")
	client := ca.Client(t, "gateway")
	cert, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
	require.NoError(t, err)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello "+r.URL.Path+" from "+r.TLS.PeerCertificates[0].Subject.CommonName)
	}))
	up.TLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}
	up.StartTLS()
	t.Cleanup(up.Close)
	dir := t.TempDir()
	policies := gwFile(t, dir, "p.json", gatewayPolicies)
	c := &http.Client{Timeout: 10 * time.Second}

	base, _, stop := startGateway(t, "--upstream", up.URL, "--redis", rs.Addr(), "--policies", policies, "--timeout", "1s",
		"--upstream-tls-ca", ca.CertFile, "--upstream-tls-cert", client.CertFile, "--upstream-tls-key", client.KeyFile)
	resp, body := get(t, c, base+"/x", nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	assert.Equal(t, "hello /x from gateway", string(body))
	stop()

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--upstream-tls-ca", ca.CertFile}, "--upstream-tls-cert/--upstream-tls-key: the server rejected the client certificate"},
		{[]string{"--upstream-tls-cert", client.CertFile, "--upstream-tls-key", client.KeyFile}, "--upstream-tls-ca: the server's certificate is not trusted"},
		{[]string{"--upstream-tls-ca", ca.CertFile, "--upstream-tls-cert", client.CertFile, "--upstream-tls-key", client.KeyFile, "--upstream-tls-server-name", "other.example"},
			"--upstream-tls-server-name: the server's certificate is not valid for the server name"},
	} {
		base, stderr, stop := startGateway(t, append([]string{"--upstream", up.URL, "--redis", rs.Addr(), "--policies", policies, "--timeout", "1s"}, tc.args...)...)
		resp, body := get(t, c, base+"/x", nil)
		assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "%v: %s", tc.args, body)
		stop()
		assert.Contains(t, stderr.String(), tc.want, tc.args)
	}
}

// TestGatewayTLSFlags: bad TLS settings of the gateway stop it at start
// with exit status 2 and one line naming the flag (before it connects to
// Redis, which is not there).
func TestGatewayTLSFlags(t *testing.T) {
	ca := tlstest.NewCA(t, "quotient")
	pair := ca.Server(t, "gateway")
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600))
	base := []string{"gateway", "--redis", "127.0.0.1:1", "--policies", "p.json", "--listen", "127.0.0.1:0"}
	https := []string{"--upstream", "https://127.0.0.1:1"}
	cases := []struct {
		args []string
		msg  []string
	}{
		{[]string{"--upstream", "http://127.0.0.1:1", "--listen-tls-cert", pair.CertFile}, []string{"--listen-tls-cert and --listen-tls-key go together"}},
		{[]string{"--upstream", "http://127.0.0.1:1", "--listen-tls-client-ca", ca.CertFile}, []string{"--listen-tls-client-ca needs --listen-tls-cert and --listen-tls-key"}},
		{[]string{"--upstream", "http://127.0.0.1:1", "--listen-tls-cert", "/nonexistent/gw.pem", "--listen-tls-key", pair.KeyFile}, []string{"--listen-tls-cert", "/nonexistent/gw.pem"}},
		{[]string{"--upstream", "http://127.0.0.1:1", "--listen-tls-cert", pair.CertFile, "--listen-tls-key", pair.KeyFile, "--listen-tls-client-ca", notPEM}, []string{"--listen-tls-client-ca", notPEM}},
		{[]string{"--upstream", "http://127.0.0.1:1", "--upstream-tls-ca", ca.CertFile}, []string{"need an https:// --upstream", "http://127.0.0.1:1"}},
		{append(https, "--upstream-tls-ca", "/nonexistent/ca.pem"), []string{"--upstream-tls-ca", "/nonexistent/ca.pem"}},
		{append(https, "--upstream-tls-cert", pair.CertFile), []string{"--upstream-tls-cert", "both a certificate file and a key file"}},
		{append(https, "--upstream-tls-cert", pair.CertFile, "--upstream-tls-key", ca.CertFile), []string{"--upstream-tls-cert/--upstream-tls-key", "rather than a key"}},
		{[]string{"--upstream", "127.0.0.1:9000"}, []string{"--upstream", "want an absolute URL"}},
	}
	for _, tc := range cases {
		stdout, stderr := &syncBuffer{}, &syncBuffer{}
		env := environment{stdout: stdout, stderr: stderr, lookupEnv: func(string) (string, bool) { return "", false }}
		assert.Equal(t, 2, run(context.Background(), env, append(append([]string{}, base...), tc.args...)), tc.args)
		for _, m := range tc.msg {
			assert.Contains(t, stderr.String(), m, tc.args)
		}
		assert.NotContains(t, stdout.String(), "listening on", tc.args)
	}
}
