package main

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/internal/tlsconfig/tlstest"
)

// copyFile writes src's contents to dst (a certificate rotation when dst
// is a file a listener serves).
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	require.NoError(t, err)
	replaceFile(t, dst, string(data)) // a handshake never reads it half-written
}

// servedCopy copies pair to files of a new temporary directory, for a
// listener to serve and the test to rotate (rotate).
func servedCopy(t *testing.T, pair tlstest.Pair) tlstest.Pair {
	t.Helper()
	dir := t.TempDir()
	c := tlstest.Pair{CertFile: filepath.Join(dir, "served.pem"), KeyFile: filepath.Join(dir, "served-key.pem")}
	rotate(t, c, pair)
	return c
}

// rotate writes pair over the served files, key first (a half-done
// rotation, a new key with the old certificate, does not load and is not
// served).
func rotate(t *testing.T, served, pair tlstest.Pair) {
	t.Helper()
	copyFile(t, pair.KeyFile, served.KeyFile)
	copyFile(t, pair.CertFile, served.CertFile)
}

// TestRLSListenerTLS drives `quotient rls` with --listen-tls-cert,
// --listen-tls-key and --listen-tls-client-ca through real gRPC clients:
// a client with a certificate of the client CA is answered; a plaintext
// client and a TLS client without a certificate are refused and consume
// nothing; a certificate written over the served files is used by the
// next connection, without a restart; /metrics on --metrics-listen is
// served with the same TLS.
func TestRLSListenerTLS(t *testing.T) {
	rs := redistest.StartServer(t)
	root := t.TempDir()
	rlsFile(t, filepath.Join(root, "config", "limits.yaml"), rlsLimits, time.Now())
	ca := tlstest.NewCA(t, "quotient")
	served := servedCopy(t, ca.Server(t, "rls")) // a copy, so that the test can rotate it
	envoy := ca.Client(t, "envoy")
	metricsAddr := freeAddr(t)
	addr, stderr, _ := startServing(t, "rls", nil, "--redis", rs.Addr(), "--config-dir", root, "--timeout", "2s",
		"--listen-tls-cert", served.CertFile, "--listen-tls-key", served.KeyFile, "--listen-tls-client-ca", ca.CertFile,
		"--metrics-listen", metricsAddr)

	// call sends one hit of user=u on a new connection with creds.
	call := func(creds credentials.TransportCredentials, u string) (*rlsv3.RateLimitResponse, error) {
		t.Helper()
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		require.NoError(t, err)
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: u}}}}})
	}
	mtls := credentials.NewTLS(ca.ClientConfig(t, &envoy))
	resp, err := call(mtls, "u1")
	require.NoError(t, err, stderr.String())
	assert.Equal(t, rlsv3.RateLimitResponse_OK, resp.OverallCode)
	assert.Equal(t, uint32(1), resp.Statuses[0].LimitRemaining, "one of the day's 2 hits spent")

	_, err = call(insecure.NewCredentials(), "u1")
	require.Error(t, err, "plaintext is refused when TLS is on")
	assert.Equal(t, codes.Unavailable, status.Code(err), err)
	_, err = call(credentials.NewTLS(ca.ClientConfig(t, nil)), "u1")
	require.Error(t, err, "a client without a certificate is refused when a client CA is set")
	assert.Equal(t, codes.Unavailable, status.Code(err), err)
	other := tlstest.NewCA(t, "other")
	stranger := other.Client(t, "stranger")
	strangerCfg := ca.ClientConfig(t, &stranger) // trusts the server, certificate of another CA
	_, err = call(credentials.NewTLS(strangerCfg), "u1")
	require.Error(t, err, "a client certificate that does not chain to the client CA is refused")

	resp, err = call(mtls, "u1")
	require.NoError(t, err)
	assert.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining, "the refused calls consumed nothing")
	assert.Equal(t, rlsv3.RateLimitResponse_OK, resp.OverallCode)

	// /metrics: same certificate, and a client certificate is required.
	https := func(cfg *tls.Config) (*http.Response, error) {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		return c.Get("https://" + metricsAddr + "/metrics")
	}
	mresp, err := https(ca.ClientConfig(t, &envoy))
	require.NoError(t, err)
	body, err := io.ReadAll(mresp.Body)
	require.NoError(t, err)
	_ = mresp.Body.Close()
	assert.Equal(t, http.StatusOK, mresp.StatusCode)
	assert.Contains(t, string(body), "quotient_limiter_decisions_total")
	if mresp, err = https(ca.ClientConfig(t, nil)); err == nil {
		_ = mresp.Body.Close()
	}
	require.Error(t, err, "/metrics without a client certificate is refused")
	if mresp, err = (&http.Client{Timeout: 10 * time.Second}).Get("http://" + metricsAddr + "/metrics"); err == nil {
		_ = mresp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, mresp.StatusCode, "plaintext HTTP on the TLS metrics listener")
	}

	// Rotation: a certificate of a new CA written over the files (key
	// first: the half-done rotation is not served) is what the next
	// connection gets, without a restart.
	rotatedCA := tlstest.NewCA(t, "rotated")
	rotate(t, served, rotatedCA.Server(t, "rls"))
	_, err = call(mtls, "u2")
	require.Error(t, err, "a client that trusts only the old CA rejects the rotated certificate")
	newCfg := rotatedCA.ClientConfig(t, &envoy) // trusts the new CA; its certificate is still of the client CA
	resp, err = call(credentials.NewTLS(newCfg), "u2")
	require.NoError(t, err, stderr.String())
	assert.Equal(t, rlsv3.RateLimitResponse_OK, resp.OverallCode)
	mresp, err = https(rotatedCA.ClientConfig(t, &envoy))
	require.NoError(t, err, "/metrics serves the rotated certificate too")
	_ = mresp.Body.Close()
	assert.Equal(t, http.StatusOK, mresp.StatusCode)
}

