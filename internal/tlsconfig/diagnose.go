package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"strings"
	"syscall"
)

// Cause is what a failed TLS connection says about the configuration.
type Cause int

// The causes Diagnose tells apart.
const (
	// CauseNone: the error says nothing about TLS settings (a refused
	// connection, a timeout, an application error).
	CauseNone Cause = iota
	// CauseUnknownAuthority: the server's certificate does not chain to
	// the configured CA bundle (the wrong CA file, or none where the
	// server's CA is private), or is otherwise invalid (expired).
	CauseUnknownAuthority
	// CauseServerName: the certificate is valid but not for the name
	// verified (the server name setting, or the host dialled).
	CauseServerName
	// CauseNotTLS: the server answered, but not with TLS: it serves
	// plaintext on that port.
	CauseNotTLS
	// CauseClientCert: the server rejected the handshake over the client
	// certificate (none sent where one is required, or one it does not
	// trust).
	CauseClientCert
	// CauseClosed: the server closed the connection without a TLS alert,
	// which is what a TLS-only server does to a plaintext client.
	CauseClosed
)

// String is a short explanation, for error messages.
func (c Cause) String() string {
	switch c {
	case CauseUnknownAuthority:
		return "the server's certificate is not trusted by the CA bundle"
	case CauseServerName:
		return "the server's certificate is not valid for the server name"
	case CauseNotTLS:
		return "the server does not speak TLS on that port"
	case CauseClientCert:
		return "the server rejected the client certificate (or its absence)"
	case CauseClosed:
		return "the server closed the connection (does it require TLS?)"
	}
	return "not a TLS configuration problem"
}

// Diagnose reads err (from a dial, a handshake or the first request on a
// new connection, possibly wrapped) for what it says about the TLS
// settings. It only inspects error values and their text; no I/O.
func Diagnose(err error) Cause {
	if err == nil {
		return CauseNone
	}
	var hostErr x509.HostnameError
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	var header tls.RecordHeaderError
	var alert tls.AlertError
	switch {
	case errors.As(err, &hostErr):
		return CauseServerName
	case errors.As(err, &unknown), errors.As(err, &invalid):
		return CauseUnknownAuthority
	case errors.As(err, &verify):
		if errors.As(verify.Err, &hostErr) {
			return CauseServerName
		}
		return CauseUnknownAuthority
	case errors.As(err, &header):
		return CauseNotTLS
	case errors.As(err, &alert):
		switch tls.AlertError(alert) {
		case 42, 43, 44, 45, 46, 48, 116: // bad/unsupported/revoked/expired/unknown certificate, unknown CA, certificate required
			return CauseClientCert
		}
	}
	// Alerts from the peer arrive as text on some paths ("remote error:
	// tls: ..."), and clients wrap without %w.
	msg := err.Error()
	switch {
	case strings.Contains(msg, "remote error: tls: certificate required"),
		strings.Contains(msg, "remote error: tls: bad certificate"),
		strings.Contains(msg, "remote error: tls: unknown certificate authority"):
		return CauseClientCert
	case strings.Contains(msg, "certificate signed by unknown authority"):
		return CauseUnknownAuthority
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		return CauseNotTLS
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		return CauseClosed
	}
	return CauseNone
}
