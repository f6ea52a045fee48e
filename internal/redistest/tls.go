package redistest

import (
	"crypto/tls"
	"fmt"
	"strconv"

	"github.com/quotientlabs/quotient/internal/tlsconfig"
)

// TLS makes a server (every node of a cluster) serve TLS only: its port
// speaks TLS (redis-server --tls-port; the plaintext port is off), and a
// cluster's nodes gossip over TLS too (--tls-cluster). Make the
// certificates with package tlsconfig/tlstest.
type TLS struct {
	// CertFile and KeyFile are the server's certificate and key. A cluster
	// node dials its peers with the same pair, so for a cluster with
	// ClientCertFile set it must be good for client authentication too
	// (tlstest's CA.Both).
	CertFile, KeyFile string
	// CAFile is the bundle the server verifies client certificates with,
	// and that this package's own clients (readiness probe, Client)
	// verify the server with.
	CAFile string
	// ClientCertFile and ClientKeyFile, when set, make the server require
	// client certificates (tls-auth-clients yes); this package's clients
	// present this pair. Empty: clients are not asked for one
	// (tls-auth-clients no).
	ClientCertFile, ClientKeyFile string
}

// WithTLS makes the server (every node of a cluster) serve TLS only; see
// TLS. The readiness probe and Client speak TLS to it.
func WithTLS(t TLS) Option {
	return func(c *config) { c.tls = &t }
}

// WithPassword sets the default user's password (requirepass); the
// readiness probe and Client authenticate with it. Add ACL users with
// WithArgs("--user", "alice", "on", ">pw", "~*", "&*", "+@all") (one argument per
// word: redis-server refuses a user name with spaces).
func WithPassword(pw string) Option {
	return func(c *config) { c.password = pw }
}

// clientTLS is the configuration of this package's own clients, nil
// without TLS.
func (c config) clientTLS() (*tls.Config, error) {
	if c.tls == nil {
		return nil, nil
	}
	cfg, err := tlsconfig.Client{CAFile: c.tls.CAFile, CertFile: c.tls.ClientCertFile, KeyFile: c.tls.ClientKeyFile}.Config()
	if err != nil {
		return nil, fmt.Errorf("redistest: TLS: %w", err)
	}
	return cfg, nil
}

// tlsArgs are the redis-server arguments of TLS on port.
func (c config) tlsArgs(port int, cluster bool) []string {
	if c.tls == nil {
		return []string{"--port", strconv.Itoa(port)}
	}
	auth := "no"
	if c.tls.ClientCertFile != "" {
		auth = "yes"
	}
	a := []string{
		"--port", "0",
		"--tls-port", strconv.Itoa(port),
		"--tls-cert-file", c.tls.CertFile,
		"--tls-key-file", c.tls.KeyFile,
		"--tls-ca-cert-file", c.tls.CAFile,
		"--tls-auth-clients", auth,
	}
	if cluster {
		a = append(a, "--tls-cluster", "yes", "--tls-replication", "yes")
	}
	return a
}
