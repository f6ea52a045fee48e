package tlsconfig

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"slices"
	"sync"
)

// Server says how a listener serves TLS. CertFile and KeyFile are required.
type Server struct {
	// CertFile and KeyFile are the listener's PEM certificate (chain) and
	// private key. They are re-read when they change (see Reloader).
	CertFile, KeyFile string
	// ClientCAFile, when set, is a PEM bundle of the authorities whose
	// client certificates the listener accepts; it is re-read when it
	// changes too. Empty: clients are not asked for a certificate.
	ClientCAFile string
	// RequireClientCert makes the handshake fail without a valid client
	// certificate. Default false: with ClientCAFile, a certificate is
	// verified if the client sends one (tls.VerifyClientCertIfGiven), and
	// the handler decides per request (see HasVerifiedClientCert), so
	// health checks and metrics scrapes need none while the admin API
	// does. It needs ClientCAFile.
	RequireClientCert bool
}

// Reloader serves a listener's TLS from files and picks up new ones without
// a restart: every handshake reads the certificate, the key and the client
// CA bundle again (a few kilobytes; no parse unless they changed), and a
// changed set that loads completely replaces the old one. A set that does
// not load (a half-written file, a certificate that does not match its
// key) is reported to the error callback and the last good one stays in
// use. So rotation is: write the new files (key first, or both through a
// rename), and the next connection gets them. No goroutine, no timer.
// Safe for concurrent use.
type Reloader struct {
	cfg     Server
	onError func(error)
	protos  []string

	mu      sync.Mutex
	certPEM []byte
	keyPEM  []byte
	caPEM   []byte
	current *tls.Config // nil until the first load
}

// NewReloader loads the files once and returns a Reloader; errors (wrapping
// ErrConfig, naming the file) mean the listener must not start. onError
// receives later reload failures (nil: ignored); it is called from the
// handshake's goroutine and must not block. nextProtos are the ALPN
// protocols offered ("h2" for gRPC; none for plain HTTP/1.1).
func NewReloader(cfg Server, onError func(error), nextProtos ...string) (*Reloader, error) {
	switch {
	case cfg.CertFile == "" || cfg.KeyFile == "":
		return nil, fmt.Errorf("%w: a listener needs both a certificate file and a key file (got certificate %q, key %q)", ErrConfig, cfg.CertFile, cfg.KeyFile)
	case cfg.RequireClientCert && cfg.ClientCAFile == "":
		return nil, fmt.Errorf("%w: requiring client certificates needs a client CA file", ErrConfig)
	}
	if onError == nil {
		onError = func(error) {}
	}
	r := &Reloader{cfg: cfg, onError: onError, protos: slices.Clone(nextProtos)}
	if _, err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

// TLSConfig returns the configuration to serve with (tls.NewListener,
// http.Server.TLSConfig, grpc credentials.NewTLS): each handshake gets the
// files' current contents through GetConfigForClient.
func (r *Reloader) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: slices.Clone(r.protos),
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cfg, err := r.load()
			if err != nil {
				r.onError(err)
			}
			return cfg, nil
		},
	}
}

// Reload re-reads the files now, as the next handshake would, and returns
// the error that kept the last good set in use, if any.
func (r *Reloader) Reload() error {
	_, err := r.load()
	return err
}

// load returns the configuration for the files' current contents, or the
// last good one and the error that kept it.
func (r *Reloader) load() (*tls.Config, error) {
	certPEM, err1 := os.ReadFile(r.cfg.CertFile)
	keyPEM, err2 := os.ReadFile(r.cfg.KeyFile)
	var caPEM []byte
	var err3 error
	if r.cfg.ClientCAFile != "" {
		caPEM, err3 = os.ReadFile(r.cfg.ClientCAFile)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err1 != nil:
		return r.current, fmt.Errorf("%w: certificate: %v", ErrConfig, err1)
	case err2 != nil:
		return r.current, fmt.Errorf("%w: key: %v", ErrConfig, err2)
	case err3 != nil:
		return r.current, fmt.Errorf("%w: client CA bundle: %v", ErrConfig, err3)
	}
	if r.current != nil && bytes.Equal(certPEM, r.certPEM) && bytes.Equal(keyPEM, r.keyPEM) && bytes.Equal(caPEM, r.caPEM) {
		return r.current, nil
	}
	cert, err := parseKeyPair(r.cfg.CertFile, r.cfg.KeyFile, certPEM, keyPEM)
	if err != nil {
		return r.current, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, NextProtos: slices.Clone(r.protos)}
	if r.cfg.ClientCAFile != "" {
		var pool *x509.CertPool
		if pool, err = parseCertPool(r.cfg.ClientCAFile, caPEM); err != nil {
			return r.current, err
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.VerifyClientCertIfGiven
		if r.cfg.RequireClientCert {
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	r.certPEM, r.keyPEM, r.caPEM, r.current = certPEM, keyPEM, caPEM, cfg
	return cfg, nil
}

// HasVerifiedClientCert reports whether the connection's peer presented a
// client certificate that verified against the listener's client CA
// bundle. A handler of a listener with ClientCAFile uses it to require a
// certificate for some paths only.
func HasVerifiedClientCert(cs *tls.ConnectionState) bool {
	return cs != nil && len(cs.VerifiedChains) > 0
}
