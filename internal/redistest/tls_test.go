package redistest

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/tlsconfig/tlstest"
)

func TestTLSServerWithPasswordAndACLUser(t *testing.T) {
	ctx := testCtx(t)
	ca := tlstest.NewCA(t, "redis")
	pair := ca.Server(t, "redis")
	s := StartServer(t, WithTLS(TLS{CertFile: pair.CertFile, KeyFile: pair.KeyFile, CAFile: ca.CertFile}),
		WithPassword("pw-default"), WithArgs("--user", "alice", "on", ">pw-alice", "~*", "&*", "+@all"))

	require.NoError(t, s.Client().Set(ctx, "k", "v", 0).Err())

	alice := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: ca.ClientConfig(t, nil), Username: "alice", Password: "pw-alice"})
	defer alice.Close()
	got, err := alice.Get(ctx, "k").Result()
	require.NoError(t, err)
	assert.Equal(t, "v", got)

	plain := redis.NewClient(&redis.Options{Addr: s.Addr(), Password: "pw-default", MaxRetries: -1})
	defer plain.Close()
	assert.Error(t, plain.Ping(ctx).Err(), "the port speaks TLS only")

	wrong := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: ca.ClientConfig(t, nil), Password: "nope", MaxRetries: -1})
	defer wrong.Close()
	assert.ErrorContains(t, wrong.Ping(ctx).Err(), "WRONGPASS")
}

func TestTLSClusterWithClientCertificates(t *testing.T) {
	ctx := testCtx(t)
	ca := tlstest.NewCA(t, "redis")
	node := ca.Both(t, "node")
	client := ca.Client(t, "client")
	c := StartCluster(t, WithTLS(TLS{CertFile: node.CertFile, KeyFile: node.KeyFile, CAFile: ca.CertFile, ClientCertFile: client.CertFile, ClientKeyFile: client.KeyFile}),
		WithPassword("pw"))
	for i := range 20 {
		require.NoError(t, c.Client().Set(ctx, fmt.Sprintf("k%d", i), i, 0).Err())
	}
	for i := range 20 {
		got, err := c.Client().Get(ctx, fmt.Sprintf("k%d", i)).Int()
		require.NoError(t, err)
		assert.Equal(t, i, got)
	}

	noCert := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), TLSConfig: ca.ClientConfig(t, nil), Password: "pw", MaxRetries: -1})
	defer noCert.Close()
	assert.Error(t, noCert.Ping(ctx).Err(), "the nodes require a client certificate")
}
