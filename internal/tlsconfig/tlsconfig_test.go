package tlsconfig_test

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/tlsconfig"
	"github.com/quotientlabs/quotient/internal/tlsconfig/tlstest"
)

// serve accepts TLS connections with cfg on loopback and completes each
// handshake, until the test ends.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if err := c.(*tls.Conn).Handshake(); err == nil {
					_, _ = c.Write([]byte("ok"))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// dial handshakes with addr and reads the server's "ok"; it returns the
// server certificate's common name.
func dial(t *testing.T, addr string, cfg *tls.Config) (string, error) {
	t.Helper()
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: cfg}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil {
		return "", err
	}
	return c.(*tls.Conn).ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

func TestReloaderRotatesWithoutRestart(t *testing.T) {
	ca := tlstest.NewCA(t, "test")
	pair := ca.Server(t, "server")
	var reloadErrs []error
	r, err := tlsconfig.NewReloader(tlsconfig.Server{CertFile: pair.CertFile, KeyFile: pair.KeyFile}, func(err error) { reloadErrs = append(reloadErrs, err) })
	require.NoError(t, err)
	addr := serve(t, r.TLSConfig())
	client := ca.ClientConfig(t, nil)
	client.ServerName = "localhost"

	cn, err := dial(t, addr, client)
	require.NoError(t, err)
	assert.Equal(t, "server", cn)

	// A new CA and a new certificate in the same files: the next handshake
	// serves it, the old CA no longer verifies it.
	ca2 := tlstest.NewCA(t, "rotated")
	p2 := ca2.Server(t, "server2")
	copyFile(t, p2.KeyFile, pair.KeyFile)
	copyFile(t, p2.CertFile, pair.CertFile)
	client2 := ca2.ClientConfig(t, nil)
	client2.ServerName = "localhost"
	cn, err = dial(t, addr, client2)
	require.NoError(t, err)
	assert.Equal(t, "server2", cn)
	_, err = dial(t, addr, client)
	assert.Equal(t, tlsconfig.CauseUnknownAuthority, tlsconfig.Diagnose(err), "%v", err)
	assert.Empty(t, reloadErrs)
}

func TestReloaderKeepsTheLastGoodPair(t *testing.T) {
	ca := tlstest.NewCA(t, "test")
	pair := ca.Server(t, "server")
	var reloadErrs []error
	r, err := tlsconfig.NewReloader(tlsconfig.Server{CertFile: pair.CertFile, KeyFile: pair.KeyFile}, func(err error) { reloadErrs = append(reloadErrs, err) })
	require.NoError(t, err)
	addr := serve(t, r.TLSConfig())
	client := ca.ClientConfig(t, nil)

	// A key that does not match the certificate (half a rotation).
	other := ca.Server(t, "other")
	copyFile(t, other.KeyFile, pair.KeyFile)
	cn, err := dial(t, addr, client)
	require.NoError(t, err)
	assert.Equal(t, "server", cn)
	require.NotEmpty(t, reloadErrs)
	assert.ErrorIs(t, reloadErrs[0], tlsconfig.ErrConfig)
	assert.Error(t, r.Reload())

	// The rotation completes.
	copyFile(t, other.CertFile, pair.CertFile)
	require.NoError(t, r.Reload())
	cn, err = dial(t, addr, client)
	require.NoError(t, err)
	assert.Equal(t, "other", cn)
}

func TestReloaderClientCertificates(t *testing.T) {
	ca := tlstest.NewCA(t, "test")
	pair := ca.Server(t, "server")
	clientPair := ca.Client(t, "admin")
	stranger := tlstest.NewCA(t, "stranger").Client(t, "mallory")

	optional, err := tlsconfig.NewReloader(tlsconfig.Server{CertFile: pair.CertFile, KeyFile: pair.KeyFile, ClientCAFile: ca.CertFile}, nil)
	require.NoError(t, err)
	required, err := tlsconfig.NewReloader(tlsconfig.Server{CertFile: pair.CertFile, KeyFile: pair.KeyFile, ClientCAFile: ca.CertFile, RequireClientCert: true}, nil)
	require.NoError(t, err)
	optAddr, reqAddr := serve(t, optional.TLSConfig()), serve(t, required.TLSConfig())

	_, err = dial(t, optAddr, ca.ClientConfig(t, nil))
	assert.NoError(t, err, "optional client certificates: none is fine")
	_, err = dial(t, optAddr, ca.ClientConfig(t, &clientPair))
	assert.NoError(t, err)

	_, err = dial(t, reqAddr, ca.ClientConfig(t, &clientPair))
	assert.NoError(t, err)
	_, err = dial(t, reqAddr, ca.ClientConfig(t, nil))
	assert.Equal(t, tlsconfig.CauseClientCert, tlsconfig.Diagnose(err), "%v", err)
	_, err = dial(t, reqAddr, ca.ClientConfig(t, &stranger))
	assert.Equal(t, tlsconfig.CauseClientCert, tlsconfig.Diagnose(err), "a certificate of another CA: %v", err)
}

