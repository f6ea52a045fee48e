package region_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/internal/tlsconfig"
	"github.com/quotientlabs/quotient/internal/tlsconfig/tlstest"
	"github.com/quotientlabs/quotient/region"
	"github.com/quotientlabs/quotient/region/admin"
)

// httpsGet sends one request on a new connection with tlsCfg (and the
// admin token when token), and returns the status, the body and the
// server certificate's common name.
func httpsGet(t *testing.T, url string, tlsCfg *tls.Config, token bool) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	if token {
		req.Header.Set("Authorization", "Bearer "+adminToken)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true}}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.TLS.PeerCertificates[0].Subject.CommonName
}

// TestCoordinatorOverTLS: a coordinator whose every connection is secured,
// with real parts: redis-server serving TLS only with an ACL user (the
// default user has a password too), kfake with TLS and SASL SCRAM-SHA-512,
// and its HTTP listener on TLS with client certificates for the admin API.
// It becomes ready (Redis and Kafka answer over TLS), publishes its epoch
// reports and writes an admin policy through the policy log (Kafka over
// TLS and SASL) into Redis (over TLS, as alice); /healthz needs no client
// certificate, the admin API does; a plaintext request to the port is
// refused; the listener's certificate rotates without a restart; and when
// Redis refuses the credentials after start, /readyz is not ready and says
// why.
func TestCoordinatorOverTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "quotient")
	redisPair, brokerPair, listenPair := ca.Server(t, "redis"), ca.Server(t, "kafka"), ca.Server(t, "coordinator")
	adminPair := ca.Client(t, "operator")

	srv := redistest.StartServer(t, redistest.WithTLS(redistest.TLS{CertFile: redisPair.CertFile, KeyFile: redisPair.KeyFile, CAFile: ca.CertFile}),
		redistest.WithPassword("default-pw"), redistest.WithArgs("--user", "alice", "on", ">alice-pw", "~*", "&*", "+@all"))
	brokerCert, err := tls.LoadX509KeyPair(brokerPair.CertFile, brokerPair.KeyFile)
	require.NoError(t, err)
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(&tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{brokerCert}}),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "coordinator", "kafka-pw"))
	require.NoError(t, err)
	t.Cleanup(kc.Close)

	clientTLS, err := tlsconfig.Client{CAFile: ca.CertFile}.Config()
	require.NoError(t, err)
	mech, err := kafkautil.NewSASL("SCRAM-SHA-512", "coordinator", "kafka-pw")
	require.NoError(t, err)
	var reloadErrs []error
	listenTLS, err := tlsconfig.NewReloader(tlsconfig.Server{CertFile: listenPair.CertFile, KeyFile: listenPair.KeyFile, ClientCAFile: ca.CertFile},
		func(err error) { reloadErrs = append(reloadErrs, err) })
	require.NoError(t, err)
	toks, err := admin.ParseTokens([]byte("ops admin " + adminToken + "\n"))
	require.NoError(t, err)

	cfg := region.DefaultConfig()
	cfg.Region, cfg.Regions, cfg.Epoch = "eu", []string{"eu"}, time.Second
	cfg.MaxWait, cfg.CollectDelay = 500*time.Millisecond, 200*time.Millisecond
	cfg.RedisAddrs, cfg.KafkaBrokers, cfg.Listen = []string{srv.Addr()}, kc.ListenAddrs(), "127.0.0.1:0"
	cfg.RedisTLS, cfg.RedisUsername, cfg.RedisPassword = clientTLS, "alice", "alice-pw"
	cfg.KafkaTLS, cfg.KafkaSASL = clientTLS, mech
	cfg.ListenTLS, cfg.AdminClientCert = listenTLS.TLSConfig(), true
	cfg.PolicyLog, cfg.AdminTokens = true, toks
	c, err := region.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(wait):
			t.Errorf("coordinator did not stop within %v", wait)
		}
	})
	base := "https://" + c.Addr()
	noCert, withCert := ca.ClientConfig(t, nil), ca.ClientConfig(t, &adminPair)

	until(t, wait, "ready over TLS", func() bool {
		code, _, _ := httpsGet(t, base+"/readyz", noCert, false)
		return code == http.StatusOK
	})
	until(t, wait, "a report published over TLS and SASL", func() bool { return !c.Status().LastPublish.IsZero() })

	code, body, cn := httpsGet(t, base+"/v1/policies", noCert, true)
	assert.Equal(t, http.StatusForbidden, code, body)
	assert.Contains(t, body, "client certificate")
	assert.Equal(t, "coordinator", cn)
	code, body, _ = httpsGet(t, base+"/v1/policies", withCert, true)
	assert.Equal(t, http.StatusOK, code, body)

	// An admin write: a record on the policy log, materialised in Redis.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, base+"/v1/policies/pro-burst",
		strings.NewReader(`{"expected_version":0,"enforce":true,"policy":{"algorithm":"token_bucket","rate_per_sec":1,"burst":2,"scope":"global","match":{"tier":"pro"}}}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: withCert}}).Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, string(b))
	until(t, wait, "the policy in force", func() bool {
		_, body, _ := httpsGet(t, base+"/readyz", noCert, false)
		var m map[string]any
		return json.Unmarshal([]byte(body), &m) == nil && strings.HasPrefix(m["policy_source"].(string), "log")
	})
	keys, err := srv.Client().Keys(t.Context(), "*").Result()
	require.NoError(t, err)
	assert.NotEmpty(t, keys, "the materialiser wrote to Redis over TLS")

	// Plaintext HTTP to the TLS port is answered with 400, never served.
	conn, err := net.DialTimeout("tcp", c.Addr(), 5*time.Second)
	require.NoError(t, err)
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	raw, _ := io.ReadAll(conn)
	_ = conn.Close()
	assert.Contains(t, string(raw), "400 Bad Request")
	assert.NotContains(t, string(raw), "healthy")

	// Rotation: a new certificate in the same files; the next connection
	// gets it, with no restart.
	rotated := ca.Server(t, "coordinator-rotated")
	replace(t, rotated.KeyFile, listenPair.KeyFile)
	replace(t, rotated.CertFile, listenPair.CertFile)
	code, _, cn = httpsGet(t, base+"/healthz", noCert, false)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "coordinator-rotated", cn)
	assert.Empty(t, reloadErrs)

	// Credentials that stop working after start (alice's password
	// changed, her connections closed): /readyz says not ready and why.
	require.NoError(t, srv.Client().Do(t.Context(), "ACL", "SETUSER", "alice", "resetpass", ">rotated-pw").Err())
	require.NoError(t, srv.Client().Do(t.Context(), "CLIENT", "KILL", "USER", "alice").Err())
	until(t, wait, "not ready once AUTH is refused", func() bool {
		code, body, _ := httpsGet(t, base+"/readyz", noCert, false)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "WRONGPASS")
	})
}

// replace copies from over to through a rename, as a certificate manager
// would.
func replace(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(to+".new", data, 0o600))
	require.NoError(t, os.Rename(to+".new", to))
}

func TestNewRefusesAdminInTheClear(t *testing.T) {
	toks, err := admin.ParseTokens([]byte("ops admin " + adminToken + "\n"))
	require.NoError(t, err)
	cfg := region.DefaultConfig()
	cfg.Region, cfg.Regions = "a", []string{"a"}
	cfg.RedisAddrs, cfg.KafkaBrokers = []string{"127.0.0.1:1"}, []string{"127.0.0.1:2"}
	cfg.PolicyLog, cfg.AdminTokens = true, toks
	for _, listen := range []string{":0", "0.0.0.0:0", "[::]:0", "10.1.2.3:9090", "coordinator.internal:9090"} {
		cfg.Listen = listen
		_, err := region.New(cfg)
		require.ErrorIs(t, err, region.ErrConfig, listen)
		assert.ErrorContains(t, err, "in the clear", listen)
	}
	cfg.AdminClientCert = true
	_, err = region.New(cfg)
	assert.ErrorContains(t, err, "AdminClientCert needs ListenTLS")

	for _, listen := range []string{"127.0.0.1:0", "[::1]:0", "localhost:0"} {
		cfg.AdminClientCert, cfg.Listen = false, listen
		c, err := region.New(cfg)
		require.NoError(t, err, "loopback %s is fine without TLS", listen)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		require.NoError(t, c.Run(ctx))
	}
	cfg.Listen, cfg.AdminInsecure = ":0", true
	c, err := region.New(cfg)
	require.NoError(t, err, "the explicit insecure flag")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.NoError(t, c.Run(ctx))
}
