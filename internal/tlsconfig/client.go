package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// ErrConfig wraps every error about a bad setting (a missing file, a file
// that holds no certificate, a certificate without its key).
var ErrConfig = errors.New("tlsconfig: invalid setting")

// Client says how a client verifies a server and, optionally, proves who
// it is. The zero value verifies the server against the system's roots
// with the dialled host name, and sends no certificate.
type Client struct {
	// CAFile is a PEM bundle of the certificate authorities the server's
	// certificate must chain to. Empty: the system's roots (ElastiCache
	// and MSK certificates chain to Amazon's public roots, which are
	// among them).
	CAFile string
	// ServerName is the name the server's certificate must carry. Empty:
	// the host part of the address dialled.
	ServerName string
	// CertFile and KeyFile are the client's PEM certificate (chain) and
	// private key, for servers that authenticate clients (mutual TLS).
	// Both or neither.
	CertFile, KeyFile string
}

// Config reads the files and returns a *tls.Config with MinVersion TLS 1.2.
// Errors wrap ErrConfig and name the file and what is wrong with it. The
// files are read once: rotating a client certificate takes a restart.
func (c Client) Config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pool, err := LoadCertPool(c.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, fmt.Errorf("%w: a client certificate needs both a certificate file and a key file (got certificate %q, key %q)", ErrConfig, c.CertFile, c.KeyFile)
	}
	if c.CertFile != "" {
		cert, err := LoadKeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// LoadCertPool reads a PEM bundle of CA certificates. Errors wrap ErrConfig:
// a file that cannot be read, or one that holds no PEM certificate.
func LoadCertPool(file string) (*x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w: CA bundle: %v", ErrConfig, err)
	}
	return parseCertPool(file, data)
}

func parseCertPool(file string, data []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%w: CA bundle %s holds no PEM certificate", ErrConfig, file)
	}
	return pool, nil
}

// LoadKeyPair reads a PEM certificate (chain) and its private key. Errors
// wrap ErrConfig and name the files.
func LoadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%w: certificate: %v", ErrConfig, err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%w: key: %v", ErrConfig, err)
	}
	return parseKeyPair(certFile, keyFile, certPEM, keyPEM)
}

func parseKeyPair(certFile, keyFile string, certPEM, keyPEM []byte) (tls.Certificate, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%w: certificate %s with key %s: %v", ErrConfig, certFile, keyFile, err)
	}
	return cert, nil
}