func TestDiagnose(t *testing.T) {
	ca := tlstest.NewCA(t, "test")
	pair := ca.Server(t, "server")
	r, err := tlsconfig.NewReloader(tlsconfig.Server{CertFile: pair.CertFile, KeyFile: pair.KeyFile}, nil)
	require.NoError(t, err)
	addr := serve(t, r.TLSConfig())

	_, err = dial(t, addr, tlstest.NewCA(t, "wrong").ClientConfig(t, nil))
	assert.Equal(t, tlsconfig.CauseUnknownAuthority, tlsconfig.Diagnose(err), "%v", err)

	wrongName := ca.ClientConfig(t, nil)
	wrongName.ServerName = "redis.example.com"
	_, err = dial(t, addr, wrongName)
	assert.Equal(t, tlsconfig.CauseServerName, tlsconfig.Diagnose(err), "%v", err)

	// A plaintext server.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = c.Write([]byte("-ERR unknown command\r\n"))
			_ = c.Close()
		}
	}()
	_, err = dial(t, ln.Addr().String(), ca.ClientConfig(t, nil))
	assert.Equal(t, tlsconfig.CauseNotTLS, tlsconfig.Diagnose(err), "%v", err)

	// A plaintext client to the TLS port: the server closes.
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	for err == nil {
		// The server answers a non-TLS client with at most an alert
		// record or an HTTP 400, never the resource.
		assert.NotContains(t, string(buf[:n]), "ok")
		n, err = c.Read(buf)
	}
	assert.Equal(t, tlsconfig.CauseClosed, tlsconfig.Diagnose(err), "%v", err)

	assert.Equal(t, tlsconfig.CauseNone, tlsconfig.Diagnose(errors.New("dial tcp: connection refused")))
	assert.Equal(t, tlsconfig.CauseNone, tlsconfig.Diagnose(nil))
}

func TestClientConfigErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	_, err := tlsconfig.Client{CAFile: missing}.Config()
	require.ErrorIs(t, err, tlsconfig.ErrConfig)
	assert.Contains(t, err.Error(), missing)

	notPEM := filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o600))
	_, err = tlsconfig.Client{CAFile: notPEM}.Config()
	require.ErrorIs(t, err, tlsconfig.ErrConfig)
	assert.Contains(t, err.Error(), "holds no PEM certificate")

	_, err = tlsconfig.Client{CertFile: notPEM}.Config()
	assert.ErrorContains(t, err, "both a certificate file and a key file")

	ca := tlstest.NewCA(t, "test")
	p := ca.Client(t, "c")
	cfg, err := tlsconfig.Client{CAFile: ca.CertFile, ServerName: "redis", CertFile: p.CertFile, KeyFile: p.KeyFile}.Config()
	require.NoError(t, err)
	assert.Equal(t, "redis", cfg.ServerName)
	assert.Len(t, cfg.Certificates, 1)
	assert.Equal(t, uint16(tls.VersionTLS12), cfg.MinVersion)

	_, err = tlsconfig.NewReloader(tlsconfig.Server{CertFile: missing, KeyFile: missing}, nil)
	require.ErrorIs(t, err, tlsconfig.ErrConfig)
	assert.Contains(t, err.Error(), missing)
	_, err = tlsconfig.NewReloader(tlsconfig.Server{CertFile: p.CertFile, KeyFile: p.KeyFile, RequireClientCert: true}, nil)
	assert.ErrorContains(t, err, "client CA file")
}

func TestSecret(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pw")
	require.NoError(t, os.WriteFile(file, []byte("s3cret\n"), 0o600))
	env := func(name string) (string, bool) {
		if name == "PW" {
			return "from-env", true
		}
		return "", false
	}
	v, err := tlsconfig.Secret{File: file, Env: "PW"}.Read(env)
	require.NoError(t, err)
	assert.Equal(t, "s3cret", v, "the file wins and loses one trailing newline")
	v, err = tlsconfig.Secret{Env: "PW"}.Read(env)
	require.NoError(t, err)
	assert.Equal(t, "from-env", v)
	v, err = tlsconfig.Secret{Env: "UNSET"}.Read(env)
	require.NoError(t, err)
	assert.Empty(t, v)

	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	_, err = tlsconfig.Secret{File: empty}.Read(env)
	assert.ErrorContains(t, err, "is empty")
	_, err = tlsconfig.Secret{File: filepath.Join(dir, "nope")}.Read(env)
	require.ErrorIs(t, err, tlsconfig.ErrConfig)
	assert.NotContains(t, err.Error(), "s3cret")
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	require.NoError(t, err)
	tmp := to + ".tmp"
	require.NoError(t, os.WriteFile(tmp, data, 0o600))
	require.NoError(t, os.Rename(tmp, to))
}

// TestReloaderOffersALPN: the protocols given to NewReloader are offered on
// every handshake (gRPC servers need "h2"), rotation included.
func TestReloaderOffersALPN(t *testing.T) {
	ca := tlstest.NewCA(t, "test")
	pair := ca.Server(t, "grpc")
	r, err := tlsconfig.NewReloader(tlsconfig.Server{CertFile: pair.CertFile, KeyFile: pair.KeyFile}, nil, "h2")
	require.NoError(t, err)
	addr := serve(t, r.TLSConfig())
	client := ca.ClientConfig(t, nil)
	client.NextProtos = []string{"h2"}
	for range 2 {
		c, err := tls.Dial("tcp", addr, client)
		require.NoError(t, err)
		assert.Equal(t, "h2", c.ConnectionState().NegotiatedProtocol)
		_ = c.Close()
		copyFile(t, ca.Server(t, "grpc2").CertFile, pair.CertFile)
		copyFile(t, filepath.Join(filepath.Dir(pair.KeyFile), "grpc2-key.pem"), pair.KeyFile)
	}
}
