package kafkautil_test

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/internal/tlsconfig"
	"github.com/quotientlabs/quotient/internal/tlsconfig/tlstest"
)

// secureBroker starts kfake with TLS and SASL (a SCRAM-SHA-512 and a PLAIN
// superuser) and returns its addresses and the CA that signed it.
func secureBroker(t *testing.T) ([]string, *tlstest.CA) {
	t.Helper()
	ca := tlstest.NewCA(t, "kafka")
	pair := ca.Server(t, "broker")
	cert, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
	require.NoError(t, err)
	fake, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.TLS(&tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}),
		kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-512", "coordinator", "scram-pw"),
		kfake.Superuser("PLAIN", "plainuser", "plain-pw"))
	require.NoError(t, err)
	t.Cleanup(fake.Close)
	return fake.ListenAddrs(), ca
}

func TestTLSAndSASL(t *testing.T) {
	brokers, ca := secureBroker(t)
	good, err := tlsconfig.Client{CAFile: ca.CertFile}.Config()
	require.NoError(t, err)
	cluster := func(tlsCfg *tls.Config, mech, user, pw string) *kafkautil.Cluster {
		cfg := kafkautil.DefaultConfig(brokers...)
		cfg.TLS = tlsCfg
		if mech != "" {
			m, err := kafkautil.NewSASL(mech, user, pw)
			require.NoError(t, err)
			cfg.SASL = m
		}
		cl, err := kafkautil.New(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	for _, m := range []struct{ mech, user, pw string }{
		{"SCRAM-SHA-512", "coordinator", "scram-pw"},
		{"plain", "plainuser", "plain-pw"},
	} {
		cl := cluster(good, m.mech, m.user, m.pw)
		require.NoError(t, cl.Check(ctx), m.mech)
		topic := "secure-" + m.user
		require.NoError(t, cl.EnsureTopics(ctx, kafkautil.RetainedTopic(topic, 1, 1, time.Hour)))
		w, err := cl.NewWriter(kafkautil.DefaultWriterConfig(topic))
		require.NoError(t, err)
		require.NoError(t, w.WriteMessages(ctx, kafka.Message{Value: []byte("over TLS and " + m.mech)}))
		require.NoError(t, w.Close())
		r, err := cl.NewPartitionReader(topic, 0, kafka.FirstOffset, kafkautil.ReaderConfig{})
		require.NoError(t, err)
		msg, err := r.ReadMessage(ctx)
		require.NoError(t, err)
		assert.Equal(t, "over TLS and "+m.mech, string(msg.Value))
		require.NoError(t, r.Close())
	}

	err = cluster(good, "SCRAM-SHA-512", "coordinator", "wrong").Check(ctx)
	assert.ErrorIs(t, err, kafkautil.ErrAuth, "%v", err)
	err = cluster(good, "", "", "").Check(ctx)
	assert.Error(t, err, "no SASL where the broker requires it")

	wrongCA, err := tlsconfig.Client{CAFile: tlstest.NewCA(t, "other").CertFile}.Config()
	require.NoError(t, err)
	err = cluster(wrongCA, "SCRAM-SHA-512", "coordinator", "scram-pw").Check(ctx)
	assert.Equal(t, tlsconfig.CauseUnknownAuthority, tlsconfig.Diagnose(err), "%v", err)

	err = cluster(nil, "SCRAM-SHA-512", "coordinator", "scram-pw").Check(ctx)
	assert.Error(t, err, "plaintext to a TLS listener")
	t.Logf("plaintext to TLS: %v (%v)", err, tlsconfig.Diagnose(err))
}

func TestNewSASLRejects(t *testing.T) {
	_, err := kafkautil.NewSASL("GSSAPI", "u", "p")
	assert.ErrorIs(t, err, kafkautil.ErrConfig)
	assert.ErrorContains(t, err, `"GSSAPI"`)
	_, err = kafkautil.NewSASL("SCRAM-SHA-512", "", "p")
	assert.ErrorContains(t, err, "user name is empty")
	_, err = kafkautil.NewSASL("PLAIN", "u", "")
	assert.ErrorContains(t, err, "password is empty")
}

// TestTLSClientCertificates: brokers that require client certificates
// accept a Cluster with one signed by their CA and refuse one without.
func TestTLSClientCertificates(t *testing.T) {
	ca := tlstest.NewCA(t, "kafka")
	pair := ca.Server(t, "broker")
	client := ca.Client(t, "coordinator")
	cert, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
	require.NoError(t, err)
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(&tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()}))
	require.NoError(t, err)
	t.Cleanup(fake.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		files tlsconfig.Client
		ok    bool
	}{
		{tlsconfig.Client{CAFile: ca.CertFile, CertFile: client.CertFile, KeyFile: client.KeyFile}, true},
		{tlsconfig.Client{CAFile: ca.CertFile}, false},
	} {
		tlsCfg, err := tc.files.Config()
		require.NoError(t, err)
		cfg := kafkautil.DefaultConfig(fake.ListenAddrs()...)
		cfg.TLS = tlsCfg
		cl, err := kafkautil.New(cfg)
		require.NoError(t, err)
		err = cl.Check(ctx)
		if tc.ok {
			assert.NoError(t, err)
		} else {
			assert.Equal(t, tlsconfig.CauseClientCert, tlsconfig.Diagnose(err), "%v", err)
		}
		_ = cl.Close()
	}
}
