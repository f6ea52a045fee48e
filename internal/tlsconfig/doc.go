// Package tlsconfig builds the TLS configurations and reads the credentials
// that every Quotient binary uses for its connections: client TLS to Redis
// and Kafka (a CA bundle, a server name, an optional client certificate),
// server TLS for listeners (the coordinator's HTTP server, the gRPC and
// metrics listeners of `quotient rls`) from certificate and key files that
// are re-read when they change, and secrets (passwords, tokens) from a file or
// an environment variable, never from a command-line value that `ps` shows.
// It also names the setting to blame for a failed handshake or a refused
// authentication (Diagnose), so a misconfiguration is one clear line at
// start-up.
//
// What it does not do: no flags (cmd/ reads them and wraps these errors
// with the flag's name), no goroutines, no timers, no logging of its own
// (the Reloader reports a failed reload through a callback), no network
// I/O.
//
// Invariants: every configuration built here has MinVersion TLS 1.2 and
// verifies the peer (there is no "skip verify" option). A Reloader always
// serves the last certificate that loaded completely: a half-written or
// mismatched certificate and key pair never replaces a good one.
package tlsconfig
