package redisconn_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/redisconn"
	"github.com/quotientlabs/quotient/internal/redistest"
	"github.com/quotientlabs/quotient/internal/tlsconfig"
	"github.com/quotientlabs/quotient/internal/tlsconfig/tlstest"
)

func TestParseAddrs(t *testing.T) {
	for _, tc := range []struct {
		in    []string
		addrs []string
		tls   bool
		user  string
		err   string
	}{
		{in: []string{"10.0.0.1:6379", "10.0.0.2:6380"}, addrs: []string{"10.0.0.1:6379", "10.0.0.2:6380"}},
		{in: []string{"rediss://cfg.example.com:6380"}, addrs: []string{"cfg.example.com:6380"}, tls: true},
		{in: []string{"rediss://alice@cfg.example.com"}, addrs: []string{"cfg.example.com:6379"}, tls: true, user: "alice"},
		{in: []string{"redis://[::1]:7000"}, addrs: []string{"[::1]:7000"}},
		{in: []string{"rediss://alice:hunter2@h:1"}, err: "holds a password"},
		{in: []string{"redis://a:1", "rediss://b:1"}, err: "mix redis:// and rediss://"},
		{in: []string{"http://a:1"}, err: `scheme "http"`},
		{in: []string{"rediss://a:1/0"}, err: "nothing after it"},
		{in: []string{"localhost"}, err: `address "localhost"`},
		{in: []string{"rediss://alice@a:1", "rediss://bob@b:1"}, err: "two users"},
	} {
		addrs, useTLS, user, err := redisconn.ParseAddrs(tc.in)
		if tc.err != "" {
			require.ErrorIs(t, err, redisconn.ErrConfig, "%v", tc.in)
			assert.ErrorContains(t, err, tc.err)
			assert.NotContains(t, err.Error(), "hunter2")
			continue
		}
		require.NoError(t, err, "%v", tc.in)
		assert.Equal(t, tc.addrs, addrs)
		assert.Equal(t, tc.tls, useTLS)
		assert.Equal(t, tc.user, user)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestCheckTLSAndAuth(t *testing.T) {
	ca := tlstest.NewCA(t, "redis")
	pair := ca.Server(t, "redis")
	srv := redistest.StartServer(t, redistest.WithTLS(redistest.TLS{CertFile: pair.CertFile, KeyFile: pair.KeyFile, CAFile: ca.CertFile}),
		redistest.WithPassword("token"), redistest.WithArgs("--user", "alice", "on", ">pw-alice", "~*", "&*", "+@all"))
	good, err := tlsconfig.Client{CAFile: ca.CertFile}.Config()
	require.NoError(t, err)

	check := func(o redisconn.Options) error { return o.Check(ctx(t)) }
	addrs := []string{srv.Addr()}
	assert.NoError(t, check(redisconn.Options{Addrs: addrs, TLS: good, Password: "token"}))
	assert.NoError(t, check(redisconn.Options{Addrs: addrs, TLS: good, Username: "alice", Password: "pw-alice"}))

	err = check(redisconn.Options{Addrs: addrs, TLS: good, Password: "wrong"})
	assert.ErrorIs(t, err, redisconn.ErrAuth)
	err = check(redisconn.Options{Addrs: addrs, TLS: good})
	assert.ErrorIs(t, err, redisconn.ErrAuth, "no password where one is required")

	wrongCA, err := tlsconfig.Client{CAFile: tlstest.NewCA(t, "other").CertFile}.Config()
	require.NoError(t, err)
	err = check(redisconn.Options{Addrs: addrs, TLS: wrongCA, Password: "token"})
	assert.Equal(t, tlsconfig.CauseUnknownAuthority, tlsconfig.Diagnose(err), "%v", err)

	err = check(redisconn.Options{Addrs: addrs, Password: "token"})
	assert.Equal(t, tlsconfig.CauseClosed, tlsconfig.Diagnose(err), "plaintext to a TLS port: %v", err)

	plain := redistest.StartServer(t)
	short, cancel := context.WithTimeout(ctx(t), time.Second)
	defer cancel()
	err = redisconn.Options{Addrs: []string{plain.Addr()}, TLS: good}.Check(short)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "TLS to a plaintext port: Redis waits for a line; the check ends with its context: %v", err)
}

func TestCheckTLSCluster(t *testing.T) {
	ca := tlstest.NewCA(t, "redis")
	node := ca.Both(t, "node")
	client := ca.Client(t, "client")
	c := redistest.StartCluster(t, redistest.WithTLS(redistest.TLS{CertFile: node.CertFile, KeyFile: node.KeyFile, CAFile: ca.CertFile, ClientCertFile: client.CertFile, ClientKeyFile: client.KeyFile}),
		redistest.WithPassword("token"))
	good, err := tlsconfig.Client{CAFile: ca.CertFile, CertFile: client.CertFile, KeyFile: client.KeyFile}.Config()
	require.NoError(t, err)
	for _, o := range []redisconn.Options{
		{Addrs: c.Addrs(), TLS: good, Password: "token"},
		{Addrs: c.Addrs()[:1], Cluster: true, TLS: good, Password: "token"},
	} {
		require.NoError(t, o.Check(ctx(t)))
		cl := o.New()
		require.NoError(t, cl.Set(ctx(t), "{x}k", "v", 0).Err())
		_ = cl.Close()
	}
	assert.ErrorIs(t, redisconn.Options{Addrs: c.Addrs(), TLS: good, Password: "nope"}.Check(ctx(t)), redisconn.ErrAuth)

	noCert, err := tlsconfig.Client{CAFile: ca.CertFile}.Config()
	require.NoError(t, err)
	err = redisconn.Options{Addrs: c.Addrs(), TLS: noCert, Password: "token"}.Check(ctx(t))
	assert.Equal(t, tlsconfig.CauseClientCert, tlsconfig.Diagnose(err), "%v", err)
}
