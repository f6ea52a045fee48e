// Package tlstest makes certificate authorities and certificates for tests:
// a CA, server certificates for loopback (127.0.0.1, ::1, localhost) and
// client certificates, each written as PEM files into the test's temporary
// directory. ECDSA P-256 keys, valid from an hour ago for a day.
//
// It is for tests only: nothing outside _test.go files (and other
// test-helper packages) may import it. No global state; every function
// fails the test (t.Fatalf) on error, so call it from the test's goroutine.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a test certificate authority. CertFile is its PEM certificate, the
// bundle clients and servers trust.
type CA struct {
	Name     string
	CertFile string
	cert     *x509.Certificate
	key      *ecdsa.PrivateKey
	dir      string
}

// Pair is a certificate and its key, as PEM files.
type Pair struct {
	CertFile, KeyFile string
}

// NewCA makes a CA named name (its common name) in a new temporary
// directory of t.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("tlstest: CA %s: %v", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("tlstest: CA %s: %v", name, err)
	}
	dir := t.TempDir()
	ca := &CA{Name: name, cert: cert, key: key, dir: dir, CertFile: filepath.Join(dir, name+"-ca.pem")}
	writePEM(t, ca.CertFile, "CERTIFICATE", der)
	return ca
}

// Server issues a server certificate with common name cn, valid for
// 127.0.0.1, ::1, localhost and the extra DNS names or IPs given, and
// writes it to <cn>.pem and <cn>-key.pem in the CA's directory
// (overwriting an earlier pair of the same name: that is a rotation).
func (ca *CA) Server(t testing.TB, cn string, names ...string) Pair {
	t.Helper()
	tmpl := ca.template(t, cn)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	tmpl.DNSNames = []string{"localhost"}
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	return ca.issue(t, cn, tmpl)
}

// Client issues a client certificate with common name cn (files <cn>.pem
// and <cn>-key.pem in the CA's directory).
func (ca *CA) Client(t testing.TB, cn string) Pair {
	t.Helper()
	tmpl := ca.template(t, cn)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return ca.issue(t, cn, tmpl)
}

// Both issues a certificate good for both server and client use (a Redis
// Cluster node, which dials its peers with the certificate it serves).
func (ca *CA) Both(t testing.TB, cn string) Pair {
	t.Helper()
	tmpl := ca.template(t, cn)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	tmpl.DNSNames = []string{"localhost"}
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	return ca.issue(t, cn, tmpl)
}

// Pool returns a pool holding the CA's certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// ClientConfig returns a client configuration that trusts this CA, with
// the pair as client certificate when given.
func (ca *CA) ClientConfig(t testing.TB, pair *Pair) *tls.Config {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.Pool()}
	if pair != nil {
		cert, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
		if err != nil {
			t.Fatalf("tlstest: %v", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

func (ca *CA) template(t testing.TB, cn string) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
}

func (ca *CA) issue(t testing.TB, cn string, tmpl *x509.Certificate) Pair {
	t.Helper()
	key := newKey(t)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("tlstest: certificate %s: %v", cn, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("tlstest: key %s: %v", cn, err)
	}
	p := Pair{CertFile: filepath.Join(ca.dir, cn+".pem"), KeyFile: filepath.Join(ca.dir, cn+"-key.pem")}
	// Key first, then certificate, each through a rename: a reader sees
	// either the old pair, the new pair, or a new key with the old
	// certificate (which does not load and is retried), never a torn file.
	writePEM(t, p.KeyFile, "PRIVATE KEY", keyDER)
	writePEM(t, p.CertFile, "CERTIFICATE", der)
	return p
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("tlstest: key: %v", err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatalf("tlstest: serial: %v", err)
	}
	return n
}

func writePEM(t testing.TB, file, typ string, der []byte) {
	t.Helper()
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("tlstest: %v", err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatalf("tlstest: %v", err)
	}
}
