package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quotientlabs/quotient/internal/kafkautil"
	"github.com/quotientlabs/quotient/internal/tlsconfig"
	"github.com/quotientlabs/quotient/internal/tlsconfig/tlstest"
)

// TestRunServesTLSAndSASL: devkafka with --tls-cert/--tls-key and --sasl
// SCRAM-SHA-512 serves a client configured as the coordinator is
// (kafkautil with TLS and SCRAM), and refuses a wrong password.
func TestRunServesTLSAndSASL(t *testing.T) {
	ca := tlstest.NewCA(t, "dev")
	pair := ca.Server(t, "devkafka")
	pw := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(pw, []byte("dev-secret\n"), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lines := make(lineWriter, 8)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--tls-cert", pair.CertFile, "--tls-key", pair.KeyFile,
			"--sasl", "SCRAM-SHA-512", "--sasl-user", "coordinator", "--sasl-password-file", pw}, lines, io.Discard)
	}()
	var addr string
	select {
	case addr = <-lines:
	case err := <-done:
		t.Fatalf("run returned early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no listen address printed within 10s")
	}
	tlsCfg, err := tlsconfig.Client{CAFile: ca.CertFile}.Config()
	require.NoError(t, err)
	cluster := func(pw string) *kafkautil.Cluster {
		cfg := kafkautil.DefaultConfig(addr)
		cfg.TLS = tlsCfg
		cfg.SASL, err = kafkautil.NewSASL("SCRAM-SHA-512", "coordinator", pw)
		require.NoError(t, err)
		cl, err := kafkautil.New(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	cl := cluster("dev-secret")
	require.NoError(t, cl.Check(wctx))
	require.NoError(t, cl.EnsureTopics(wctx, kafkautil.RetainedTopic("dev", 1, 1, time.Hour)))
	w, err := cl.NewWriter(kafkautil.DefaultWriterConfig("dev"))
	require.NoError(t, err)
	require.NoError(t, w.WriteMessages(wctx, kafka.Message{Value: []byte("v")}))
	require.NoError(t, w.Close())
	assert.ErrorIs(t, cluster("wrong").Check(wctx), kafkautil.ErrAuth)

	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return within 10s of cancel")
	}
}

func TestRunRejectsBadSecurityFlags(t *testing.T) {
	for want, args := range map[string][]string{
		"--tls-cert/--tls-key":       {"--tls-cert", "/nonexistent/c.pem", "--tls-key", "/nonexistent/k.pem"},
		"--sasl-user and":            {"--sasl-user", "u"},
		`--sasl "GSSAPI"`:            {"--sasl", "GSSAPI", "--sasl-user", "u"},
		"needs --sasl-user":          {"--sasl", "PLAIN"},
		"--sasl-password-file: tls":  {"--sasl", "PLAIN", "--sasl-user", "u", "--sasl-password-file", "/nonexistent/pw"},
		"both a certificate file an": {"--tls-cert", "/x.pem"},
	} {
		err := run(context.Background(), append([]string{"--listen", "127.0.0.1:0"}, args...), io.Discard, io.Discard)
		require.Error(t, err, "%v", args)
		assert.True(t, strings.Contains(err.Error(), want), "%v: %v", args, err)
	}
}