// TestRLSListenerTLSFlags: bad listener TLS settings stop the start with
// exit status 2 and one line naming the flag.
func TestRLSListenerTLSFlags(t *testing.T) {
	ca := tlstest.NewCA(t, "quotient")
	pair := ca.Server(t, "rls")
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600))
	base := []string{"--config-dir", "/x", "--redis", "127.0.0.1:1", "--listen", "127.0.0.1:0"}
	cases := []struct {
		args []string
		msg  []string
	}{
		{[]string{"--listen-tls-cert", pair.CertFile}, []string{"--listen-tls-cert and --listen-tls-key go together"}},
		{[]string{"--listen-tls-key", pair.KeyFile}, []string{"--listen-tls-cert and --listen-tls-key go together"}},
		{[]string{"--listen-tls-client-ca", ca.CertFile}, []string{"--listen-tls-client-ca needs --listen-tls-cert and --listen-tls-key"}},
		{[]string{"--listen-tls-cert", "/nonexistent/rls.pem", "--listen-tls-key", pair.KeyFile}, []string{"--listen-tls-cert", "/nonexistent/rls.pem"}},
		{[]string{"--listen-tls-cert", pair.CertFile, "--listen-tls-key", "/nonexistent/rls-key.pem"}, []string{"--listen-tls-key", "/nonexistent/rls-key.pem"}},
		{[]string{"--listen-tls-cert", pair.CertFile, "--listen-tls-key", pair.KeyFile, "--listen-tls-client-ca", notPEM}, []string{"--listen-tls-client-ca", notPEM}},
		{[]string{"--listen-tls-cert", pair.CertFile, "--listen-tls-key", ca.CertFile}, []string{"--listen-tls-cert/--listen-tls-key", "rather than a key"}},
	}
	for _, tc := range cases {
		stderr := &syncBuffer{}
		env := environment{stdout: &syncBuffer{}, stderr: stderr, lookupEnv: func(string) (string, bool) { return "", false }}
		assert.Equal(t, 2, run(context.Background(), env, append(append([]string{"rls"}, base...), tc.args...)), tc.args)
		for _, m := range tc.msg {
			assert.Contains(t, stderr.String(), m, tc.args)
		}
	}
}
